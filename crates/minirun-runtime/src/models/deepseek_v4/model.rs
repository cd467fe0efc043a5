//! The DeepSeek V4 architecture, as transformers 5.24.0's `DeepseekV4ForCausalLM` computes it:
//!
//! - hyper-connections: the residual is `hc_mult` streams; before each sub-block a learned
//!   projection of the (normalised) streams gives the weights that collapse them into the
//!   sub-block's input, spread its output back, and mix the streams (that mixing matrix made
//!   doubly stochastic by Sinkhorn iterations); a last such collapse (`hc_head`) before the norm;
//! - attention with one shared K=V head: queries through a low-rank projection and a per-head
//!   unweighted norm, interleaved RoPE on each head's last `qk_rope_head_dim` channels (plain on
//!   sliding-window layers, YaRN with its own base on compressed ones), a sliding window of
//!   keys, per-head sinks, the rotation undone on the output, and a grouped low-rank output
//!   projection;
//! - compressed attention on some layers: every `rate` tokens a compressor pools its window's
//!   projections (softmax gates with a learned position bias) into one more key; heavily
//!   compressed layers attend to all of them, compressed sparse layers pool overlapping windows
//!   of `2 rate` and attend to the `index_topk` a lightning indexer (its own compressor, queries
//!   and ReLU scores) picks;
//! - a mixture of experts on every layer: sqrt(softplus) scores, top-k of the bias-corrected
//!   scores (or, on the first layers, the experts the token's `tid2eid` row names), weights
//!   renormalised and scaled, one shared expert; SwiGLU clamped.
//!
//! Multi-token-prediction layers (`mtp.*`) are not run. A prompt runs in chunks: each product
//! is taken for the whole chunk (`matmul`), the window, compressors and indexer step position
//! by position, so a chunk gives every position the bits a step gives it. Ties in a top-k go to
//! the lower index.

use crate::blocks::mlp::{Activation, Mlp};
use crate::blocks::moe::{RoutedExperts, run_routed, weighted_sum};
use crate::blocks::norm::{rms_norm, unweighted_norm};
use crate::blocks::products::{add_rows, apply_batch, top_k};
use crate::blocks::rope::Rope;
use crate::blocks::tables::{embed_tokens, head_logits};
use crate::engine::config::{ModelConfig, limits_from_fields};
use crate::engine::decode_policy::{LayerState, Place, SequenceCache};
use crate::engine::layered_model::{Layered, LayeredModel};
use crate::models::deepseek_v4::config::{Attention, DeepSeekV4Config};
use crate::models::deepseek_v4::hyper_connections::{HyperConnection, Mixing, head_collapse};
use minirun_kernels::KernelError;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::W1_W3_W2;
use minirun_stream::matrix::Matrix;
use minirun_stream::plan::Shape;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::tables::{Table, TableUse};
use minirun_stream::weights::Weights;

/// Added to the chosen experts' weight sum before dividing (transformers' router).
const RENORMALIZE_EPS: f32 = 1e-20;

/// A compressor: projections of each token to its window's values and gates, the gates' bias
/// per position in the window, and the norm of a pooled entry.
struct Compressor<'a> {
    kv: Matrix<'a>,
    gate: Matrix<'a>,
    /// `[rate, width]`.
    position_bias: Vec<f32>,
    norm: Vec<f32>,
    rate: usize,
    /// The pooled entry's width; the projections are twice as wide when windows overlap.
    dim: usize,
    overlapping: bool,
}

struct Indexer<'a> {
    compressor: Compressor<'a>,
    q_b: Matrix<'a>,
    weights: Matrix<'a>,
}

struct AttentionWeights<'a> {
    q_a: Matrix<'a>,
    q_a_norm: Vec<f32>,
    q_b: Matrix<'a>,
    kv: Matrix<'a>,
    kv_norm: Vec<f32>,
    o_a: Matrix<'a>,
    o_b: Matrix<'a>,
    sinks: Vec<f32>,
    compressor: Option<Compressor<'a>>,
    indexer: Option<Indexer<'a>>,
}

