//! The seam between a run and the architectures: a [`Decoder`] runs tokens through its cache;
//! [`Architecture`] is the config an artifact names, and [`Model`] the model built from it.

use crate::artifact::{Artifact, ArtifactError};
use crate::config::{ConfigError, DeepSeekV3Config};
use crate::deepseek::{self, DeepSeekV3};
use crate::deepseek_v4::{self, DeepSeekV4};
use crate::deepseek_v4_config::DeepSeekV4Config;
use crate::kimi_k3::{self, KimiK3};
use crate::kimi_k3_config::KimiK3Config;
use crate::layers::{ModelError, StepStats};
use crate::plan::{ExpertMap, Plan, Shape, expert_map};

/// A model that turns tokens into next-token logits through a cache of what it has seen.
pub trait Decoder {
    type Cache;

    fn new_cache(&self) -> Self::Cache;

    /// Positions the cache holds.
    fn cached(&self, cache: &Self::Cache) -> usize;

    /// The most positions a cache may hold.
    fn max_positions(&self) -> usize;

    /// Runs `tokens` at the next positions of `cache`, returning the logits of the last: the
    /// one prompt of [`Decoder::prefill_batch`].
    fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>, ModelError> {
        let mut one = [cache];
        let mut last = self.prefill_batch(&[tokens], &mut one, stats)?;
        Ok(last.pop().unwrap_or_default())
    }

    /// Runs `token` at the next position of `cache`, returning the logits.
    fn step(
        &self,
        token: u32,
        cache: &mut Self::Cache,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>, ModelError> {
        self.prefill(&[token], cache, stats)
    }

    /// Runs `tokens[i]` at the next position of `caches[i]`, one token for each of several
    /// sequences, as one batch (each weight read once for all), returning each one's logits:
    /// bit for bit what [`Decoder::step`] gives each alone. On an error no cache is to be used
    /// again.
    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Self::Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// Runs `prompts[i]` at the next positions of `caches[i]`, all their positions as the rows
    /// of shared passes, returning each one's last logits: every position gets the bits
    /// stepping through its prompt one token at a time gives it. On an error no cache is to be
    /// used again.
    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut Self::Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// Bytes of routed experts the expert cache holds now, and the most it held at once;
    /// `None` for a resident run.
    fn expert_memory(&self) -> Option<(u64, u64)>;
}

/// A batch step needs one token per cache, and at least one.
pub(crate) fn check_batch<C>(tokens: &[u32], caches: &[&mut C]) -> Result<(), ModelError> {
    match (tokens.len(), caches.len()) {
        (0, _) => Err(ModelError::EmptyPrompt),
        (t, c) if t != c => Err(ModelError::BatchShape {
            tokens: t,
            caches: c,
        }),
        _ => Ok(()),
    }
}

/// The architecture an artifact's `config.json` names, read fail-closed.
#[derive(Debug, Clone)]
pub enum Architecture {
    DeepSeekV3(DeepSeekV3Config),
    DeepSeekV4(DeepSeekV4Config),
    KimiK3(KimiK3Config),
}

impl Architecture {
    /// `model_type` picks the reader: `kimi_k3` is Kimi K3's, `deepseek_v4` DeepSeek V4's;
    /// every other one goes to the DeepSeek-V3 reader, which names what it does not run.
    pub fn parse(config_json: &str) -> Result<Architecture, ConfigError> {
        let model_type = serde_json::from_str::<serde_json::Value>(config_json)
            .ok()
            .and_then(|v| v.get("model_type")?.as_str().map(str::to_string));
        match model_type.as_deref() {
            Some("kimi_k3") => Ok(Architecture::KimiK3(KimiK3Config::parse(config_json)?)),
            Some("deepseek_v4") => Ok(Architecture::DeepSeekV4(DeepSeekV4Config::parse(
                config_json,
            )?)),
            _ => Ok(Architecture::DeepSeekV3(DeepSeekV3Config::parse(
                config_json,
            )?)),
        }
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        match self {
            Architecture::DeepSeekV3(c) => &c.eos_token_ids,
            Architecture::DeepSeekV4(c) => &c.eos_token_ids,
            Architecture::KimiK3(c) => &c.eos_token_ids,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Architecture::DeepSeekV3(c) => c.vocab_size,
            Architecture::DeepSeekV4(c) => c.vocab_size,
            Architecture::KimiK3(c) => c.vocab_size,
        }
    }

