//! The gpt-oss architecture (gpt-oss-20b, gpt-oss-120b): grouped-query attention with biases,
//! RoPE over each head's two halves with YaRN, one learned sink logit per query head in the
//! softmax, and layers that alternate between a sliding window and full attention; then a
//! router with a bias choosing the top k experts, weighted by the softmax over those k, each
//! expert a biased SwiGLU with gpt-oss's clamp. Every layer routes; there are no shared experts.
//!
//! Both stored layouts run: OpenAI's (MXFP4 `gate_up_proj` with gate and up rows interleaved,
//! `down_proj`, and their biases `gate_up_proj_bias` and `down_proj_bias`) and MLX's (stacked
//! `experts.{gate,up,down}_proj` with a `bias` each).

use std::sync::Arc;

use crate::blocks::grouped_attention::{GroupedDims, KvCache, Span, attend_head_over};
use crate::blocks::mlp::{Activation, MlpBiases, deinterleave};
use crate::blocks::moe::{RoutedExperts, routed_sum, top_k_softmax};
use crate::blocks::pre_norm::{Ends, FeedForward, PreNormLayer, pre_norm_layered};
use crate::blocks::products::apply_batch;
use crate::blocks::rope::Rope;
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{Rows, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::gpt_oss::config::{GptOssConfig, LayerAttention, SWIGLU_ALPHA};
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::{ExpertNames, GATE_UP_DOWN, STACKED};
use minirun_stream::matrix::Matrix;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

/// A projection and its bias.
pub struct Biased<'a> {
    matrix: Matrix<'a>,
    bias: Vec<f32>,
}

impl<'w> Biased<'w> {
    fn new(
        w: &Weights<'w>,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Biased<'w>, ArtifactError> {
        Ok(Biased {
            matrix: w.matrix(module, rows, cols)?,
            bias: w.vector(&format!("{module}.bias"), rows)?,
        })
    }

    /// `W x + b` for every row.
    fn apply(&self, xs: &[Vec<f32>], stats: &mut StepStats) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut ys = apply_batch(&self.matrix, xs, stats)?;
        for y in &mut ys {
            y.iter_mut().zip(&self.bias).for_each(|(y, b)| *y += b);
        }
        Ok(ys)
    }
}

pub struct Attention<'a> {
    q: Biased<'a>,
    k: Biased<'a>,
    v: Biased<'a>,
    o: Biased<'a>,
    /// One logit per query head that the softmax counts without mixing a value.
    sinks: Vec<f32>,
}

pub struct SparseMoe<'a> {
    router: Biased<'a>,
    experts: RoutedExperts<'a>,
}

/// One layer's weights.
pub type Layer<'a> = PreNormLayer<'a, Attention<'a>, SparseMoe<'a>>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct GptOssModel<'a> {
    config: GptOssConfig,
    ends: Ends<'a>,
    rope: Rope,
    scale: f32,
}

/// gpt-oss as a run holds it (see [`LayeredModel`]).
pub type GptOss<'a> = LayeredModel<'a, GptOssModel<'a>>;

/// Per layer, per position, every key/value head's key and value. A sliding layer keeps every
/// position too (its window is applied when attending), so a sequence cut back to any length
/// still has what its next step needs.
pub type Cache = SequenceCache<KvCache>;

fn dims(c: &GptOssConfig) -> GroupedDims {
    GroupedDims {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    }
}

fn attention<'w>(w: &Weights<'w>, c: &GptOssConfig) -> Result<Attention<'w>, ArtifactError> {
    let (hidden, dim) = (c.hidden_size, c.head_dim);
    let (q_rows, kv_rows) = (c.num_attention_heads * dim, c.num_key_value_heads * dim);
    Ok(Attention {
        q: Biased::new(w, "q_proj", q_rows, hidden)?,
        k: Biased::new(w, "k_proj", kv_rows, hidden)?,
        v: Biased::new(w, "v_proj", kv_rows, hidden)?,
        o: Biased::new(w, "o_proj", hidden, q_rows)?,
        sinks: w.vector("sinks", c.num_attention_heads)?,
    })
}