struct Moe<'a> {
    router: Matrix<'a>,
    /// The correction bias of a top-k layer; `None` on a hash-routed one.
    correction_bias: Option<Vec<f32>>,
    experts: RoutedExperts<'a>,
    shared: Mlp<Matrix<'a>>,
}

/// One layer's weights.
pub struct Layer<'a> {
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    attention: AttentionWeights<'a>,
    moe: Moe<'a>,
}

/// A compressor's state: the entries it emitted, the tokens of the window still open, and (for
/// overlapping windows) the last closed window's first halves.
#[derive(Clone, Default)]
struct CompressorState {
    /// `[entries, dim]`, normalised and rotated.
    entries: Vec<f32>,
    open_kv: Vec<Vec<f32>>,
    open_gate: Vec<Vec<f32>>,
    /// The previous window's `[rate, dim]` values and biased gates (first halves).
    overlap: Option<(Vec<f32>, Vec<f32>)>,
}

impl CompressorState {
    fn count(&self, dim: usize) -> usize {
        self.entries.len() / dim
    }
}

#[derive(Clone, Default)]
pub struct LayerCache {
    /// The last `sliding_window - 1` K=V rows, oldest first, `[rows, head_dim]`.
    window: Vec<f32>,
    compressor: CompressorState,
    indexer: CompressorState,
}

/// The cache: per layer the window and the compressors' states.
pub type Cache = SequenceCache<LayerCache>;

/// The weights outside the layers, and what every layer's pass needs beside its own.
pub struct DeepSeekV4Model<'a> {
    config: DeepSeekV4Config,
    embed: Table<'a>,
    /// Per layer, the token's hash-routed experts (`[vocab, k]`), on hash layers.
    hash_tables: Vec<Option<Vec<i64>>>,
    head_hc: (Vec<f32>, Vec<f32>, f32),
    norm: Vec<f32>,
    lm_head: Table<'a>,
    main_rope: Rope,
    compress_rope: Rope,
}

/// DeepSeek V4 as a run holds it (see [`LayeredModel`]).
pub type DeepSeekV4<'a> = LayeredModel<'a, DeepSeekV4Model<'a>>;

