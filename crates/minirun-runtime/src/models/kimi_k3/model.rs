//! The Kimi K3 architecture, as mlx-lm 0.32.2's `kimi_k3` computes it: Kimi Delta Attention
//! (KDA: a depthwise causal convolution, then a gated delta rule whose recurrent state lives in
//! the cache) in most layers and NoPE multi-head latent attention with an output gate in the
//! others; attention residuals (each sub-block reads a softmax mix of the earlier blocks'
//! outputs instead of one running sum); a latent mixture of experts (the routed experts work in
//! a narrower width, with a norm before projecting back) beside shared experts; SiTU
//! activations; sigmoid routing with a correction bias.
//!
//! A prompt runs in chunks of positions; each product is taken for the whole chunk at once
//! (`matmul`), and the recurrences (convolution, delta rule, attention over the cache) run
//! position by position, so a chunk gives every position exactly the bits a step gives it.
//! MLA uses the absorbed path (queries projected into the latent space, values read out of
//! it) at every position, mlx-lm's decode path.

use crate::blocks::latent_attention::{LatentCache, LatentDims, LatentProjections, attend_latent};
use crate::blocks::mlp::{Activation, Mlp};
use crate::blocks::moe::{RoutedExperts, Routing, run_routed, weighted_sum};
use crate::blocks::norm::{rms_norm, sigmoid, silu};
use crate::blocks::products::{add_rows, apply_batch};
use crate::blocks::tables::{embed_tokens, head_logits};
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{LayerState, Place, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::kimi_k3::config::KimiK3Config;
use crate::models::kimi_k3::naming::{Naming, name_root};
use minirun_kernels::KernelError;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::{STACKED, W1_W3_W2};
use minirun_stream::matrix::Matrix;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::tables::{Table, TableUse};
use minirun_stream::weights::Weights;

/// mlx-lm's hard-coded epsilons: the l2 norm of KDA's queries and keys adds it to Σx², and
/// MLA's `q_a_layernorm` / `kv_a_layernorm` use it whatever `rms_norm_eps` says.
const L2_NORM_EPS: f32 = 1e-6;
const LATENT_NORM_EPS: f32 = 1e-6;

/// A KDA layer's weights.
struct Kda<'a> {
    /// `q|k|v`: one fused projection (MLX) or three (Hugging Face), rows in that order.
    qkv: Vec<Matrix<'a>>,
    /// `[channels, kernel]`: channel c's taps, oldest input first.
    conv: Vec<f32>,
    f_a: Matrix<'a>,
    f_b: Matrix<'a>,
    b: Matrix<'a>,
    g: Matrix<'a>,
    /// `exp(A_log)`, per head.
    decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
    o: Matrix<'a>,
}

/// A NoPE MLA layer's weights.
struct Mla<'a> {
    q_a: Matrix<'a>,
    q_a_norm: Vec<f32>,
    q_b: Matrix<'a>,
    kv_a: Matrix<'a>,
    kv_a_norm: Vec<f32>,
    latent: LatentProjections<'a>,
    gate: Option<Matrix<'a>>,
    o: Matrix<'a>,
}

enum Mixer<'a> {
    Kda(Box<Kda<'a>>),
    Mla(Box<Mla<'a>>),
}

/// The routed experts in the latent width, between `down` and `up`.
struct LatentMoe<'a> {
    router: Matrix<'a>,
    correction_bias: Vec<f32>,
    down: Matrix<'a>,
    experts: RoutedExperts<'a>,
    norm: Option<Vec<f32>>,
    up: Matrix<'a>,
    shared: Option<Mlp<Matrix<'a>>>,
}

enum FeedForward<'a> {
    Dense(Box<Mlp<Matrix<'a>>>),
    Moe(Box<LatentMoe<'a>>),
}

/// One layer's weights.
pub struct Layer<'a> {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    /// The attention residuals' query vectors (`res_norm.weight ⊙ res_proj.weight`) for the
    /// attention and the MLP sub-blocks.
    attention_mix: Vec<f32>,
    mlp_mix: Vec<f32>,
    /// Whether the layer's input closes a block (pushed onto the block list before attention).
    block_start: bool,
    mixer: Mixer<'a>,
    ffn: FeedForward<'a>,
}