/// How this artifact stores the experts: OpenAI's fused `gate_up_proj`, or MLX's three stacks.
fn expert_names(mlp: &Weights) -> ExpertNames {
    match mlp.has_matrix("experts.gate_up_proj") {
        true => GATE_UP_DOWN,
        false => STACKED,
    }
}

/// Every expert's biases, in the layout `names` says: OpenAI's `gate_up_proj_bias` (gate and up
/// interleaved like the rows) and `down_proj_bias`, or MLX's `{gate,up,down}_proj.bias`.
fn expert_biases(
    mlp: &Weights,
    names: ExpertNames,
    c: &GptOssConfig,
) -> Result<Vec<Arc<MlpBiases>>, ArtifactError> {
    let (n, inner, hidden) = (c.num_local_experts, c.intermediate_size, c.hidden_size);
    let per_expert = |name: &str, width: usize| -> Result<Vec<Vec<f32>>, ArtifactError> {
        let all = mlp.vector(name, n * width)?;
        Ok(all.chunks_exact(width).map(<[f32]>::to_vec).collect())
    };
    let (gates, ups): (Vec<_>, Vec<_>) = match names {
        ExpertNames::Interleaved { .. } => per_expert("experts.gate_up_proj_bias", 2 * inner)?
            .iter()
            .map(|row| deinterleave(row))
            .unzip(),
        ExpertNames::Separate(_) => (
            per_expert("experts.gate_proj.bias", inner)?,
            per_expert("experts.up_proj.bias", inner)?,
        ),
    };
    let downs = match names {
        ExpertNames::Interleaved { .. } => per_expert("experts.down_proj_bias", hidden)?,
        ExpertNames::Separate(_) => per_expert("experts.down_proj.bias", hidden)?,
    };
    Ok(gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .map(|((gate, up), down)| Arc::new(MlpBiases { gate, up, down }))
        .collect())
}

fn layer<'w>(w: &Weights<'w>, c: &GptOssConfig, i: usize) -> Result<Layer<'w>, ArtifactError> {
    let w = w.at(&format!("model.layers.{i}"));
    let hidden = c.hidden_size;
    let self_attn = attention(&w.at("self_attn"), c)?;
    let mlp = w.at("mlp");
    let names = expert_names(&mlp);
    let activation = Activation::SwigluOai {
        alpha: SWIGLU_ALPHA,
        limit: c.swiglu_limit,
    };
    let moe = SparseMoe {
        router: Biased::new(&mlp, "router", c.num_local_experts, hidden)?,
        experts: RoutedExperts::new(
            &w,
            "mlp",
            names,
            (hidden, c.intermediate_size, c.num_local_experts),
            activation,
        )?
        .with_biases(expert_biases(&mlp, names, c)?)?,
    };
    PreNormLayer::new(&w, hidden, self_attn, FeedForward::Routed(moe))
}

impl SparseMoe<'_> {
    /// Every row through the experts its router chose; an expert runs once for all the rows
    /// that chose it, and a row's outputs are added in its router's order.
    fn forward(
        &self,
        xs: &[Vec<f32>],
        c: &GptOssConfig,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let routes = self.routes(xs, c, stats)?;
        routed_sum(&self.experts, &routes, xs, c.hidden_size, stats)
    }

    /// Each row's experts and weights, in the router's order.
    fn routes(
        &self,
        xs: &[Vec<f32>],
        c: &GptOssConfig,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<(usize, f32)>>, ModelError> {
        Ok(self
            .router
            .apply(xs, stats)?
            .iter()
            .map(|logits| top_k_softmax(logits, c.num_experts_per_tok))
            .collect())
    }
}