fn tensor_err(name: &str, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::Tensor {
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// A layer's weights, asked for by their full names.
struct Loader<'a, 'm> {
    w: &'m Weights<'a>,
    c: &'m DeepSeekV4Config,
}

impl<'a> Loader<'a, '_> {
    fn one(&self, module: &str, rows: usize, cols: usize) -> Result<Matrix<'a>, ArtifactError> {
        self.w.matrix(module, rows, cols)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        self.w.vector(name, len)
    }

    fn hyper_connection(
        &self,
        prefix: &str,
        which: &str,
    ) -> Result<HyperConnection, ArtifactError> {
        let (n, hidden) = (self.c.hc_mult, self.c.hidden_size);
        let mix = (2 + n) * n;
        let scale = self.vector(&format!("{prefix}.hc_{which}_scale"), 3)?;
        Ok(HyperConnection {
            weights: self.vector(&format!("{prefix}.hc_{which}_fn"), mix * n * hidden)?,
            base: self.vector(&format!("{prefix}.hc_{which}_base"), mix)?,
            scale: [scale[0], scale[1], scale[2]],
        })
    }

    fn compressor(
        &self,
        prefix: &str,
        rate: usize,
        dim: usize,
        overlapping: bool,
    ) -> Result<Compressor<'a>, ArtifactError> {
        let (hidden, width) = (self.c.hidden_size, if overlapping { 2 * dim } else { dim });
        Ok(Compressor {
            kv: self.one(&format!("{prefix}.wkv"), width, hidden)?,
            gate: self.one(&format!("{prefix}.wgate"), width, hidden)?,
            position_bias: self.vector(&format!("{prefix}.ape"), rate * width)?,
            norm: self.vector(&format!("{prefix}.norm.weight"), dim)?,
            rate,
            dim,
            overlapping,
        })
    }

    fn attention(
        &self,
        prefix: &str,
        kind: Attention,
    ) -> Result<AttentionWeights<'a>, ArtifactError> {
        let c = self.c;
        let (hidden, heads, d) = (c.hidden_size, c.num_attention_heads, c.head_dim);
        let attn = format!("{prefix}.attn");
        // In the order a pass computes with them: the projections, the compressors, the output.
        let q_a = self.one(&format!("{attn}.wq_a"), c.q_lora_rank, hidden)?;
        let q_b = self.one(&format!("{attn}.wq_b"), heads * d, c.q_lora_rank)?;
        let kv = self.one(&format!("{attn}.wkv"), d, hidden)?;
        let (compressor, indexer) = match kind {
            Attention::Sliding => (None, None),
            Attention::HeavilyCompressed { rate } => (
                Some(self.compressor(&format!("{attn}.compressor"), rate, d, false)?),
                None,
            ),
            Attention::CompressedSparse { rate } => {
                let idx = format!("{attn}.indexer");
                let (ih, id) = (c.index_n_heads, c.index_head_dim);
                (
                    Some(self.compressor(&format!("{attn}.compressor"), rate, d, true)?),
                    Some(Indexer {
                        compressor: self.compressor(
                            &format!("{idx}.compressor"),
                            rate,
                            id,
                            true,
                        )?,
                        q_b: self.one(&format!("{idx}.wq_b"), ih * id, c.q_lora_rank)?,
                        weights: self.one(&format!("{idx}.weights_proj"), ih, hidden)?,
                    }),
                )
            }
        };
        Ok(AttentionWeights {
            q_a,
            q_a_norm: self.vector(&format!("{attn}.q_norm.weight"), c.q_lora_rank)?,
            q_b,
            kv,
            kv_norm: self.vector(&format!("{attn}.kv_norm.weight"), d)?,
            o_a: self.one(
                &format!("{attn}.wo_a"),
                c.o_groups * c.o_lora_rank,
                heads * d / c.o_groups,
            )?,
            o_b: self.one(&format!("{attn}.wo_b"), hidden, c.o_groups * c.o_lora_rank)?,
            sinks: self.vector(&format!("{attn}.attn_sink"), heads)?,
            compressor,
            indexer,
        })
    }

    fn activation(&self) -> Activation {
        Activation::ClampedSilu {
            limit: self.c.swiglu_limit,
        }
    }

    fn mlp(&self, prefix: &str) -> Result<Mlp<Matrix<'a>>, ArtifactError> {
        let sizes = (self.c.hidden_size, self.c.moe_intermediate_size);
        Mlp::new(&self.w.at(prefix), W1_W3_W2, sizes, self.activation())
    }

    fn moe(&self, prefix: &str, layer: usize) -> Result<Moe<'a>, ArtifactError> {
        let c = self.c;
        let ffn = format!("{prefix}.ffn");
        let sizes = (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
        let experts = RoutedExperts::new(self.w, &ffn, W1_W3_W2, sizes, self.activation())?;
        Ok(Moe {
            router: self.one(&format!("{ffn}.gate"), c.n_routed_experts, c.hidden_size)?,
            correction_bias: match c.is_hash(layer) {
                true => None,
                false => Some(self.vector(&format!("{ffn}.gate.bias"), c.n_routed_experts)?),
            },
            experts,
            shared: self.mlp(&format!("{ffn}.shared_experts"))?,
        })
    }

    fn layer(&self, i: usize) -> Result<Layer<'a>, ArtifactError> {
        let c = self.c;
        let prefix = format!("layers.{i}");
        Ok(Layer {
            attn_hc: self.hyper_connection(&prefix, "attn")?,
            ffn_hc: self.hyper_connection(&prefix, "ffn")?,
            attn_norm: self.vector(&format!("{prefix}.attn_norm.weight"), c.hidden_size)?,
            ffn_norm: self.vector(&format!("{prefix}.ffn_norm.weight"), c.hidden_size)?,
            attention: self.attention(&prefix, c.attention[i])?,
            moe: self.moe(&prefix, i)?,
        })
    }
}

impl Shape for DeepSeekV4Config {
    fn layer_count(&self) -> usize {
        self.num_hidden_layers
    }

    fn experts_per_token(&self) -> usize {
        self.num_experts_per_tok
    }

