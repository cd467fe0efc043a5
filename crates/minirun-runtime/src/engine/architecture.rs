//! What an architecture gives the registry: its row ([`ArchitectureRow`]), and how its config
//! type builds its model ([`Family`]), reachable through one reference whichever it is
//! ([`AnyArchitecture`]).

use crate::engine::config::{ConfigError, ModelConfig};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::engine::model::Model;
use minirun_stream::artifact::{Artifact, ArtifactError, PublishedReader};
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Plan, Shape};
use minirun_stream::step::ModelError;
use minirun_text::ChatFormat;

/// One architecture this build runs.
pub struct ArchitectureRow {
    pub model_type: &'static str,
    /// What it runs, in a few words (the refusal of an unknown `model_type` lists them).
    pub summary: &'static str,
    pub parse: fn(&str) -> Result<Box<dyn AnyArchitecture>, ConfigError>,
    /// How its chats become prompts where the tokenizer's files do not say it all.
    pub chat: ChatFormat,
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

    fn record<'a>(&self, artifact: &'a Artifact) -> Result<ModelWeights, ArtifactError> {
        F::Model::<'a>::record(self, artifact)
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