/// One layer's cached state.
#[derive(Clone)]
pub enum LayerCache {
    /// The convolution's last `kernel - 1` inputs (`[kernel - 1, channels]`, oldest first) and
    /// the delta rule's state (`[heads, v, k]`).
    Kda { conv: Vec<f32>, state: Vec<f32> },
    /// Per position, the normalised latent and the (unrotated) positional key.
    Mla(LatentCache),
}

/// The cache: per layer, the KDA recurrent state or the MLA latents.
pub type Cache = SequenceCache<LayerCache>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct KimiK3Model<'a> {
    config: KimiK3Config,
    embed: Table<'a>,
    output_mix: Vec<f32>,
    norm: Vec<f32>,
    lm_head: Table<'a>,
}

/// Kimi K3 as a run holds it (see [`LayeredModel`]).
pub type KimiK3<'a> = LayeredModel<'a, KimiK3Model<'a>>;

/// Per row, the partial sum of the current block, and the closed blocks.
pub type Hidden = (Vec<Vec<f32>>, Vec<Blocks>);

/// A layer's weights, asked for by their full names.
struct Loader<'a, 'm> {
    w: &'m Weights<'a>,
    c: &'m KimiK3Config,
    root: &'static str,
    naming: Naming,
}

impl<'a, 'm> Loader<'a, 'm> {
    /// The loader of `w`, the naming its artifact uses found from its tensors' names.
    fn new(w: &'m Weights<'a>, c: &'m KimiK3Config) -> Result<Self, ArtifactError> {
        let root = name_root(w)?;
        Ok(Loader {
            w,
            c,
            root,
            naming: Naming::of(w, c, root)?,
        })
    }