    fn cache_bytes(&self, context_tokens: usize) -> u64 {
        DeepSeekV4Config::cache_bytes(self, context_tokens)
    }
}

impl ModelConfig for DeepSeekV4Config {
    limits_from_fields!();

    fn describe(&self) -> String {
        let count = |f: fn(&Attention) -> bool| self.attention.iter().filter(|a| f(a)).count();
        format!(
            "deepseek_v4: {} layers ({} sliding-window, {} compressed sparse, {} heavily compressed; {} hash-routed), {} routed experts ({} per token), {} hyper-connection streams, vocab {}; its {} multi-token-prediction layers are not run",
            self.num_hidden_layers,
            count(|a| matches!(a, Attention::Sliding)),
            count(|a| matches!(a, Attention::CompressedSparse { .. })),
            count(|a| matches!(a, Attention::HeavilyCompressed { .. })),
            self.hash_layers,
            self.n_routed_experts,
            self.num_experts_per_tok,
            self.hc_mult,
            self.vocab_size,
            self.num_nextn_predict_layers
        )
    }
}

impl<'a> Layered<'a> for DeepSeekV4Model<'a> {
    type Config = DeepSeekV4Config;
    type Layer<'w> = Layer<'w>;
    type LayerCache = LayerCache;
    /// Per row, its `hc_mult` residual streams.
    type Hidden = Vec<Vec<f32>>;

    fn new(config: DeepSeekV4Config, w: &Weights<'a>) -> Result<Self, ArtifactError> {
        let c = &config;
        let hash_tables = (0..c.num_hidden_layers)
            .map(|i| c.is_hash(i).then(|| hash_table(w, c, i)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let n = c.hc_mult;
        let head_scale = w.vector("hc_head_scale", 1)?;
        let rd = c.qk_rope_head_dim;
        let mut compress_rope = Rope::new(
            rd,
            c.compress_rope_theta,
            c.yarn
                .as_ref()
                .map(|y| crate::engine::config::Yarn {
                    factor: y.factor,
                    original_max_position_embeddings: y.original_max_position_embeddings,
                    beta_fast: y.beta_fast,
                    beta_slow: y.beta_slow,
                    mscale: 1.0,
                    mscale_all_dim: 1.0,
                    truncate: true,
                })
                .as_ref(),
        );
        // V4 fixes YaRN's attention factor at 1.
        compress_rope.mscale = 1.0;
        Ok(DeepSeekV4Model {
            embed: w.table("embed", (c.vocab_size, c.hidden_size), TableUse::Embedding)?,
            lm_head: w.table("head", (c.vocab_size, c.hidden_size), TableUse::Head)?,
            head_hc: (
                w.vector("hc_head_fn", n * n * c.hidden_size)?,
                w.vector("hc_head_base", n)?,
                head_scale[0],
            ),
            norm: w.vector("norm.weight", c.hidden_size)?,
            main_rope: Rope::new(rd, c.rope_theta, None),
            compress_rope,
            hash_tables,
            config,
        })
    }

    fn config(&self) -> &DeepSeekV4Config {
        &self.config
    }

    fn layer<'w>(
        config: &DeepSeekV4Config,
        w: &Weights<'w>,
        i: usize,
    ) -> Result<Layer<'w>, ArtifactError> {
        Loader { w, c: config }.layer(i)
    }

    fn new_cache(&self) -> Cache {
        SequenceCache::new(vec![LayerCache::default(); self.config.num_hidden_layers])
    }

    fn embed(&self, tokens: &[u32], stats: &mut StepStats) -> Result<Vec<Vec<f32>>, ModelError> {
        let n = self.config.hc_mult;
        let rows = embed_tokens(&self.embed, tokens, stats)?;
        Ok(rows.into_iter().map(|h| h.repeat(n)).collect())
    }

    fn run_layer(
        &self,
        layer: &Layer<'_>,
        at: Place,
        tokens: &[u32],
        streams: &mut Vec<Vec<f32>>,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        self.run_layer(at, layer, tokens, streams, caches, stats)
    }

    /// The layer's router on the row's streams as they are now, collapsed for its mixture of
    /// experts; a hash layer's choice is the token's row of its table, exact.
    fn guess_experts(
        &self,
        layer: &Layer<'_>,
        i: usize,
        tokens: &[u32],
        streams: &Vec<Vec<f32>>,
    ) -> Option<Vec<usize>> {
        let c = &self.config;
        let (stream, &token) = (streams.first()?, tokens.first()?);
        let moe = &layer.moe;
        let logits = match moe.correction_bias {
            None => vec![0f32; c.n_routed_experts],
            Some(_) => {
                let mix = Mixing::of(&layer.ffn_hc, stream, c);
                let x = rms_norm(&mix.collapsed, &layer.ffn_norm, c.rms_norm_eps);
                let logits = apply_batch(&moe.router, &[x], &mut StepStats::default()).ok()?;
                logits.into_iter().next()?
            }
        };
        let routes = self
            .route(&logits, i, token, moe.correction_bias.as_deref())
            .ok()?;
        Some(routes.into_iter().map(|(e, _)| e).collect())
    }

    /// A hash layer routes by the token alone.
    fn guesses_exactly(&self, layer: &Layer<'_>, _i: usize) -> bool {
        layer.moe.correction_bias.is_none()
    }

    fn logits(
        &self,
        streams: &Vec<Vec<f32>>,
        wanted: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let (weights, base, scale) = &self.head_hc;
        let xs: Vec<Vec<f32>> = wanted
            .iter()
            .map(|&r| {
                let h = head_collapse(&streams[r], weights, base, *scale, c);
                rms_norm(&h, &self.norm, c.rms_norm_eps)
            })
            .collect();
        head_logits(&self.lm_head, &xs, stats)
    }
}

