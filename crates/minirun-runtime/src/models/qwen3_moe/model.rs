//! The Qwen3-MoE architecture (Qwen3-30B-A3B, Qwen3-235B-A22B): grouped-query attention with a
//! per-head RMSNorm of queries and keys and RoPE over each head's two halves, then a softmax
//! router choosing the top k of its experts (renormalised when `norm_topk_prob`), or a dense
//! MLP on the layers `mlp_only_layers` and `decoder_sparse_step` leave dense. No shared experts.
//!
//! Both stored layouts run: MLX (stacked `switch_mlp` experts, as mlx-community publishes them)
//! and Hugging Face (per-expert `mlp.experts.E.*`).

use crate::blocks::grouped_attention::{GroupedDims, KvCache};
use crate::blocks::mlp::{Activation, Mlp};
use crate::blocks::moe::{RoutedExperts, routed_sum, softmax_top_k};
use crate::blocks::pre_norm::{Ends, FeedForward, PreNormLayer, pre_norm_layered};
use crate::blocks::products::apply_batch;
use crate::blocks::rope::Rope;
use crate::blocks::rotary_gqa::{RotaryGqa, RotaryGqaShape};
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{Rows, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::qwen3_moe::config::Qwen3MoeConfig;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::STACKED;
use minirun_stream::matrix::Matrix;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

pub struct SparseMoe<'a> {
    router: Matrix<'a>,
    experts: RoutedExperts<'a>,
}

/// One layer's weights.
pub type Layer<'a> = PreNormLayer<'a, RotaryGqa<'a>, SparseMoe<'a>>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct Qwen3MoeModel<'a> {
    config: Qwen3MoeConfig,
    ends: Ends<'a>,
    attention: RotaryGqaShape,
}

/// Qwen3-MoE as a run holds it (see [`LayeredModel`]).
pub type Qwen3Moe<'a> = LayeredModel<'a, Qwen3MoeModel<'a>>;

/// Per layer, per position, every key/value head's key and value.
pub type Cache = SequenceCache<KvCache>;

fn dims(c: &Qwen3MoeConfig) -> GroupedDims {
    GroupedDims {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    }
}

fn layer<'w>(w: &Weights<'w>, c: &Qwen3MoeConfig, i: usize) -> Result<Layer<'w>, ArtifactError> {
    let w = w.at(&format!("model.layers.{i}"));
    let hidden = c.hidden_size;
    let attention = RotaryGqa::new(&w.at("self_attn"), hidden, dims(c), true)?;
    let mlp_w = w.at("mlp");
    let ffn = match c.is_sparse(i) {
        true => FeedForward::Routed(SparseMoe {
            router: mlp_w.matrix("gate", c.num_experts, hidden)?,
            experts: RoutedExperts::new(
                &w,
                "mlp",
                STACKED,
                (hidden, c.moe_intermediate_size, c.num_experts),
                Activation::Silu,
            )?,
        }),
        false => FeedForward::Dense(Mlp::new(
            &mlp_w,
            STACKED,
            (hidden, c.intermediate_size),
            Activation::Silu,
        )?),
    };
    PreNormLayer::new(&w, hidden, attention, ffn)
}

impl SparseMoe<'_> {
    /// Every row through the experts its router chose; an expert runs once for all the rows
    /// that chose it, and a row's outputs are added in its router's order, whether the expert
    /// was held or read just now and however many rows the batch has.
    fn forward(
        &self,
        xs: &[Vec<f32>],
        c: &Qwen3MoeConfig,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let routes = self.routes(xs, c, stats)?;
        routed_sum(&self.experts, &routes, xs, c.hidden_size, stats)
    }

    /// Each row's experts and weights, in the router's order.
    fn routes(
        &self,
        xs: &[Vec<f32>],
        c: &Qwen3MoeConfig,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<(usize, f32)>>, ModelError> {
        Ok(apply_batch(&self.router, xs, stats)?
            .iter()
            .map(|logits| softmax_top_k(logits, c.num_experts_per_tok, c.norm_topk_prob))
            .collect())
    }
}

impl Shape for Qwen3MoeConfig {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_tok
    }

    /// Per layer and position, every key/value head's key and value, in f32.
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        ((2 * self.num_key_value_heads * self.head_dim) as u64)
            .saturating_mul(4 * self.num_hidden_layers as u64)
            .saturating_mul(context_tokens as u64)
    }
}

impl ModelConfig for Qwen3MoeConfig {
    limits_from_fields!();

    fn describe(&self) -> String {
        let sparse = (0..self.num_hidden_layers)
            .filter(|&i| self.is_sparse(i))
            .count();
        format!(
            "qwen3_moe: {} layers ({sparse} sparse), {} experts ({} per token), {} query and {} key/value heads of {}, vocab {}",
            self.num_hidden_layers,
            self.num_experts,
            self.num_experts_per_tok,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size
        )
    }
}

impl<'a> Layered<'a> for Qwen3MoeModel<'a> {
    type Config = Qwen3MoeConfig;
    type Layer<'w> = Layer<'w>;
    type LayerCache = KvCache;
    type Hidden = Vec<Vec<f32>>;

    fn new(config: Qwen3MoeConfig, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let c = &config;
        Ok(Qwen3MoeModel {
            ends: Ends::new(w, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)?,
            attention: RotaryGqaShape::new(
                dims(c),
                Rope::halves(c.head_dim, c.rope_theta, None),
                c.rms_norm_eps,
            ),
            config,
        })
    }

    pre_norm_layered!(Qwen3MoeConfig, KvCache);
}

impl Qwen3MoeModel<'_> {
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