    fn one(&self, module: &str, rows: usize, cols: usize) -> Result<Matrix<'a>, ArtifactError> {
        self.w.matrix(module, rows, cols)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        self.w.vector(name, len)
    }

    fn situ(&self) -> Activation {
        Activation::Situ {
            beta: self.c.situ_beta,
            linear_beta: self.c.situ_linear_beta,
        }
    }

    fn mlp(
        &self,
        prefix: &str,
        hidden: usize,
        inner: usize,
    ) -> Result<Mlp<Matrix<'a>>, ArtifactError> {
        Mlp::new(&self.w.at(prefix), STACKED, (hidden, inner), self.situ())
    }

    /// `res_norm.weight ⊙ res_proj.weight`, mlx-lm's effective mixing query.
    fn mix_query(&self, prefix: &str, which: &str) -> Result<Vec<f32>, ArtifactError> {
        let hidden = self.c.hidden_size;
        let (norm, proj) = self.naming.residual(prefix, which);
        let norm = self.vector(&norm, hidden)?;
        let proj = self.vector(&proj, hidden)?;
        Ok(norm.iter().zip(&proj).map(|(n, p)| n * p).collect())
    }

    fn kda(&self, prefix: &str) -> Result<Kda<'a>, ArtifactError> {
        let (hidden, k) = (self.c.hidden_size, &self.c.kda);
        let projection = k.num_heads * k.head_dim;
        let kernel = k.short_conv_kernel_size;
        let (qkv, conv) = match self.naming {
            Naming::Mlx => (
                vec![self.one(&format!("{prefix}.qkv_proj"), 3 * projection, hidden)?],
                self.vector(
                    &format!("{prefix}.qkv_conv.conv.weight"),
                    3 * projection * kernel,
                )?,
            ),
            Naming::HuggingFace => {
                let mut qkv = Vec::with_capacity(3);
                let mut conv = Vec::with_capacity(3 * projection * kernel);
                for p in ["q", "k", "v"] {
                    qkv.push(self.one(&format!("{prefix}.{p}_proj"), projection, hidden)?);
                    conv.extend(
                        self.vector(&format!("{prefix}.{p}_conv1d.weight"), projection * kernel)?,
                    );
                }
                (qkv, conv)
            }
        };
        Ok(Kda {
            qkv,
            conv,
            f_a: self.one(&format!("{prefix}.f_a_proj"), k.head_dim, hidden)?,
            f_b: self.one(&format!("{prefix}.f_b_proj"), projection, k.head_dim)?,
            b: self.one(&format!("{prefix}.b_proj"), k.num_heads, hidden)?,
            g: self.one(&format!("{prefix}.g_proj"), projection, hidden)?,
            decay_rate: self.a_log(prefix)?.iter().map(|a| a.exp()).collect(),
            dt_bias: self.vector(&format!("{prefix}.dt_bias"), projection)?,
            o_norm: self.vector(&format!("{prefix}.o_norm.weight"), k.head_dim)?,
            o: self.one(&format!("{prefix}.o_proj"), hidden, projection)?,
        })
    }

    /// `A_log`, one per head. The published K3 stores `head_dim` entries, the heads' and then
    /// zeros; anything else after the heads is refused.
    fn a_log(&self, prefix: &str) -> Result<Vec<f32>, ArtifactError> {
        let k = &self.c.kda;
        let name = format!("{prefix}.A_log");
        if self.naming == Naming::Mlx || k.head_dim <= k.num_heads {
            return self.vector(&name, k.num_heads);
        }
        let padded = match self.vector(&name, k.head_dim) {
            Ok(padded) => padded,
            Err(_) => return self.vector(&name, k.num_heads),
        };
        if padded[k.num_heads..].iter().any(|&v| v != 0.0) {
            return Err(ArtifactError::Tensor {
                name,
                reason: format!(
                    "holds {} entries for {} heads, and the ones after the heads are not zero",
                    k.head_dim, k.num_heads
                ),
            });
        }
        Ok(padded[..k.num_heads].to_vec())
    }

    fn mla(&self, prefix: &str) -> Result<Mla<'a>, ArtifactError> {
        let c = self.c;
        let (hidden, heads) = (c.hidden_size, c.num_attention_heads);
        let q_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
        Ok(Mla {
            q_a: self.one(&format!("{prefix}.q_a_proj"), c.q_lora_rank, hidden)?,
            q_a_norm: self.vector(&format!("{prefix}.q_a_layernorm.weight"), c.q_lora_rank)?,
            q_b: self.one(&format!("{prefix}.q_b_proj"), heads * q_head, c.q_lora_rank)?,
            kv_a: self.one(
                &format!("{prefix}.kv_a_proj_with_mqa"),
                c.kv_lora_rank + c.qk_rope_head_dim,
                hidden,
            )?,
            kv_a_norm: self.vector(&format!("{prefix}.kv_a_layernorm.weight"), c.kv_lora_rank)?,
            latent: self.latent_projections(prefix)?,
            gate: match c.mla_use_output_gate {
                true => {
                    Some(self.one(&format!("{prefix}.g_proj"), heads * c.v_head_dim, hidden)?)
                }
                false => None,
            },
            o: self.one(&format!("{prefix}.o_proj"), hidden, heads * c.v_head_dim)?,
        })
    }

    fn latent_projections(&self, prefix: &str) -> Result<LatentProjections<'a>, ArtifactError> {
        let c = self.c;
        let dims = LatentDims {
            heads: c.num_attention_heads,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v: c.v_head_dim,
            lora: c.kv_lora_rank,
        };
        let w = self.w.at(prefix);
        match self.naming {
            Naming::Mlx => LatentProjections::split(&w, dims),
            Naming::HuggingFace => LatentProjections::whole(&w, dims),
        }
    }

    fn moe(&self, prefix: &str) -> Result<LatentMoe<'a>, ArtifactError> {
        let c = self.c;
        let (hidden, latent) = (c.hidden_size, c.routed_expert_hidden_size);
        let names = match self.naming {
            Naming::Mlx => STACKED,
            Naming::HuggingFace => W1_W3_W2,
        };
        let sizes = (latent, c.moe_intermediate_size, c.num_experts);
        let experts = RoutedExperts::new(self.w, prefix, names, sizes, self.situ())?;
        Ok(LatentMoe {
            router: self.one(&format!("{prefix}.gate"), c.num_experts, hidden)?,
            correction_bias: self.vector(&self.naming.correction_bias(prefix), c.num_experts)?,
            down: self.one(&format!("{prefix}.routed_expert_down_proj"), latent, hidden)?,
            experts,
            norm: match c.latent_moe_use_norm {
                true => Some(self.vector(&format!("{prefix}.routed_expert_norm.weight"), latent)?),
                false => None,
            },
            // The shared experts compute while the routed ones are read, before `up`.
            shared: match c.num_shared_experts {
                0 => None,
                n => Some(self.mlp(
                    &format!("{prefix}.shared_experts"),
                    hidden,
                    c.moe_intermediate_size * n,
                )?),
            },
            up: self.one(&format!("{prefix}.routed_expert_up_proj"), hidden, latent)?,
        })
    }

    fn layer(&self, i: usize) -> Result<Layer<'a>, ArtifactError> {
        let c = self.c;
        let prefix = format!("{}model.layers.{i}", self.root);
        let attn = format!("{prefix}.self_attn");
        let mixer = match c.is_kda(i) {
            true => Mixer::Kda(Box::new(self.kda(&attn)?)),
            false => Mixer::Mla(Box::new(self.mla(&attn)?)),
        };
        let mlp = format!("{prefix}.mlp");
        let ffn = match c.is_moe(i) {
            true => FeedForward::Moe(Box::new(self.moe(&self.naming.moe(&prefix))?)),
            false => FeedForward::Dense(Box::new(self.mlp(
                &mlp,
                c.hidden_size,
                c.intermediate_size,
            )?)),
        };
        Ok(Layer {
            input_norm: self.vector(&format!("{prefix}.input_layernorm.weight"), c.hidden_size)?,
            post_norm: self.vector(
                &format!("{prefix}.post_attention_layernorm.weight"),
                c.hidden_size,
            )?,
            attention_mix: self.mix_query(&prefix, "self_attention_res")?,
            mlp_mix: self.mix_query(&prefix, "mlp_res")?,
            block_start: i.is_multiple_of(c.attn_res_block_size),
            mixer,
            ffn,
        })
    }
}