impl DeepSeekV4Model<'_> {
    /// One layer for a batch of rows: attention, then the mixture of experts, each inside its
    /// hyper-connection.
    fn run_layer(
        &self,
        at: Place,
        layer: &Layer,
        tokens: &[u32],
        streams: &mut [Vec<f32>],
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let kind = c.attention[at.layer];
        self.in_hyper_connection(&layer.attn_hc, &layer.attn_norm, streams, |xs| {
            self.attention(&layer.attention, kind, xs, at, caches, stats)
        })?;
        self.in_hyper_connection(&layer.ffn_hc, &layer.ffn_norm, streams, |xs| {
            self.moe(&layer.moe, at.layer, tokens, xs, stats)
        })
    }

    /// One sub-block inside its hyper-connection: each position's streams collapsed and
    /// normed into the sub-block's input, its output spread back over the mixed streams.
    fn in_hyper_connection(
        &self,
        hc: &HyperConnection,
        norm: &[f32],
        streams: &mut [Vec<f32>],
        block: impl FnOnce(&[Vec<f32>]) -> Result<Vec<Vec<f32>>, ModelError>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let mixes: Vec<Mixing> = streams.iter().map(|x| Mixing::of(hc, x, c)).collect();
        let xs: Vec<Vec<f32>> = mixes
            .iter()
            .map(|m| rms_norm(&m.collapsed, norm, c.rms_norm_eps))
            .collect();
        let outs = block(&xs)?;
        for ((x, m), out) in streams.iter_mut().zip(&mixes).zip(&outs) {
            *x = m.expand(x, out);
        }
        Ok(())
    }

    /// Attention for a batch of rows: the projections for every row at once, then per row, in
    /// order, the window, the compressors and the indexer through its cache.
    fn attention(
        &self,
        w: &AttentionWeights,
        kind: Attention,
        xs: &[Vec<f32>],
        at: Place,
        caches: &mut [&mut Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let (heads, d, rd, eps) = (
            c.num_attention_heads,
            c.head_dim,
            c.qk_rope_head_dim,
            c.rms_norm_eps,
        );
        let rope = match kind {
            Attention::Sliding => &self.main_rope,
            _ => &self.compress_rope,
        };
        let q_residual: Vec<Vec<f32>> = apply_batch(&w.q_a, xs, stats)?
            .iter()
            .map(|q| rms_norm(q, &w.q_a_norm, eps))
            .collect();
        let queries = apply_batch(&w.q_b, &q_residual, stats)?;
        let kvs = apply_batch(&w.kv, xs, stats)?;
        let projected = match &w.compressor {
            Some(comp) => Some(project(comp, xs, stats)?),
            None => None,
        };
        let indexed = match &w.indexer {
            Some(idx) => Some((
                project(&idx.compressor, xs, stats)?,
                apply_batch(&idx.q_b, &q_residual, stats)?,
                apply_batch(&idx.weights, xs, stats)?,
            )),
            None => None,
        };
        let mut outs = Vec::with_capacity(xs.len());
        for (p, (q, kv)) in queries.iter().zip(&kvs).enumerate() {
            let position = at.rows.position[p];
            let state = at.layer_cache(caches, p)?;
            let mut q = q.clone();
            for head in q.chunks_exact_mut(d) {
                unweighted_norm(head, eps);
                rope.apply(&mut head[d - rd..], position);
            }
            let mut kv = rms_norm(kv, &w.kv_norm, eps);
            rope.apply(&mut kv[d - rd..], position);
            let mut keys = state.window.clone();
            keys.extend_from_slice(&kv);
            let keep = (c.sliding_window - 1) * d;
            state.window = keys[keys.len().saturating_sub(keep)..].to_vec();
            if let (Some(comp), Some(proj)) = (&w.compressor, &projected) {
                comp.push(
                    &mut state.compressor,
                    &proj.0[p],
                    &proj.1[p],
                    &self.compress_rope,
                    eps,
                );
                let entries = &state.compressor.entries;
                let chosen: Vec<usize> = match (&w.indexer, &indexed) {
                    (Some(idx), Some((iproj, iq, iw))) => {
                        idx.compressor.push(
                            &mut state.indexer,
                            &iproj.0[p],
                            &iproj.1[p],
                            &self.compress_rope,
                            eps,
                        );
                        self.select(&state.indexer, &iq[p], &iw[p], position)
                    }
                    _ => (0..entries.len() / d).collect(),
                };
                for e in chosen {
                    keys.extend_from_slice(&entries[e * d..(e + 1) * d]);
                }
            }
            let mut out = attend(&q, &keys, &w.sinks, heads, d);
            for head in out.chunks_exact_mut(d) {
                rope.apply_inverse(&mut head[d - rd..], position);
            }
            outs.push(self.grouped_output(&w.o_a, &out, stats)?);
        }
        apply_batch(&w.o_b, &outs, stats)
    }

    /// `o_a` per group: group g's heads through rows `[g·o_lora, (g+1)·o_lora)`.
    fn grouped_output(
        &self,
        o_a: &Matrix,
        heads_out: &[f32],
        stats: &mut StepStats,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let (groups, rank) = (c.o_groups, c.o_lora_rank);
        let width = heads_out.len() / groups;
        let mut y = vec![0f32; groups * rank];
        o_a.with(|o_a| {
            for (g, (x, out)) in heads_out
                .chunks_exact(width)
                .zip(y.chunks_exact_mut(rank))
                .enumerate()
            {
                o_a.matvec_rows(g * rank..(g + 1) * rank, x, out)?;
            }
            stats.weight_bytes += o_a.stored_bytes() as u64;
            Ok::<_, KernelError>(())
        })?;
        Ok(y)
    }

    /// The lightning indexer's choice for the query at `position`: the `index_topk` emitted
    /// entries with the highest `Σ_h w_h · relu(q_h · k) / sqrt(dim)`, where
    /// `w = weights_proj(x) / sqrt(heads)`; fewer when fewer are emitted. Ascending order.
    fn select(
        &self,
        state: &CompressorState,
        q: &[f32],
        weights: &[f32],
        position: usize,
    ) -> Vec<usize> {
        let c = &self.config;
        let (heads, dim, rd) = (c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim);
        let mut q = q.to_vec();
        for head in q.chunks_exact_mut(dim) {
            self.compress_rope.apply(&mut head[dim - rd..], position);
        }
        let score_scale = (dim as f32).powf(-0.5);
        let weight_scale = (heads as f32).powf(-0.5);
        let count = state.count(dim);
        let scores: Vec<f32> = (0..count)
            .map(|e| {
                let key = &state.entries[e * dim..(e + 1) * dim];
                q.chunks_exact(dim)
                    .zip(weights)
                    .map(|(qh, &w)| {
                        let dot: f32 = qh.iter().zip(key).map(|(a, b)| a * b).sum();
                        dot.max(0.0) * score_scale * (w * weight_scale)
                    })
                    .sum()
            })
            .collect();
        let mut chosen = top_k(&scores, c.index_topk);
        chosen.sort_unstable();
        chosen
    }

    /// The mixture of experts for a chunk.
    fn moe(
        &self,
        moe: &Moe,
        layer: usize,
        tokens: &[u32],
        xs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let logits = apply_batch(&moe.router, xs, stats)?;
        let routes: Vec<Vec<(usize, f32)>> = logits
            .iter()
            .zip(tokens)
            .map(|(l, &t)| self.route(l, layer, t, moe.correction_bias.as_deref()))
            .collect::<Result<_, _>>()?;
        let shared = |stats: &mut StepStats| -> Result<Vec<Vec<f32>>, ModelError> {
            moe.shared.forward(xs, stats)
        };
        let (outputs, shared) = run_routed(&moe.experts, &routes, xs, shared, stats)?;
        let mut ys = weighted_sum(&routes, &outputs, c.hidden_size);
        add_rows(&mut ys, &shared);
        Ok(ys)
    }

    /// The experts for one token: the top `k` of `sqrt(softplus(logit)) + bias`, or the
    /// token's `tid2eid` row on a hash layer; weighted by their scores renormalised and scaled.
    fn route(
        &self,
        logits: &[f32],
        layer: usize,
        token: u32,
        bias: Option<&[f32]>,
    ) -> Result<Vec<(usize, f32)>, ModelError> {
        let c = &self.config;
        let k = c.num_experts_per_tok;
        let scores: Vec<f32> = logits.iter().map(|&l| softplus(l).sqrt()).collect();
        let chosen: Vec<usize> = match (bias, self.hash_tables.get(layer).and_then(Option::as_ref))
        {
            (Some(bias), _) => {
                let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                top_k(&choice, k)
            }
            (None, Some(table)) => {
                let row = &table[token as usize * k..(token as usize + 1) * k];
                row.iter().map(|&e| e as usize).collect()
            }
            (None, None) => {
                return Err(ModelError::Artifact(tensor_err(
                    &format!("layers.{layer}.ffn.gate"),
                    "has neither a correction bias nor a tid2eid table",
                )));
            }
        };
        let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        let sum: f32 = weights.iter().sum::<f32>() + RENORMALIZE_EPS;
        weights.iter_mut().for_each(|w| *w /= sum);
        Ok(chosen
            .into_iter()
            .zip(weights)
            .map(|(e, w)| (e, w * c.routed_scaling_factor))
            .collect())
    }
}