    /// The most positions a sequence may have (`max_position_embeddings`).
    pub fn max_positions(&self) -> usize {
        match self {
            Architecture::DeepSeekV3(c) => c.max_position_embeddings,
            Architecture::DeepSeekV4(c) => c.max_position_embeddings,
            Architecture::KimiK3(c) => c.max_position_embeddings,
        }
    }

    /// One line saying what the model is.
    pub fn describe(&self) -> String {
        match self {
            Architecture::DeepSeekV3(c) => format!(
                "deepseek_v3: {} layers, {} routed experts ({} per token), vocab {}",
                c.num_hidden_layers, c.n_routed_experts, c.num_experts_per_tok, c.vocab_size
            ),
            Architecture::DeepSeekV4(c) => {
                let count = |f: fn(&crate::deepseek_v4_config::Attention) -> bool| {
                    c.attention.iter().filter(|a| f(a)).count()
                };
                use crate::deepseek_v4_config::Attention as A;
                format!(
                    "deepseek_v4: {} layers ({} sliding-window, {} compressed sparse, {} heavily compressed; {} hash-routed), {} routed experts ({} per token), {} hyper-connection streams, vocab {}; its {} multi-token-prediction layers are not run",
                    c.num_hidden_layers,
                    count(|a| matches!(a, A::Sliding)),
                    count(|a| matches!(a, A::CompressedSparse { .. })),
                    count(|a| matches!(a, A::HeavilyCompressed { .. })),
                    c.hash_layers,
                    c.n_routed_experts,
                    c.num_experts_per_tok,
                    c.hc_mult,
                    c.vocab_size,
                    c.num_nextn_predict_layers
                )
            }
            Architecture::KimiK3(c) => format!(
                "kimi_k3: {} layers ({} KDA, {} MLA), {} routed experts ({} per token) in a latent width of {}, vocab {}",
                c.num_hidden_layers,
                c.kda.layers.len(),
                c.num_hidden_layers - c.kda.layers.len(),
                c.num_experts,
                c.num_experts_per_token,
                c.routed_expert_hidden_size,
                c.vocab_size
            ),
        }
    }

    fn shape(&self) -> &dyn ShapeOf {
        match self {
            Architecture::DeepSeekV3(c) => c,
            Architecture::DeepSeekV4(c) => c,
            Architecture::KimiK3(c) => c,
        }
    }

    /// Where every routed expert of the model is.
    pub fn expert_map(&self, artifact: &Artifact) -> Result<ExpertMap, ArtifactError> {
        self.shape().experts_of(artifact)
    }

    /// The memory plan (see [`Plan::new`]).
    pub fn plan(
        &self,
        artifact: &Artifact,
        experts: &ExpertMap,
        budget: crate::budget::Budget,
        context_tokens: usize,
    ) -> Result<Plan, crate::plan::PlanError> {
        self.shape()
            .plan_of(artifact, experts, budget, context_tokens)
    }

    /// The model, every weight resident.
    pub fn load<'a>(&self, artifact: &'a Artifact) -> Result<Model<'a>, ModelError> {
        Ok(match self {
            Architecture::DeepSeekV3(c) => {
                Model::DeepSeekV3(DeepSeekV3::load(artifact, c.clone())?)
            }
            Architecture::DeepSeekV4(c) => {
                Model::DeepSeekV4(DeepSeekV4::load(artifact, c.clone())?)
            }
            Architecture::KimiK3(c) => Model::KimiK3(KimiK3::load(artifact, c.clone())?),
        })
    }

    /// The model as `plan` says.
    pub fn load_planned<'a>(
        &self,
        artifact: &'a Artifact,
        plan: &Plan,
        experts: ExpertMap,
    ) -> Result<Model<'a>, ModelError> {
        Ok(match self {
            Architecture::DeepSeekV3(c) => Model::DeepSeekV3(DeepSeekV3::load_planned(
                artifact,
                c.clone(),
                plan,
                experts,
            )?),
            Architecture::DeepSeekV4(c) => Model::DeepSeekV4(DeepSeekV4::load_planned(
                artifact,
                c.clone(),
                plan,
                experts,
            )?),
            Architecture::KimiK3(c) => {
                Model::KimiK3(KimiK3::load_planned(artifact, c.clone(), plan, experts)?)
            }
        })
    }
}