/// The attention residuals of one position: the closed blocks' outputs, each with the inverse
/// of its root mean square (taken when it was closed).
pub struct Blocks {
    closed: Vec<(Vec<f32>, f32)>,
    eps: f32,
}

impl Blocks {
    fn inv_rms(x: &[f32], eps: f32) -> f32 {
        let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
        1.0 / (mean + eps).sqrt()
    }

    fn close(&mut self, x: &[f32]) {
        let inv = Blocks::inv_rms(x, self.eps);
        self.closed.push((x.to_vec(), inv));
    }

    /// `Σ_k softmax(ℓ)_k · x_k` over the closed blocks and `partial` (last), with
    /// `ℓ_k = (x_k · query) / rms(x_k)`; `partial` itself while no block is closed.
    fn mix(&self, partial: &[f32], query: &[f32]) -> Vec<f32> {
        if self.closed.is_empty() {
            return partial.to_vec();
        }
        let dot = |x: &[f32]| x.iter().zip(query).map(|(a, b)| a * b).sum::<f32>();
        let mut logits: Vec<f32> = self.closed.iter().map(|(x, inv)| dot(x) * inv).collect();
        logits.push(dot(partial) * Blocks::inv_rms(partial, self.eps));
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut out = vec![0f32; partial.len()];
        for ((x, _), e) in self.closed.iter().zip(&exps) {
            let p = e / total;
            out.iter_mut().zip(x).for_each(|(o, v)| *o += p * v);
        }
        let p = exps[exps.len() - 1] / total;
        out.iter_mut().zip(partial).for_each(|(o, v)| *o += p * v);
        out
    }
}