/// A hash layer's `tid2eid` table, every entry checked to name an expert.
fn hash_table(w: &Weights, c: &DeepSeekV4Config, layer: usize) -> Result<Vec<i64>, ArtifactError> {
    let name = format!("layers.{layer}.ffn.gate.tid2eid");
    let table = w.integers(&name, c.vocab_size * c.num_experts_per_tok)?;
    if let Some(bad) = table
        .iter()
        .find(|&&e| e < 0 || e as usize >= c.n_routed_experts)
    {
        return Err(tensor_err(
            &name,
            format!("names expert {bad}; the layer has {}", c.n_routed_experts),
        ));
    }
    Ok(table)
}

/// `softplus(x) = ln(1 + e^x)`, `x` itself above 20 (torch's threshold).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Each position's compressor projections: `(values, gates)`.
type Projected = (Vec<Vec<f32>>, Vec<Vec<f32>>);

fn project(
    comp: &Compressor,
    xs: &[Vec<f32>],
    stats: &mut StepStats,
) -> Result<Projected, ModelError> {
    Ok((
        apply_batch(&comp.kv, xs, stats)?,
        apply_batch(&comp.gate, xs, stats)?,
    ))
}

impl Compressor<'_> {
    /// Takes one token's projections; when they close a window, pools it into an entry:
    /// per channel, the values weighted by the softmax of their biased gates over the window
    /// (an overlapping window also over the previous window's first halves), normed, and
    /// rotated at the window's first position.
    fn push(&self, state: &mut CompressorState, kv: &[f32], gate: &[f32], rope: &Rope, eps: f32) {
        let width = kv.len();
        let slot = state.open_kv.len();
        let biased: Vec<f32> = gate
            .iter()
            .zip(&self.position_bias[slot * width..(slot + 1) * width])
            .map(|(g, b)| g + b)
            .collect();
        state.open_kv.push(kv.to_vec());
        state.open_gate.push(biased);
        if state.open_kv.len() < self.rate {
            return;
        }
        let dim = self.dim;
        let window = state.count(dim);
        // The slots pooled, (values, gates) rows of `dim`: an overlapping window's second
        // halves after the previous window's first halves (none before the first window).
        let current = state.open_kv.iter().zip(&state.open_gate);
        let rows: Vec<(&[f32], &[f32])> = match (self.overlapping, &state.overlap) {
            (false, _) => current.map(|(k, g)| (&k[..], &g[..])).collect(),
            (true, previous) => previous
                .iter()
                .flat_map(|(k, g)| k.chunks_exact(dim).zip(g.chunks_exact(dim)))
                .chain(current.map(|(k, g)| (&k[dim..], &g[dim..])))
                .collect(),
        };
        let pooled = pool(&rows, dim);
        let mut entry = rms_norm(&pooled, &self.norm, eps);
        let rd = rope.dims();
        rope.apply(&mut entry[dim - rd..], window * self.rate);
        if self.overlapping {
            let first = |rows: &[Vec<f32>]| -> Vec<f32> {
                rows.iter().flat_map(|r| r[..dim].iter().copied()).collect()
            };
            state.overlap = Some((first(&state.open_kv), first(&state.open_gate)));
        }
        state.entries.extend_from_slice(&entry);
        state.open_kv.clear();
        state.open_gate.clear();
    }
}

