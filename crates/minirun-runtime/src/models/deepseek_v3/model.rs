//! The DeepSeek-V3 architecture (DeepSeek V3/R1; Kimi K2 shares it but names itself `kimi_k2`
//! and ships no `tokenizer.json`, so it is refused for now): multi-head latent attention with a cache
//! of the compressed latent, dense then mixture-of-experts layers with sigmoid, group-limited
//! routing and shared experts. A prompt runs in chunks of positions, each token after it alone;
//! every position uses the absorbed attention (queries projected into the latent space, values
//! read out of it), which is mlx-lm's decode path, and gets the same bits in a chunk as alone.
//!
//! Both stored layouts run: MLX (`embed_q` / `unembed_out`, stacked `switch_mlp` experts) and
//! Hugging Face / DeepSeek (`kv_b_proj` whole, per-expert tensors).

use crate::blocks::latent_attention::{LatentCache, LatentDims, LatentProjections, attend_latent};
use crate::blocks::mlp::{Activation, Mlp};
use crate::blocks::moe::{RoutedExperts, Routing, run_routed, weighted_sum};
use crate::blocks::norm::rms_norm;
use crate::blocks::pre_norm::{Ends, FeedForward, PreNormLayer, pre_norm_layered};
use crate::blocks::products::{add_rows, apply_batch};
use crate::blocks::rope::{Rope, attention_scale};
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{Rows, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::deepseek_v3::config::DeepSeekV3Config;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::STACKED;
use minirun_stream::matrix::Matrix;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

pub struct Attention<'a> {
    q_a: Option<(Matrix<'a>, Vec<f32>)>,
    q_b: Matrix<'a>,
    kv_a: Matrix<'a>,
    kv_a_norm: Vec<f32>,
    latent: LatentProjections<'a>,
    o: Matrix<'a>,
}

pub struct Moe<'a> {
    router: Matrix<'a>,
    correction_bias: Vec<f32>,
    experts: RoutedExperts<'a>,
    shared: Option<Mlp<Matrix<'a>>>,
}

/// One layer's weights.
pub type Layer<'a> = PreNormLayer<'a, Attention<'a>, Moe<'a>>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct DeepSeekV3Model<'a> {
    config: DeepSeekV3Config,
    ends: Ends<'a>,
    rope: Rope,
    scale: f32,
}

/// DeepSeek-V3 as a run holds it (see [`LayeredModel`]).
pub type DeepSeekV3<'a> = LayeredModel<'a, DeepSeekV3Model<'a>>;

/// The latent KV cache: per layer, per position, the normalised latent and the rotated key.
pub type Cache = SequenceCache<LatentCache>;

fn latent_dims(c: &DeepSeekV3Config) -> LatentDims {
    LatentDims {
        heads: c.num_attention_heads,
        nope: c.qk_nope_head_dim,
        rope: c.qk_rope_head_dim,
        v: c.v_head_dim,
        lora: c.kv_lora_rank,
    }
}

fn attention<'w>(w: &Weights<'w>, c: &DeepSeekV3Config) -> Result<Attention<'w>, ArtifactError> {
    let (hidden, heads) = (c.hidden_size, c.num_attention_heads);
    let (q_a, q_b) = match c.q_lora_rank {
        Some(rank) => (
            Some((
                w.matrix("q_a_proj", rank, hidden)?,
                w.vector("q_a_layernorm.weight", rank)?,
            )),
            w.matrix("q_b_proj", heads * c.q_head_dim(), rank)?,
        ),
        None => (None, w.matrix("q_proj", heads * c.q_head_dim(), hidden)?),
    };
    Ok(Attention {
        q_a,
        q_b,
        kv_a: w.matrix(
            "kv_a_proj_with_mqa",
            c.kv_lora_rank + c.qk_rope_head_dim,
            hidden,
        )?,
        kv_a_norm: w.vector("kv_a_layernorm.weight", c.kv_lora_rank)?,
        latent: match w.has("kv_b_proj.weight") {
            true => LatentProjections::whole(w, latent_dims(c))?,
            false => LatentProjections::split(w, latent_dims(c))?,
        },
        o: w.matrix("o_proj", hidden, heads * c.v_head_dim)?,
    })
}