impl Shape for KimiK3Config {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_token
    }

    /// MLA layers keep a latent and a key per position; KDA layers a convolution window and a
    /// recurrent state whatever the context; all f32.
    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        // The config's sizes are each below 2^31 but nothing bounds their products: saturate,
        // and a saturated reserve is refused by the plan like any other too-large one.
        let k = &self.kda;
        let product = |terms: &[usize]| {
            terms
                .iter()
                .fold(1u64, |acc, &t| acc.saturating_mul(t as u64))
        };
        let kda_layers = k.layers.len();
        let mla_layers = self.num_hidden_layers - kda_layers;
        let state = product(&[k.num_heads, k.head_dim, k.head_dim]);
        let window = product(&[k.short_conv_kernel_size - 1, 3, k.num_heads, k.head_dim]);
        let per_position = product(&[self.kv_lora_rank + self.qk_rope_head_dim, mla_layers]);
        product(&[kda_layers])
            .saturating_mul(state.saturating_add(window))
            .saturating_add(per_position.saturating_mul(context_tokens as u64))
            .saturating_mul(4)
    }
}

impl ModelConfig for KimiK3Config {
    limits_from_fields!();

    fn describe(&self) -> String {
        format!(
            "kimi_k3: {} layers ({} KDA, {} MLA), {} routed experts ({} per token) in a latent width of {}, vocab {}",
            self.num_hidden_layers,
            self.kda.layers.len(),
            self.num_hidden_layers - self.kda.layers.len(),
            self.num_experts,
            self.num_experts_per_token,
            self.routed_expert_hidden_size,
            self.vocab_size
        )
    }
}

impl<'a> Layered<'a> for KimiK3Model<'a> {
    type Config = KimiK3Config;
    type Layer<'w> = Layer<'w>;
    type LayerCache = LayerCache;
    type Hidden = Hidden;

    fn new(config: KimiK3Config, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let loader = Loader::new(w, &config)?;
        let (root, c) = (loader.root, &config);
        let shape = (c.vocab_size, c.hidden_size);
        let embed_name = format!("{root}model.embed_tokens");
        let (embed, lm_head) = match c.tie_word_embeddings {
            true => {
                let both = w.table(&embed_name, shape, TableUse::EmbeddingAndHead)?;
                (both.clone(), both)
            }
            false => (
                w.table(&embed_name, shape, TableUse::Embedding)?,
                w.table(&format!("{root}lm_head"), shape, TableUse::Head)?,
            ),
        };
        let output_mix = loader.mix_query(&format!("{root}model"), "output_attn_res")?;
        let norm = w.vector(&format!("{root}model.norm.weight"), c.hidden_size)?;
        Ok(KimiK3Model {
            embed,
            lm_head,
            output_mix,
            norm,
            config,
        })
    }

    fn config(&self) -> &KimiK3Config {
        &self.config
    }

    fn layer<'w>(
        config: &KimiK3Config,
        w: &Weights<'w>,
        i: usize,
    ) -> Result<Layer<'w>, ArtifactError> {
        Loader::new(w, config)?.layer(i)
    }

    fn new_cache(&self) -> Cache {
        let c = &self.config;
        let k = &c.kda;
        let channels = 3 * k.num_heads * k.head_dim;
        let layers = (0..c.num_hidden_layers)
            .map(|i| match c.is_kda(i) {
                true => LayerCache::Kda {
                    conv: vec![0f32; (k.short_conv_kernel_size - 1) * channels],
                    state: vec![0f32; k.num_heads * k.head_dim * k.head_dim],
                },
                false => LayerCache::Mla(LatentCache::default()),
            })
            .collect();
        SequenceCache::new(layers)
    }

    fn embed(&self, tokens: &[u32], stats: &mut StepStats) -> Result<Hidden, ModelError> {
        let c = &self.config;
        let partials = embed_tokens(&self.embed, tokens, stats)?;
        let blocks: Vec<Blocks> = (0..tokens.len())
            .map(|_| Blocks {
                closed: Vec::new(),
                eps: c.rms_norm_eps,
            })
            .collect();
        Ok((partials, blocks))
    }

    fn run_layer(
        &self,
        layer: &Layer<'_>,
        at: Place,
        _tokens: &[u32],
        (partials, blocks): &mut Hidden,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        self.run_layer(layer, at, partials, blocks, caches, stats)
    }

    /// The layer's router on the row's state as it is now, mixed and normed as for its mixture
    /// of experts.
    fn guess_experts(
        &self,
        layer: &Layer<'_>,
        _i: usize,
        _tokens: &[u32],
        (partials, blocks): &Hidden,
    ) -> Option<Vec<usize>> {
        let FeedForward::Moe(moe) = &layer.ffn else {
            return None;
        };
        let eps = self.config.rms_norm_eps;
        let mixed = blocks.first()?.mix(partials.first()?, &layer.mlp_mix);
        let x = rms_norm(&mixed, &layer.post_norm, eps);
        let logits = apply_batch(&moe.router, &[x], &mut StepStats::default()).ok()?;
        let routes = self.routing(moe).route(logits.first()?);
        Some(routes.into_iter().map(|(e, _)| e).collect())
    }

    fn logits(
        &self,
        (partials, blocks): &Hidden,
        wanted: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let xs: Vec<Vec<f32>> = wanted
            .iter()
            .map(|&r| {
                let h = blocks[r].mix(&partials[r], &self.output_mix);
                rms_norm(&h, &self.norm, c.rms_norm_eps)
            })
            .collect();
        head_logits(&self.lm_head, &xs, stats)
    }
}