impl Shape for GptOssConfig {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_tok
    }

    /// Per layer and position, every key/value head's key and value, in f32 (sliding layers
    /// keep every position too).
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        ((2 * self.num_key_value_heads * self.head_dim) as u64)
            .saturating_mul(4 * self.num_hidden_layers as u64)
            .saturating_mul(context_tokens as u64)
    }
}

impl ModelConfig for GptOssConfig {
    limits_from_fields!();

    fn describe(&self) -> String {
        let sliding = self
            .layer_types
            .iter()
            .filter(|&&t| t == LayerAttention::Sliding)
            .count();
        format!(
            "gpt_oss: {} layers ({sliding} with a {}-position window), {} experts ({} per token), {} query and {} key/value heads of {}, vocab {}",
            self.num_hidden_layers,
            self.sliding_window,
            self.num_local_experts,
            self.num_experts_per_tok,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.vocab_size
        )
    }
}

impl<'a> Layered<'a> for GptOssModel<'a> {
    type Config = GptOssConfig;
    type Layer<'w> = Layer<'w>;
    type LayerCache = KvCache;
    type Hidden = Vec<Vec<f32>>;

    fn new(config: GptOssConfig, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let c = &config;
        Ok(GptOssModel {
            ends: Ends::new(w, (c.vocab_size, c.hidden_size), false)?,
            rope: Rope::halves(c.head_dim, c.rope_theta, c.rope_scaling.as_ref()),
            scale: (c.head_dim as f64).powf(-0.5) as f32,
            config,
        })
    }

    pre_norm_layered!(GptOssConfig, KvCache);
}

impl GptOssModel<'_> {
    /// Each head's slice of `x` rotated for `position`.
    fn heads_rotated(&self, mut x: Vec<f32>, position: usize) -> Vec<f32> {
        for head in x.chunks_exact_mut(self.config.head_dim) {
            self.rope.apply(head, position);
        }
        x
    }

    /// Attention for a batch of rows: every row's keys and values go into its cache first, then
    /// each row's heads attend to the positions its layer lets it see.
    fn attend(
        &self,
        a: &Attention,
        xs: &[Vec<f32>],
        layer: usize,
        rows: &Rows,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let qs = a.q.apply(xs, stats)?;
        let ks = a.k.apply(xs, stats)?;
        let vs = a.v.apply(xs, stats)?;
        for (t, (k, v)) in ks.into_iter().zip(&vs).enumerate() {
            let k = self.heads_rotated(k, rows.position[t]);
            caches[rows.cache[t]].layers[layer].push(&k, v);
        }
        let mixed = self.mix_all_heads(a, qs, layer, rows, caches);
        a.o.apply(&mixed, stats)
    }

    /// The positions a query at `position` sees in `layer`.
    fn span(&self, layer: usize, position: usize, sink: f32) -> Span {
        let first = match self.config.layer_types[layer] {
            LayerAttention::Sliding => (position + 1).saturating_sub(self.config.sliding_window),
            LayerAttention::Full => 0,
        };
        Span {
            first,
            end: position + 1,
            sink: Some(sink),
        }
    }

    /// Every row's heads, each row on whichever worker takes it: rows are independent, so each
    /// has the bits it has alone.
    fn mix_all_heads(
        &self,
        a: &Attention,
        qs: Vec<Vec<f32>>,
        layer: usize,
        rows: &Rows,
        caches: &[&mut Cache],
    ) -> Vec<Vec<f32>> {
        use rayon::prelude::*;
        let d = dims(&self.config);
        qs.into_par_iter()
            .enumerate()
            .map(|(t, q)| {
                let position = rows.position[t];
                let cache = &caches[rows.cache[t]].layers[layer];
                let q = self.heads_rotated(q, position);
                q.chunks_exact(d.head_dim)
                    .enumerate()
                    .flat_map(|(h, q)| {
                        let span = self.span(layer, position, a.sinks[h]);
                        attend_head_over(q, h, cache, span, d, self.scale)
                    })
                    .collect()
            })
            .collect()
    }
}