fn layer<'w>(w: &Weights<'w>, c: &DeepSeekV3Config, i: usize) -> Result<Layer<'w>, ArtifactError> {
    let w = w.at(&format!("model.layers.{i}"));
    let (hidden, inner) = (c.hidden_size, c.moe_intermediate_size);
    let self_attn = attention(&w.at("self_attn"), c)?;
    let mlp_w = w.at("mlp");
    let ffn = match c.is_moe(i) {
        true => FeedForward::Routed(Moe {
            router: mlp_w.matrix("gate", c.n_routed_experts, hidden)?,
            correction_bias: mlp_w.vector("gate.e_score_correction_bias", c.n_routed_experts)?,
            experts: RoutedExperts::new(
                &w,
                "mlp",
                STACKED,
                (hidden, inner, c.n_routed_experts),
                Activation::Silu,
            )?,
            shared: match c.n_shared_experts {
                0 => None,
                n => Some(Mlp::new(
                    &mlp_w.at("shared_experts"),
                    STACKED,
                    (hidden, inner * n),
                    Activation::Silu,
                )?),
            },
        }),
        false => FeedForward::Dense(Mlp::new(
            &mlp_w,
            STACKED,
            (hidden, c.intermediate_size),
            Activation::Silu,
        )?),
    };
    PreNormLayer::new(&w, hidden, self_attn, ffn)
}

impl Moe<'_> {
    fn route(&self, logits: &[f32], c: &DeepSeekV3Config) -> Vec<(usize, f32)> {
        Routing {
            correction_bias: &self.correction_bias,
            experts_per_token: c.num_experts_per_tok,
            groups: c.n_group,
            groups_chosen: c.topk_group,
            renormalize: c.norm_topk_prob,
            renormalize_eps: 0.0,
            scaling: c.routed_scaling_factor,
        }
        .route(logits)
    }

    /// Every row of the batch through its routed experts and the shared expert. An expert is
    /// run once for all the rows that chose it; a row's outputs are then added in its router's
    /// order and the shared expert's last, whether the expert was held or read just now and
    /// however many rows the batch has: the same products, the same sum.
    fn forward(
        &self,
        xs: &[Vec<f32>],
        c: &DeepSeekV3Config,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let routes = self.routes(xs, c, stats)?;
        let shared = |stats: &mut StepStats| -> Result<Option<Vec<Vec<f32>>>, ModelError> {
            self.shared
                .as_ref()
                .map(|s| s.forward(xs, stats))
                .transpose()
        };
        let (outputs, shared) = run_routed(&self.experts, &routes, xs, shared, stats)?;
        let mut ys = weighted_sum(&routes, &outputs, c.hidden_size);
        if let Some(shared) = shared {
            add_rows(&mut ys, &shared);
        }
        Ok(ys)
    }

    /// Each row's experts and weights, in the router's order.
    fn routes(
        &self,
        xs: &[Vec<f32>],
        c: &DeepSeekV3Config,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<(usize, f32)>>, ModelError> {
        Ok(apply_batch(&self.router, xs, stats)?
            .iter()
            .map(|logits| self.route(logits, c))
            .collect())
    }
}

impl Shape for DeepSeekV3Config {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_tok
    }

    /// Per layer and position, the latent and the rotated key, in f32.
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        ((self.kv_lora_rank + self.qk_rope_head_dim) as u64)
            .saturating_mul(4 * self.num_hidden_layers as u64)
            .saturating_mul(context_tokens as u64)
    }
}

impl ModelConfig for DeepSeekV3Config {
    limits_from_fields!();

    fn describe(&self) -> String {
        format!(
            "deepseek_v3: {} layers, {} routed experts ({} per token), vocab {}",
            self.num_hidden_layers,
            self.n_routed_experts,
            self.num_experts_per_tok,
            self.vocab_size
        )
    }
}

