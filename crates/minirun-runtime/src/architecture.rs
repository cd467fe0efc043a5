//! What an architecture gives the registry: its row ([`ArchitectureRow`]), and how its config
//! type builds its model ([`Family`]), reachable through one reference whichever it is
//! ([`AnyArchitecture`]).

use crate::artifact::{Artifact, ArtifactError, PublishedReader};
use crate::config::{ConfigError, ModelConfig};
use crate::layered_model::{Layered, LayeredModel};
use crate::model::Model;
use crate::model_weights::ModelWeights;
use crate::plan::{Plan, Shape};
use crate::step::ModelError;

/// A chat template an architecture brings where the tokenizer config has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultChat {
    /// The tokenizer config's own template (or none).
    FromTokenizer,
    /// DeepSeek V4's no-thinking template (its checkpoints ship `encoding_dsv4.py`, not a
    /// Jinja template).
    DeepSeekV4,
    /// gpt-oss's harmony format, rendered by minirun; chats show the final channel only.
    Harmony,
}

/// One architecture this build runs.
pub struct ArchitectureRow {
    pub model_type: &'static str,
    /// What it runs, in a few words (the refusal of an unknown `model_type` lists them).
    pub summary: &'static str,
    pub parse: fn(&str) -> Result<Box<dyn AnyArchitecture>, ConfigError>,
    pub chat: DefaultChat,
    /// The reader of the layout its publisher released, where minirun reads one.
    pub published: Option<&'static PublishedReader>,
}

/// The config of an architecture with a model: how its type, parsed from `config.json`, builds
/// that model.
pub trait Family: ModelConfig + Shape + Clone + Send + Sync + 'static {
    type Model<'a>: Layered<'a, Config = Self>;
}

/// [`Family`]'s work behind one reference, whichever architecture it is.
pub trait AnyArchitecture: Send + Sync {
    fn config(&self) -> &dyn ModelConfig;
    fn shape(&self) -> &dyn Shape;
    fn record(&self, artifact: &Artifact) -> Result<ModelWeights, ArtifactError>;
    fn load<'a>(&self, artifact: &'a Artifact) -> Result<Model<'a>, ModelError>;
    fn load_planned<'a>(
        &self,
        artifact: &'a Artifact,
        plan: &Plan,
        weights: &ModelWeights,
    ) -> Result<Model<'a>, ModelError>;
}

impl<F: Family> AnyArchitecture for F {
    fn config(&self) -> &dyn ModelConfig {
        self
    }

    fn shape(&self) -> &dyn Shape {
        self
    }

    fn record(&self, artifact: &Artifact) -> Result<ModelWeights, ArtifactError> {
        F::Model::record(self, artifact)
    }

    fn load<'a>(&self, artifact: &'a Artifact) -> Result<Model<'a>, ModelError> {
        let model = LayeredModel::<F::Model<'a>>::load(artifact, self.clone())?;
        Ok(Model::new(model))
    }

    fn load_planned<'a>(
        &self,
        artifact: &'a Artifact,
        plan: &Plan,
        weights: &ModelWeights,
    ) -> Result<Model<'a>, ModelError> {
        let model =
            LayeredModel::<F::Model<'a>>::load_planned(artifact, self.clone(), plan, weights)?;
        Ok(Model::new(model))
    }
}

/// Reads config `json` with the reader of the one architecture `parse` returns.
pub(crate) fn parsed<F: Family>(
    parse: fn(&str) -> Result<F, ConfigError>,
    json: &str,
) -> Result<Box<dyn AnyArchitecture>, ConfigError> {
    Ok(Box::new(parse(json)?))
}
