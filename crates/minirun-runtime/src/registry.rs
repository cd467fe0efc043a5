//! The architectures this build runs, one row each ([`ArchitectureRow`]): the `model_type` a
//! `config.json` names, its config reader, its model, and the chat template it uses where the
//! artifact's tokenizer config has none. An unknown `model_type` is refused, naming the known
//! ones.

use crate::engine::architecture::{AnyArchitecture, ArchitectureRow};
use minirun_text::ChatFormat;
use std::path::Path;

use crate::engine::config::ConfigError;
use crate::engine::model::Model;
use crate::models;
use minirun_stream::artifact::{Access, Artifact, ArtifactError, PublishedReader};
use minirun_stream::budget::Budget;
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Layers, Plan, PlanError};
use minirun_stream::step::ModelError;

/// Every architecture this build runs.
pub static ARCHITECTURES: &[&ArchitectureRow] = &[
    &models::deepseek_v3::ROW,
    &models::deepseek_v4::ROW,
    &models::gpt_oss::ROW,
    &models::kimi_k3::ROW,
    &models::llama::ROW,
    &models::qwen3::ROW,
    &models::qwen3_moe::ROW,
];

/// Opens the artifact at `root` in minirun's own layout or in any published layout an
/// architecture of this build reads.
pub fn open_artifact(root: &Path, access: Access) -> Result<Artifact, ArtifactError> {
    let readers: Vec<&PublishedReader> = ARCHITECTURES
        .iter()
        .filter_map(|row| row.published)
        .collect();
    Artifact::open_with(root, access, &readers)
}

/// The architecture an artifact's `config.json` names, read fail-closed.
pub struct Architecture {
    row: &'static ArchitectureRow,
    model: Box<dyn AnyArchitecture>,
}

impl Architecture {
    /// `model_type` picks the row; a config without one, or naming one this build does not run,
    /// is refused with the names it runs.
    pub fn parse(config_json: &str) -> Result<Architecture, ConfigError> {
        let value: serde_json::Value =
            serde_json::from_str(config_json).map_err(|e| ConfigError::NotJson(e.to_string()))?;
        let model_type = match value.get("model_type") {
            Some(serde_json::Value::String(t)) => t.as_str(),
            Some(_) => {
                return Err(ConfigError::Type {
                    key: "model_type".into(),
                    expected: "a string",
                });
            }
            None => return Err(ConfigError::Missing("model_type".into())),
        };
        let row = ARCHITECTURES
            .iter()
            .find(|row| row.model_type == model_type)
            .ok_or_else(|| ConfigError::UnknownModelType {
                model_type: model_type.to_string(),
                known: known_model_types(),
            })?;
        Ok(Architecture {
            row,
            model: (row.parse)(config_json)?,
        })
    }

    pub fn model_type(&self) -> &'static str {
        self.row.model_type
    }

    /// The chat template this architecture brings where the tokenizer config has none.
    pub fn chat_format(&self) -> ChatFormat {
        self.row.chat
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        self.model.config().eos_token_ids()
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config().vocab_size()
    }

    /// The most positions a sequence may have (`max_position_embeddings`).
    pub fn max_positions(&self) -> usize {
        self.model.config().max_positions()
    }

    /// One line saying what the model is.
    pub fn describe(&self) -> String {
        self.model.config().describe()
    }

    /// What every layer of the model asks for, recorded without a payload byte read.
    pub fn weights(&self, artifact: &Artifact) -> Result<ModelWeights, ArtifactError> {
        self.model.record(artifact)
    }

    /// The memory plan (see [`Plan::with_layers`]).
    pub fn plan(
        &self,
        artifact: &Artifact,
        weights: &ModelWeights,
        dial: (Budget, Layers),
        context_tokens: usize,
    ) -> Result<Plan, PlanError> {
        Plan::with_layers(artifact, self.model.shape(), weights, dial, context_tokens)
    }

    /// The model, every weight resident.
    pub fn load<'a>(&self, artifact: &'a Artifact) -> Result<Model<'a>, ModelError> {
        self.model.load(artifact)
    }

    /// The model as `plan` (made from `weights`) says.
    pub fn load_planned<'a>(
        &self,
        artifact: &'a Artifact,
        plan: &Plan,
        weights: &ModelWeights,
    ) -> Result<Model<'a>, ModelError> {
        self.model.load_planned(artifact, plan, weights)
    }
}

/// The `model_type`s this build runs, for messages: `deepseek_v3 (DeepSeek-V3/R1), ...`.
pub fn known_model_types() -> String {
    ARCHITECTURES
        .iter()
        .map(|row| format!("{} ({})", row.model_type, row.summary))
        .collect::<Vec<_>>()
        .join(", ")
}