impl<'a> Layered<'a> for DeepSeekV3Model<'a> {
    type Config = DeepSeekV3Config;
    type Layer<'w> = Layer<'w>;
    type LayerCache = LatentCache;
    type Hidden = Vec<Vec<f32>>;

    fn new(config: DeepSeekV3Config, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let c = &config;
        Ok(DeepSeekV3Model {
            ends: Ends::new(w, (c.vocab_size, c.hidden_size), false)?,
            rope: Rope::new(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling.as_ref()),
            scale: attention_scale(c.q_head_dim(), c.rope_scaling.as_ref()),
            config,
        })
    }

    pre_norm_layered!(DeepSeekV3Config, LatentCache);
}

impl DeepSeekV3Model<'_> {
    /// Attention for a batch of rows: every row's latent and rotated key go into its cache
    /// first, then each row attends to its cache up to its own position.
    fn attend(
        &self,
        a: &Attention,
        xs: &[Vec<f32>],
        layer: usize,
        rows: &Rows,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let qs = match &a.q_a {
            Some((q_a, norm)) => {
                let latent_q: Vec<Vec<f32>> = apply_batch(q_a, xs, stats)?
                    .iter()
                    .map(|q| rms_norm(q, norm, 1e-6))
                    .collect();
                apply_batch(&a.q_b, &latent_q, stats)?
            }
            None => apply_batch(&a.q_b, xs, stats)?,
        };
        let lora = c.kv_lora_rank;
        for (t, kv) in apply_batch(&a.kv_a, xs, stats)?.iter().enumerate() {
            let latent = rms_norm(&kv[..lora], &a.kv_a_norm, 1e-6);
            let mut key = kv[lora..].to_vec();
            self.rope.apply(&mut key, rows.position[t]);
            caches[rows.cache[t]].layers[layer].push(&latent, &key);
        }
        let q_latents = self.queries_in_latent_space(a, &qs, stats)?;
        let mixed = self.mix_all_heads(&qs, &q_latents, layer, rows, caches);
        let outs = self.heads_out(a, &mixed, stats)?;
        apply_batch(&a.o, &outs, stats)
    }

    fn queries_in_latent_space(
        &self,
        a: &Attention,
        qs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<Vec<f32>>>, ModelError> {
        a.latent.queries(qs, self.latent_dims(), stats)
    }

    fn latent_dims(&self) -> LatentDims {
        latent_dims(&self.config)
    }

    /// Every row's heads ([`Self::mix_head`]), each (row, head) on whichever worker takes it:
    /// they are independent, so each has the bits it has computed alone.
    fn mix_all_heads(
        &self,
        qs: &[Vec<f32>],
        q_latents: &[Vec<Vec<f32>>],
        layer: usize,
        rows: &Rows,
        caches: &[&mut Cache],
    ) -> Vec<Vec<Vec<f32>>> {
        use rayon::prelude::*;
        let c = &self.config;
        let width = c.qk_nope_head_dim + c.qk_rope_head_dim;
        qs.par_iter()
            .zip(q_latents)
            .enumerate()
            .map(|(t, (q, q_latent))| {
                let cache = &*caches[rows.cache[t]];
                q.par_chunks_exact(width)
                    .zip(q_latent)
                    .map(|(q, q_latent)| self.mix_head(q, q_latent, layer, rows.position[t], cache))
                    .collect()
            })
            .collect()
    }

    /// One head of one position over the cache's positions up to and including `position`:
    /// the cached latents mixed by the softmax of the scores.
    fn mix_head(
        &self,
        q: &[f32],
        q_latent: &[f32],
        layer: usize,
        position: usize,
        cache: &Cache,
    ) -> Vec<f32> {
        let nope = self.config.qk_nope_head_dim;
        let (latents, keys) = (&cache.layers[layer].latent, &cache.layers[layer].key);
        let mut q_rope = q[nope..].to_vec();
        self.rope.apply(&mut q_rope, position);
        attend_latent(q_latent, &q_rope, latents, keys, position + 1, self.scale)
    }

    fn heads_out(
        &self,
        a: &Attention,
        mixed: &[Vec<Vec<f32>>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        a.latent.heads_out(mixed, self.latent_dims(), stats)
    }
}