impl KimiK3Model<'_> {
    /// One layer for a batch of rows: `partials` holds each row's partial sum of the current
    /// block and `blocks` its closed blocks.
    fn run_layer(
        &self,
        layer: &Layer,
        at: Place,
        partials: &mut Vec<Vec<f32>>,
        blocks: &mut [Blocks],
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        let eps = self.config.rms_norm_eps;
        let xs: Vec<Vec<f32>> = partials
            .iter()
            .zip(blocks.iter())
            .map(|(p, b)| rms_norm(&b.mix(p, &layer.attention_mix), &layer.input_norm, eps))
            .collect();
        let attended = match &layer.mixer {
            Mixer::Kda(kda) => self.kda(kda, &xs, at, caches, stats)?,
            Mixer::Mla(mla) => self.mla(mla, &xs, at, caches, stats)?,
        };
        if layer.block_start {
            for (p, b) in partials.iter().zip(blocks.iter_mut()) {
                b.close(p);
            }
            *partials = attended;
        } else {
            add_rows(partials, &attended);
        }
        let xs: Vec<Vec<f32>> = partials
            .iter()
            .zip(blocks.iter())
            .map(|(p, b)| rms_norm(&b.mix(p, &layer.mlp_mix), &layer.post_norm, eps))
            .collect();
        let out = match &layer.ffn {
            FeedForward::Dense(mlp) => mlp.forward(&xs, stats)?,
            FeedForward::Moe(moe) => self.moe(moe, &xs, stats)?,
        };
        add_rows(partials, &out);
        Ok(())
    }

    /// KDA for a batch of rows: the projections for every row at once, then per row, in order,
    /// the convolution and the delta rule through its cache's state.
    fn kda(
        &self,
        w: &Kda,
        xs: &[Vec<f32>],
        at: Place,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let k = &self.config.kda;
        let (heads, dim) = (k.num_heads, k.head_dim);
        let projection = heads * dim;
        let mut qkv = vec![Vec::with_capacity(3 * projection); xs.len()];
        for part in &w.qkv {
            for (row, out) in qkv.iter_mut().zip(apply_batch(part, xs, stats)?) {
                row.extend(out);
            }
        }
        let gate_logits = apply_batch(&w.f_b, &apply_batch(&w.f_a, xs, stats)?, stats)?;
        let betas = apply_batch(&w.b, xs, stats)?;
        let out_gates = apply_batch(&w.g, xs, stats)?;
        let mut outs = Vec::with_capacity(xs.len());
        for t in 0..xs.len() {
            let (conv_state, state) = kda_state(at, caches, t)?;
            let mixed = self.convolve(w, &qkv[t], conv_state);
            let mut y = vec![0f32; projection];
            for h in 0..heads {
                let at = h * dim..(h + 1) * dim;
                let q = l2_normalized(&mixed[at.clone()], (dim as f32).powf(-0.5));
                let key = l2_normalized(&mixed[projection..][at.clone()], 1.0);
                let v = &mixed[2 * projection..][at.clone()];
                let decay: Vec<f32> = gate_logits[t][at.clone()]
                    .iter()
                    .zip(&w.dt_bias[at.clone()])
                    .map(|(a, b)| (k.gate_lower_bound * sigmoid(w.decay_rate[h] * (a + b))).exp())
                    .collect();
                let beta = sigmoid(betas[t][h]);
                let s = &mut state[h * dim * dim..(h + 1) * dim * dim];
                let head_out = delta_rule(s, &q, &key, v, &decay, beta);
                let normed = rms_norm(&head_out, &w.o_norm, self.config.rms_norm_eps);
                for ((o, n), g) in y[at.clone()].iter_mut().zip(&normed).zip(&out_gates[t][at]) {
                    *o = n * sigmoid(*g);
                }
            }
            outs.push(y);
        }
        apply_batch(&w.o, &outs, stats)
    }

    /// The depthwise causal convolution of one position's `q|k|v` channels over the cached
    /// inputs, with SiLU; the position's input joins the cache.
    fn convolve(&self, w: &Kda, input: &[f32], cached: &mut [f32]) -> Vec<f32> {
        let kernel = self.config.kda.short_conv_kernel_size;
        let channels = input.len();
        let out = (0..channels)
            .map(|ch| {
                let taps = &w.conv[ch * kernel..(ch + 1) * kernel];
                let past: f32 = (0..kernel - 1)
                    .map(|j| taps[j] * cached[j * channels + ch])
                    .sum();
                silu(past + taps[kernel - 1] * input[ch])
            })
            .collect();
        if kernel > 1 {
            cached.copy_within(channels.., 0);
            let last = (kernel - 2) * channels;
            cached[last..].copy_from_slice(input);
        }
        out
    }

    /// NoPE MLA for a batch of rows: every row's latent and key join its cache first, then
    /// each row attends to its cache up to its own position.
    fn mla(
        &self,
        w: &Mla,
        xs: &[Vec<f32>],
        at: Place,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let (nope, rope, lora, v_dim, heads) = (
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.kv_lora_rank,
            c.v_head_dim,
            c.num_attention_heads,
        );
        let width = nope + rope;
        let scale = (width as f32).powf(-0.5);
        let latent_q: Vec<Vec<f32>> = apply_batch(&w.q_a, xs, stats)?
            .iter()
            .map(|q| rms_norm(q, &w.q_a_norm, LATENT_NORM_EPS))
            .collect();
        let qs = apply_batch(&w.q_b, &latent_q, stats)?;
        for (t, kv) in apply_batch(&w.kv_a, xs, stats)?.iter().enumerate() {
            let latent = rms_norm(&kv[..lora], &w.kv_a_norm, LATENT_NORM_EPS);
            mla_state(at, caches, t)?.push(&latent, &kv[lora..]);
        }
        let dims = LatentDims {
            heads,
            nope,
            rope,
            v: v_dim,
            lora,
        };
        let q_latents = w.latent.queries(&qs, dims, stats)?;
        let mut mixed: Vec<Vec<Vec<f32>>> = Vec::with_capacity(qs.len());
        for (t, (per_head, q)) in q_latents.iter().zip(&qs).enumerate() {
            let cached = mla_state(at, caches, t)?;
            let (latents, keys) = (&cached.latent, &cached.key);
            let steps = at.rows.position[t] + 1;
            mixed.push(
                per_head
                    .iter()
                    .enumerate()
                    .map(|(h, q_latent)| {
                        let q_pe = &q[h * width + nope..(h + 1) * width];
                        attend_latent(q_latent, q_pe, latents, keys, steps, scale)
                    })
                    .collect(),
            );
        }
        let mut outs = w.latent.heads_out(&mixed, dims, stats)?;
        if let Some(gate) = &w.gate {
            for (out, g) in outs.iter_mut().zip(apply_batch(gate, xs, stats)?) {
                out.iter_mut().zip(&g).for_each(|(o, g)| *o *= sigmoid(*g));
            }
        }
        apply_batch(&w.o, &outs, stats)
    }

    /// How `moe`'s router turns its logits into routes.
    fn routing<'m>(&self, moe: &'m LatentMoe) -> Routing<'m> {
        let c = &self.config;
        Routing {
            correction_bias: &moe.correction_bias,
            experts_per_token: c.num_experts_per_token,
            groups: c.num_expert_group,
            groups_chosen: c.topk_group,
            renormalize: c.moe_renormalize,
            renormalize_eps: 1e-20,
            scaling: c.routed_scaling_factor,
        }
    }

    /// The latent MoE for a chunk: routed experts on the down-projected rows, their weighted
    /// sum normed and projected back up, plus the shared experts on the full rows.
    fn moe(
        &self,
        moe: &LatentMoe,
        xs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let routing = self.routing(moe);
        let routes: Vec<Vec<(usize, f32)>> = apply_batch(&moe.router, xs, stats)?
            .iter()
            .map(|logits| routing.route(logits))
            .collect();
        let latent_xs = apply_batch(&moe.down, xs, stats)?;
        let shared = |stats: &mut StepStats| -> Result<Option<Vec<Vec<f32>>>, ModelError> {
            moe.shared
                .as_ref()
                .map(|s| s.forward(xs, stats))
                .transpose()
        };
        let (outputs, shared) = run_routed(&moe.experts, &routes, &latent_xs, shared, stats)?;
        let mut sums = weighted_sum(&routes, &outputs, c.routed_expert_hidden_size);
        if let Some(norm) = &moe.norm {
            for sum in &mut sums {
                *sum = rms_norm(sum, norm, c.rms_norm_eps);
            }
        }
        let mut ys = apply_batch(&moe.up, &sums, stats)?;
        if let Some(shared) = shared {
            add_rows(&mut ys, &shared);
        }
        Ok(ys)
    }
}

