//! The Llama architecture (Llama 3.x; dense Qwen3 with its q/k norms): grouped-query attention
//! with RoPE over each head's two halves (Llama 3.1's frequency rule where the config sets it),
//! then a gated SiLU MLP, every layer dense. Both stored layouts run: MLX (as mlx-community
//! publishes it) and Hugging Face.

use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::STACKED;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

use crate::blocks::grouped_attention::{GroupedDims, KvCache};
use crate::blocks::mlp::{Activation, Mlp};
use crate::blocks::pre_norm::{Ends, FeedForward, PreNormLayer, pre_norm_layered};
use crate::blocks::rope::Rope;
use crate::blocks::rotary_gqa::{RotaryGqa, RotaryGqaShape};
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{Rows, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::llama::config::LlamaConfig;

/// A dense model's routed experts: there are none, so no value of this type exists and every
/// layer's feed-forward is its MLP.
pub enum NoExperts {}

/// One layer's weights.
pub type Layer<'a> = PreNormLayer<'a, RotaryGqa<'a>, NoExperts>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct LlamaModel<'a> {
    config: LlamaConfig,
    ends: Ends<'a>,
    attention: RotaryGqaShape,
}

/// A Llama model as a run holds it (see [`LayeredModel`]).
pub type Llama<'a> = LayeredModel<'a, LlamaModel<'a>>;

/// Per layer, per position, every key/value head's key and value.
pub type Cache = SequenceCache<KvCache>;

fn dims(c: &LlamaConfig) -> GroupedDims {
    GroupedDims {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    }
}

/// Plain RoPE over each head's halves, or with Llama 3.1's frequencies where configured.
fn rope(c: &LlamaConfig) -> Rope {
    match &c.rope_scaling {
        Some(rule) => Rope::llama3(c.head_dim, c.rope_theta, rule),
        None => Rope::halves(c.head_dim, c.rope_theta, None),
    }
}

fn layer<'w>(w: &Weights<'w>, c: &LlamaConfig, i: usize) -> Result<Layer<'w>, ArtifactError> {
    let w = w.at(&format!("model.layers.{i}"));
    let hidden = c.hidden_size;
    let attention = RotaryGqa::new(&w.at("self_attn"), hidden, dims(c), c.qk_norm)?;
    let mlp = Mlp::new(
        &w.at("mlp"),
        STACKED,
        (hidden, c.intermediate_size),
        Activation::Silu,
    )?;
    PreNormLayer::new(&w, hidden, attention, FeedForward::Dense(mlp))
}

impl NoExperts {
    fn forward(
        &self,
        _xs: &[Vec<f32>],
        _c: &LlamaConfig,
        _stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        match *self {}
    }

    fn routes(
        &self,
        _xs: &[Vec<f32>],
        _c: &LlamaConfig,
        _stats: &mut StepStats,
    ) -> Result<Vec<Vec<(usize, f32)>>, ModelError> {
        match *self {}
    }
}

impl Shape for LlamaConfig {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        0
    }

    /// Per layer and position, every key/value head's key and value, in f32.
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        ((2 * self.num_key_value_heads * self.head_dim) as u64)
            .saturating_mul(4 * self.num_hidden_layers as u64)
            .saturating_mul(context_tokens as u64)
    }
}

impl ModelConfig for LlamaConfig {
    limits_from_fields!();

    fn describe(&self) -> String {
        let rope = match &self.rope_scaling {
            Some(r) => format!(
                ", RoPE theta {} with Llama 3.1's x{} rule",
                self.rope_theta, r.factor
            ),
            None => format!(", RoPE theta {}", self.rope_theta),
        };
        format!(
            "{}: {} dense layers, {} query and {} key/value heads of {}{rope}, vocab {}",
            self.model_type,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size
        )
    }
}

impl<'a> Layered<'a> for LlamaModel<'a> {
    type Config = LlamaConfig;
    type Layer<'w> = Layer<'w>;
    type LayerCache = KvCache;
    type Hidden = Vec<Vec<f32>>;

    fn new(config: LlamaConfig, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let c = &config;
        Ok(LlamaModel {
            ends: Ends::new(w, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)?,
            attention: RotaryGqaShape::new(dims(c), rope(c), c.rms_norm_eps),
            config,
        })
    }

    pre_norm_layered!(LlamaConfig, KvCache);
}

impl LlamaModel<'_> {
    fn attend(
        &self,
        a: &RotaryGqa,
        xs: &[Vec<f32>],
        layer: usize,
        rows: &Rows,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        a.attend(&self.attention, xs, (layer, rows), caches, stats)
    }
}