/// [`Shape`]'s generic functions, callable through one reference whichever config it is.
trait ShapeOf {
    fn experts_of(&self, artifact: &Artifact) -> Result<ExpertMap, ArtifactError>;
    fn plan_of(
        &self,
        artifact: &Artifact,
        experts: &ExpertMap,
        budget: crate::budget::Budget,
        context_tokens: usize,
    ) -> Result<Plan, crate::plan::PlanError>;
}

impl<S: Shape> ShapeOf for S {
    fn experts_of(&self, artifact: &Artifact) -> Result<ExpertMap, ArtifactError> {
        expert_map(artifact, self)
    }

    fn plan_of(
        &self,
        artifact: &Artifact,
        experts: &ExpertMap,
        budget: crate::budget::Budget,
        context_tokens: usize,
    ) -> Result<Plan, crate::plan::PlanError> {
        Plan::new(artifact, self, experts, budget, context_tokens)
    }
}

/// A model of an architecture this build runs.
pub enum Model<'a> {
    DeepSeekV3(DeepSeekV3<'a>),
    DeepSeekV4(DeepSeekV4<'a>),
    KimiK3(KimiK3<'a>),
}

/// A [`Model`]'s cache.
pub enum ModelCache {
    DeepSeekV3(deepseek::Cache),
    DeepSeekV4(deepseek_v4::Cache),
    KimiK3(kimi_k3::Cache),
}

impl Decoder for Model<'_> {
    type Cache = ModelCache;

    fn new_cache(&self) -> ModelCache {
        match self {
            Model::DeepSeekV3(m) => ModelCache::DeepSeekV3(m.new_cache()),
            Model::DeepSeekV4(m) => ModelCache::DeepSeekV4(m.new_cache()),
            Model::KimiK3(m) => ModelCache::KimiK3(m.new_cache()),
        }
    }

    fn cached(&self, cache: &ModelCache) -> usize {
        match cache {
            ModelCache::DeepSeekV3(c) => c.len,
            ModelCache::DeepSeekV4(c) => c.len,
            ModelCache::KimiK3(c) => c.len,
        }
    }

    fn max_positions(&self) -> usize {
        match self {
            Model::DeepSeekV3(m) => m.max_positions(),
            Model::DeepSeekV4(m) => m.max_positions(),
            Model::KimiK3(m) => m.max_positions(),
        }
    }

    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        with_own_caches!(self, caches, |model, own| model
            .step_batch(tokens, &mut own, stats))
    }

    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        with_own_caches!(self, caches, |model, own| model
            .prefill_batch(prompts, &mut own, stats))
    }

    fn expert_memory(&self) -> Option<(u64, u64)> {
        match self {
            Model::DeepSeekV3(m) => m.expert_memory(),
            Model::DeepSeekV4(m) => m.expert_memory(),
            Model::KimiK3(m) => m.expert_memory(),
        }
    }
}

/// Runs `$body` with `$model` the architecture's model and `$own` its own caches out of
/// `$caches` (refused with `ForeignCache` if any is another architecture's).
macro_rules! with_own_caches {
    ($self:expr, $caches:expr, |$model:ident, $own:ident| $body:expr) => {
        match $self {
            Model::DeepSeekV3($model) => {
                let mut $own = own_caches($caches, |c| match c {
                    ModelCache::DeepSeekV3(c) => Some(c),
                    _ => None,
                })?;
                $body
            }
            Model::DeepSeekV4($model) => {
                let mut $own = own_caches($caches, |c| match c {
                    ModelCache::DeepSeekV4(c) => Some(c),
                    _ => None,
                })?;
                $body
            }
            Model::KimiK3($model) => {
                let mut $own = own_caches($caches, |c| match c {
                    ModelCache::KimiK3(c) => Some(c),
                    _ => None,
                })?;
                $body
            }
        }
    };
}
use with_own_caches;

/// The architecture's own caches inside `caches`, refused if any is another architecture's.
fn own_caches<'c, C>(
    caches: &'c mut [&mut ModelCache],
    own: impl Fn(&'c mut ModelCache) -> Option<&'c mut C>,
) -> Result<Vec<&'c mut C>, ModelError> {
    caches
        .iter_mut()
        .map(|c| own(c).ok_or(ModelError::ForeignCache))
        .collect()
}