/// `x / sqrt(Σx² + eps) · factor`.
fn l2_normalized(x: &[f32], factor: f32) -> Vec<f32> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + L2_NORM_EPS).sqrt();
    x.iter().map(|v| v * inv * factor).collect()
}

/// One step of the gated delta rule on one head's state `s` (`[v, k]`, row i the value
/// dimension): decay along the key dimension, correct the memory toward `v` by `beta`, read
/// with `q`.
fn delta_rule(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: &[f32],
    beta: f32,
) -> Vec<f32> {
    let dim = k.len();
    let mut out = vec![0f32; v.len()];
    for (i, row) in s.chunks_exact_mut(dim).enumerate() {
        row.iter_mut().zip(decay).for_each(|(s, g)| *s *= g);
        let remembered: f32 = row.iter().zip(k).map(|(s, k)| s * k).sum();
        let delta = (v[i] - remembered) * beta;
        row.iter_mut().zip(k).for_each(|(s, k)| *s += k * delta);
        out[i] = row.iter().zip(q).map(|(s, q)| s * q).sum();
    }
    out
}

impl LayerState for LayerCache {
    /// A KDA layer's recurrent state is overwritten by a pass, so a failed one leaves the
    /// cache broken; MLA layers follow (a K3 cache is cut back whole or not at all, as it
    /// always has been).
    fn cut_back(&mut self, _len: usize) -> bool {
        false
    }
}

/// Row `row`'s convolution inputs and recurrent state of a KDA layer.
fn kda_state<'c>(
    at: Place,
    caches: &'c mut [&mut Cache],
    row: usize,
) -> Result<(&'c mut [f32], &'c mut [f32]), ModelError> {
    match at.layer_cache(caches, row)? {
        LayerCache::Kda { conv, state } => Ok((conv, state)),
        LayerCache::Mla { .. } => Err(wrong_kind()),
    }
}

/// Row `row`'s cached latents and keys of an MLA layer.
fn mla_state<'c>(
    at: Place,
    caches: &'c mut [&mut Cache],
    row: usize,
) -> Result<&'c mut LatentCache, ModelError> {
    match at.layer_cache(caches, row)? {
        LayerCache::Mla(cached) => Ok(cached),
        LayerCache::Kda { .. } => Err(wrong_kind()),
    }
}

fn wrong_kind() -> ModelError {
    ModelError::Kernel(KernelError::Length {
        what: "cache layer kinds",
        expected: 0,
        actual: 1,
    })
}