/// Per channel, the rows' values weighted by the softmax of their gates over the rows.
fn pool(rows: &[(&[f32], &[f32])], dim: usize) -> Vec<f32> {
    (0..dim)
        .map(|ch| {
            let max = rows
                .iter()
                .map(|(_, g)| g[ch])
                .fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = rows.iter().map(|(_, g)| (g[ch] - max).exp()).collect();
            let total: f32 = exps.iter().sum();
            rows.iter()
                .zip(&exps)
                .map(|((k, _), e)| k[ch] * (e / total))
                .sum()
        })
        .collect()
}

/// One position's attention over `keys` (`[n, dim]`, values the same rows) with a sink logit
/// per head: `softmax([q·k / sqrt(dim)..., sink])` without the sink's share, mixing the rows.
fn attend(q: &[f32], keys: &[f32], sinks: &[f32], heads: usize, dim: usize) -> Vec<f32> {
    let scale = (dim as f32).powf(-0.5);
    let rows = keys.len() / dim;
    let mut out = vec![0f32; heads * dim];
    for ((qh, oh), &sink) in q
        .chunks_exact(dim)
        .zip(out.chunks_exact_mut(dim))
        .zip(sinks)
        .take(heads)
    {
        let scores: Vec<f32> = keys
            .chunks_exact(dim)
            .map(|k| qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let max = scores.iter().copied().fold(sink, f32::max);
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = exps.iter().sum::<f32>() + (sink - max).exp();
        for (k, e) in keys.chunks_exact(dim).zip(&exps).take(rows) {
            let p = e / total;
            oh.iter_mut().zip(k).for_each(|(o, v)| *o += p * v);
        }
    }
    out
}

impl LayerState for LayerCache {
    /// The window and the compressors' open entries are overwritten by a pass, so a failed
    /// one leaves the cache broken.
    fn cut_back(&mut self, _len: usize) -> bool {
        false
    }
}
