//! What the architectures share: the products every layer runs (each counted in the step's
//! figures), norms and activations, the gated MLP, and mixture-of-experts dispatch to held or
//! streamed routed experts. Each function fixes its operations and their order, so a model
//! built from them gives the same bits at any batch size and whether its experts were held or
//! read just now.

use std::time::Duration;

use crate::artifact::{Artifact, ArtifactError};
use crate::experts::{ExpertCache, ExpertParts, with_fetched};
use crate::kernels::{KernelError, QMatrix};
use crate::shared_rows::SharedRows;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("token id {0} is outside the vocabulary of {1}")]
    Token(u32, usize),
    #[error("position {0} is past max_position_embeddings {1}")]
    Position(usize, usize),
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error(
        "this cache was left part-way through a step by an earlier error (its recurrent state is not that of any prefix); start a new generation"
    )]
    BrokenCache,
    #[error("this cache was made by a model of another architecture")]
    ForeignCache,
    #[error("a batch step was given {tokens} tokens for {caches} caches: one token per cache")]
    BatchShape { tokens: usize, caches: usize },
}

/// What one step read, for the run's figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepStats {
    /// Stored weight bytes the step's products read (an embedding row counts its row).
    pub weight_bytes: u64,
    /// Routed-expert bytes read from storage (cache misses).
    pub expert_read_bytes: u64,
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    /// Deterministic weights of streamed layers read from storage.
    pub layer_read_bytes: u64,
    /// Reads that bypassed the page cache (`O_DIRECT`) and reads that went through it.
    pub direct_reads: u64,
    pub buffered_reads: u64,
    /// Wall time the step waited for expert reads.
    pub io_time: Duration,
    /// Wall time during which at least one of the step's reads was in flight (overlapping
    /// reads count once): the I/O the step needed, whether or not compute hid it.
    pub read_busy: Duration,
}

pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    x.iter().zip(weight).map(|(v, w)| w * (v * inv)).collect()
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// What the prefill of a model whose cache cannot be rewound checks before the cache changes:
/// the cache is whole, the prompt is not empty, its tokens are in the vocabulary, and it fits
/// the context.
pub(crate) fn check_prompt(
    tokens: &[u32],
    cached: usize,
    broken: bool,
    vocab: usize,
    max_positions: usize,
) -> Result<(), ModelError> {
    if broken {
        return Err(ModelError::BrokenCache);
    }
    if tokens.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Token(token, vocab));
    }
    let last = cached + tokens.len() - 1;
    if last >= max_positions {
        return Err(ModelError::Position(last, max_positions));
    }
    Ok(())
}

/// Which logits a pass returns.
#[derive(Debug, Clone)]
pub(crate) enum Logits {
    /// Every row's (one per sequence of a batch step).
    Every,
    /// These rows' (the last rows of several prompts), in this order.
    Of(Vec<usize>),
}

impl Logits {
    /// The rows, of a pass of `count`, whose logits are wanted.
    pub fn rows(&self, count: usize) -> Vec<usize> {
        match self {
            Logits::Every => (0..count).collect(),
            Logits::Of(rows) => rows.clone(),
        }
    }
}

/// Several prompts as the rows of passes of at most `chunk` rows, each prompt's positions in
/// order after the `cached` positions of its cache; `pass(tokens, rows, logits)` runs one pass.
/// Returns each prompt's last logits.
pub(crate) fn prefill_rows(
    prompts: &[&[u32]],
    cached: &[usize],
    chunk: usize,
    mut pass: impl FnMut(&[u32], &Rows, Logits) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let flat: Vec<(usize, usize, u32, bool)> = prompts
        .iter()
        .zip(cached)
        .enumerate()
        .flat_map(|(seq, (prompt, &from))| {
            prompt
                .iter()
                .enumerate()
                .map(move |(i, &t)| (seq, from + i, t, i + 1 == prompt.len()))
        })
        .collect();
    let mut last = vec![Vec::new(); prompts.len()];
    for part in flat.chunks(chunk.max(1)) {
        let tokens: Vec<u32> = part.iter().map(|r| r.2).collect();
        let rows = Rows {
            cache: part.iter().map(|r| r.0).collect(),
            position: part.iter().map(|r| r.1).collect(),
        };
        let wanted: Vec<usize> = (0..part.len()).filter(|&r| part[r].3).collect();
        let logits = pass(&tokens, &rows, Logits::Of(wanted.clone()))?;
        for (r, l) in wanted.into_iter().zip(logits) {
            last[part[r].0] = l;
        }
    }
    Ok(last)
}

/// Where each row of a pass goes: its sequence's cache (an index into the pass's caches) and
/// its position there.
pub(crate) struct Rows {
    pub cache: Vec<usize>,
    pub position: Vec<usize>,
}

impl Rows {
    /// One row per cache, at its next position (each holding `cached`).
    pub fn one_each(cached: impl IntoIterator<Item = usize>) -> Rows {
        let position: Vec<usize> = cached.into_iter().collect();
        Rows {
            cache: (0..position.len()).collect(),
            position,
        }
    }
}

/// A cache kept per layer, whose layer `i` a pass's row reads and extends, and which a failed
/// pass leaves broken (its recurrent state is no prefix's).
pub(crate) trait LayeredCache {
    type Layer;

    fn layers_mut(&mut self) -> &mut [Self::Layer];
    /// Positions it holds.
    fn len(&self) -> usize;
    fn broken(&self) -> bool;
    fn set_broken(&mut self);
}

/// A batch step over caches that a failure breaks: every token and cache checked before any
/// cache changes (one token per cache, in the vocabulary, with room for one more position, no
/// broken cache), then `forward` on one row per cache; if it fails, every cache is broken.
pub(crate) fn step_each<C: LayeredCache>(
    tokens: &[u32],
    caches: &mut [&mut C],
    (vocab, max_positions): (usize, usize),
    forward: impl FnOnce(&Rows, &mut [&mut C]) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    crate::model::check_batch(tokens, caches)?;
    for (token, cache) in tokens.iter().zip(caches.iter()) {
        let one = std::slice::from_ref(token);
        check_prompt(one, cache.len(), cache.broken(), vocab, max_positions)?;
    }
    let rows = Rows::one_each(caches.iter().map(|c| c.len()));
    let result = forward(&rows, caches);
    if result.is_err() {
        caches.iter_mut().for_each(|c| c.set_broken());
    }
    result
}

/// Several prompts over caches that a failure breaks, in passes of at most `chunk` rows: every
/// prompt and cache checked before any cache changes (one prompt per cache, each non-empty, in
/// the vocabulary, within the context, no broken cache), then `forward` per pass; if one
/// fails, every cache is broken. Each prompt's last logits.
pub(crate) fn prefill_each<C: LayeredCache>(
    prompts: &[&[u32]],
    caches: &mut [&mut C],
    (vocab, max_positions, chunk): (usize, usize, usize),
    mut forward: impl FnMut(&[u32], &Rows, &mut [&mut C], Logits) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    if prompts.len() != caches.len() {
        return Err(ModelError::BatchShape {
            tokens: prompts.len(),
            caches: caches.len(),
        });
    }
    for (prompt, cache) in prompts.iter().zip(caches.iter()) {
        check_prompt(prompt, cache.len(), cache.broken(), vocab, max_positions)?;
    }
    let cached: Vec<usize> = caches.iter().map(|c| c.len()).collect();
    let result = prefill_rows(prompts, &cached, chunk, |tokens, rows, logits| {
        forward(tokens, rows, caches, logits)
    });
    if result.is_err() {
        caches.iter_mut().for_each(|c| c.set_broken());
    }
    result
}

/// The layer a pass is in, and where its rows go.
#[derive(Clone, Copy)]
pub(crate) struct Place<'r> {
    pub layer: usize,
    pub rows: &'r Rows,
}

impl Place<'_> {
    /// Row `row`'s state of this layer, in its sequence's cache.
    pub fn layer_cache<'c, C: LayeredCache>(
        &self,
        caches: &'c mut [&mut C],
        row: usize,
    ) -> Result<&'c mut C::Layer, ModelError> {
        let missing = ModelError::Kernel(KernelError::Length {
            what: "cache layers",
            expected: self.layer + 1,
            actual: 0,
        });
        let Some(&seq) = self.rows.cache.get(row) else {
            return Err(missing);
        };
        match caches.get_mut(seq) {
            Some(cache) => cache.layers_mut().get_mut(self.layer).ok_or(missing),
            None => Err(missing),
        }
    }
}

/// `y = W x` into a new vector, counting the bytes read.
pub(crate) fn apply(
    m: &QMatrix,
    x: &[f32],
    stats: &mut StepStats,
) -> Result<Vec<f32>, KernelError> {
    let mut y = vec![0f32; m.rows];
    m.matvec(x, &mut y)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(y)
}

/// `W x` for every `x` of a batch, the matrix's bytes read once for all of them: each output
/// has the bits [`apply`] gives it alone (`QMatrix::matmul`).
pub(crate) fn apply_batch<X: AsRef<[f32]>>(
    m: &QMatrix,
    xs: &[X],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    if let [x] = xs {
        return Ok(vec![apply(m, x.as_ref(), stats)?]);
    }
    let mut flat = Vec::with_capacity(xs.len() * m.cols());
    for x in xs {
        flat.extend_from_slice(x.as_ref());
    }
    let mut ys = vec![0f32; xs.len() * m.rows];
    m.matmul(&flat, xs.len(), &mut ys)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(ys.chunks_exact(m.rows).map(<[f32]>::to_vec).collect())
}

/// [`apply_batch`] on rows `which` of a shared input: with 8-bit activations the rows are
/// quantized once for every product that reads them ([`SharedRows`]); each output has the bits
/// [`apply`] gives its row alone.
pub(crate) fn apply_shared(
    m: &QMatrix,
    input: &SharedRows,
    which: &[usize],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    let Some(group) = m.int8_group() else {
        return apply_batch(m, &SharedRows::pick(input.values(), which)?, stats);
    };
    let all = input.quantized(group)?;
    let outs = m.matmul_quantized(&SharedRows::pick(&all, which)?)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(outs)
}

/// The indices of the `k` largest `values` (all of them when fewer), largest first; ties go
/// to the lower index.
pub(crate) fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// Per row of a batch, `Σ weight · output` over its routes, in the route's order (`width` wide).
pub(crate) fn weighted_sum(
    routes: &[Vec<(usize, f32)>],
    outputs: &RoutedOutputs,
    width: usize,
) -> Vec<Vec<f32>> {
    let mut sums = vec![vec![0f32; width]; routes.len()];
    for ((sum, chosen), outs) in sums.iter_mut().zip(routes).zip(outputs) {
        for (&(_, weight), out) in chosen.iter().zip(outs) {
            sum.iter_mut().zip(out).for_each(|(s, o)| *s += o * weight);
        }
    }
    sums
}

/// `ys[i] += outs[i]` for every row of a batch.
pub(crate) fn add_rows(ys: &mut [Vec<f32>], outs: &[Vec<f32>]) {
    for (y, out) in ys.iter_mut().zip(outs) {
        y.iter_mut().zip(out).for_each(|(y, o)| *y += o);
    }
}

/// How a gated MLP combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Activation {
    /// `silu(gate) * up` (DeepSeek).
    Silu,
    /// SiTU (Kimi K3): `β·tanh(gate/β)·σ(gate) · β_lin·tanh(up/β_lin)`.
    Situ { beta: f32, linear_beta: f32 },
    /// DeepSeek V4's clamped SwiGLU: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    ClampedSilu { limit: f32 },
}

impl Activation {
    fn combine(self, gate: f32, up: f32) -> f32 {
        match self {
            Activation::Silu => silu(gate) * up,
            Activation::Situ { beta, linear_beta } => {
                let a = beta * (gate / beta).tanh() * sigmoid(gate);
                a * (linear_beta * (up / linear_beta).tanh())
            }
            Activation::ClampedSilu { limit } => silu(gate.min(limit)) * up.clamp(-limit, limit),
        }
    }
}

pub(crate) struct Mlp<'a> {
    pub gate: QMatrix<'a>,
    pub up: QMatrix<'a>,
    pub down: QMatrix<'a>,
    pub activation: Activation,
}

impl Mlp<'_> {
    pub fn forward(
        &self,
        xs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let all: Vec<usize> = (0..xs.len()).collect();
        self.forward_on(&SharedRows::new(xs), &all, stats)
    }

    /// The MLP on rows `which` of a shared input (the gate and up projections read the same
    /// rows, quantized once between them and any other product sharing `input`).
    pub(crate) fn forward_on(
        &self,
        input: &SharedRows,
        which: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let gate = apply_shared(&self.gate, input, which, stats)?;
        let up = apply_shared(&self.up, input, which, stats)?;
        let inner: Vec<Vec<f32>> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| {
                g.iter()
                    .zip(u)
                    .map(|(&g, &u)| self.activation.combine(g, u))
                    .collect()
            })
            .collect();
        apply_batch(&self.down, &inner, stats)
    }
}

/// How a router turns its logits into routes.
pub(crate) struct Routing<'b> {
    pub correction_bias: &'b [f32],
    pub experts_per_token: usize,
    /// Expert groups, and how many of them a token may choose from.
    pub groups: usize,
    pub groups_chosen: usize,
    pub renormalize: bool,
    /// Added to the chosen weights' sum before dividing (mlx-lm's K3 adds 1e-20; DeepSeek none).
    pub renormalize_eps: f32,
    pub scaling: f32,
}

impl Routing<'_> {
    /// Sigmoid scores; the bias-corrected ones choose the groups (by the sum of each group's
    /// top two) and then the experts; the uncorrected scores of the chosen ones, renormalised
    /// and scaled, weight their outputs. Ties go to the lower index.
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let mut choice: Vec<f32> = scores
            .iter()
            .zip(self.correction_bias)
            .map(|(s, b)| s + b)
            .collect();
        if self.groups > 1 {
            let size = choice.len() / self.groups;
            let mut groups: Vec<(f32, usize)> = choice
                .chunks(size)
                .map(|g| {
                    let mut sorted = g.to_vec();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    match sorted[..] {
                        [a, b, ..] => a + b,
                        [a] => a,
                        [] => 0.0,
                    }
                })
                .zip(0..)
                .collect();
            groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, g) in groups.iter().skip(self.groups_chosen) {
                choice[g * size..(g + 1) * size].fill(0.0);
            }
        }
        let chosen = top_k(&choice, self.experts_per_token);
        let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        if chosen.len() > 1 && self.renormalize {
            let sum: f32 = weights.iter().sum::<f32>() + self.renormalize_eps;
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        chosen
            .iter()
            .zip(weights)
            .map(|(&e, w)| (e, w * self.scaling))
            .collect()
    }
}

/// One head of one position in multi-head latent attention, over the first `steps` cached
/// positions: content scores against the cached latents (`[steps, lora]`), positional scores
/// against the cached keys, both scaled; the latents mixed by their softmax.
pub(crate) fn attend_latent(
    q_latent: &[f32],
    q_pe: &[f32],
    latents: &[f32],
    keys: &[f32],
    steps: usize,
    scale: f32,
) -> Vec<f32> {
    let (lora, rope) = (q_latent.len(), q_pe.len());
    let q_pe_scaled: Vec<f32> = q_pe.iter().map(|a| a * scale).collect();
    let scores: Vec<f32> = (0..steps)
        .map(|t| {
            let content = dot_in_lanes(q_latent, &latents[t * lora..(t + 1) * lora]);
            let positional = dot_in_lanes(&q_pe_scaled, &keys[t * rope..(t + 1) * rope]);
            content * scale + positional
        })
        .collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f32 = exps.iter().sum();
    let mut mixed = vec![0f32; lora];
    for (t, e) in exps.iter().enumerate() {
        let p = e / total;
        mixed
            .iter_mut()
            .zip(&latents[t * lora..(t + 1) * lora])
            .for_each(|(m, l)| *m += p * l);
    }
    mixed
}

/// `sum a[k] * b[k]` in a fixed order that does not wait on every add: lane `j` of 8 adds the
/// products `k = 8c + j` in ascending `c` (the tail's products go to lanes `0..`), then
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`. With one chain of adds, the scores
/// took 13% of a 300-token decode on this machine's cores, bound by the add's latency.
pub(crate) fn dot_in_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a_chunks, a_tail) = a.as_chunks::<8>();
    let (b_chunks, b_tail) = b.as_chunks::<8>();
    for (x, y) in a_chunks.iter().zip(b_chunks) {
        for j in 0..8 {
            lanes[j] += x[j] * y[j];
        }
    }
    for (j, (x, y)) in a_tail.iter().zip(b_tail).enumerate() {
        lanes[j] += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
}

/// Multi-head latent attention's per-head sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LatentDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub lora: usize,
}

/// `kv_b_proj`, in either layout.
pub(crate) enum LatentProjections<'a> {
    /// MLX: per head, `embed_q` is `[kv_lora, nope]` and `unembed_out` is `[v, kv_lora]`.
    Split {
        embed_q: crate::artifact::Stack<'a>,
        unembed_out: crate::artifact::Stack<'a>,
    },
    /// Hugging Face: `[heads * (nope + v), kv_lora]`; head h's key rows come first.
    Whole(QMatrix<'a>),
}

/// `run(h)` for every head `h`, heads on whichever worker takes them: a head's projection is
/// too small to be worth splitting between threads (each split wakes the other workers), and
/// sixteen of them are not. Each head's outputs are computed as they would be alone.
fn each_head<T: Send>(
    heads: usize,
    stats: &mut StepStats,
    run: impl Fn(usize, &mut StepStats) -> Result<T, KernelError> + Sync,
) -> Result<Vec<T>, KernelError> {
    use rayon::prelude::*;
    let results: Vec<_> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let mut own = StepStats::default();
            run(h, &mut own).map(|out| (out, own))
        })
        .collect();
    let mut outs = Vec::with_capacity(heads);
    for result in results {
        let (out, own) = result?;
        crate::generate::accumulate(stats, &own);
        outs.push(out);
    }
    Ok(outs)
}

fn head<'a>(stack: &crate::artifact::Stack<'a>, h: usize) -> Result<QMatrix<'a>, KernelError> {
    stack.get(h).ok_or(KernelError::Length {
        what: "heads",
        expected: h + 1,
        actual: stack.len(),
    })
}

impl LatentProjections<'_> {
    /// Per position and head, the query's no-rope part (`qs[t]` holds the heads side by side,
    /// `nope + rope` each) projected into the latent space: `embed_q` for every position at
    /// once, or the key rows of `kv_b_proj` transposed, position by position.
    pub fn queries(
        &self,
        qs: &[Vec<f32>],
        d: LatentDims,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<Vec<f32>>>, KernelError> {
        let width = d.nope + d.rope;
        let mut q_latents = vec![Vec::with_capacity(d.heads); qs.len()];
        match self {
            LatentProjections::Split { embed_q, .. } => {
                let per_head = each_head(d.heads, stats, |h, stats| {
                    let rows: Vec<Vec<f32>> = qs
                        .iter()
                        .map(|q| q[h * width..h * width + d.nope].to_vec())
                        .collect();
                    apply_batch(&head(embed_q, h)?, &rows, stats)
                })?;
                for latents in per_head {
                    for (t, latent) in latents.into_iter().enumerate() {
                        q_latents[t].push(latent);
                    }
                }
            }
            LatentProjections::Whole(m) => {
                for (q, per_head) in qs.iter().zip(&mut q_latents) {
                    for h in 0..d.heads {
                        let first = h * (d.nope + d.v);
                        let mut latent = vec![0f32; d.lora];
                        let q_nope = &q[h * width..h * width + d.nope];
                        m.vecmat_rows(first..first + d.nope, q_nope, &mut latent)?;
                        per_head.push(latent);
                    }
                }
            }
        }
        Ok(q_latents)
    }

    /// Per position, every head's mixed latent projected out (`unembed_out` for every position
    /// at once, or the value rows of `kv_b_proj` position by position), heads side by side.
    pub fn heads_out(
        &self,
        mixed: &[Vec<Vec<f32>>],
        d: LatentDims,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let mut outs = vec![vec![0f32; d.heads * d.v]; mixed.len()];
        match self {
            LatentProjections::Split { unembed_out, .. } => {
                let per_head = each_head(d.heads, stats, |h, stats| {
                    let rows = mixed
                        .iter()
                        .map(|per_head| {
                            per_head.get(h).ok_or(KernelError::Length {
                                what: "mixed heads",
                                expected: d.heads,
                                actual: per_head.len(),
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    apply_batch(&head(unembed_out, h)?, &rows, stats)
                })?;
                for (h, head_outs) in per_head.into_iter().enumerate() {
                    for (out, head_out) in outs.iter_mut().zip(head_outs) {
                        out[h * d.v..(h + 1) * d.v].copy_from_slice(&head_out);
                    }
                }
            }
            LatentProjections::Whole(m) => {
                for (out, per_head) in outs.iter_mut().zip(mixed) {
                    for (h, latent) in per_head.iter().enumerate() {
                        let first = h * (d.nope + d.v) + d.nope;
                        let head_out = &mut out[h * d.v..(h + 1) * d.v];
                        m.matvec_rows(first..first + d.v, latent, head_out)?;
                    }
                    stats.weight_bytes += m.stored_bytes() as u64;
                }
            }
        }
        Ok(outs)
    }
}

/// The `count` experts stacked in `{stacked}.{gate,up,down}_proj` (MLX's `switch_mlp`): gate
/// and up `[inner, width]`, down `[width, inner]`, held resident.
pub(crate) fn stacked_experts<'a>(
    artifact: &'a Artifact,
    stacked: &str,
    (width, inner, count): (usize, usize, usize),
    activation: Activation,
) -> Result<Vec<Mlp<'a>>, ArtifactError> {
    let stack = |name: &str, rows, cols| -> Result<crate::artifact::Stack<'a>, ArtifactError> {
        let s = artifact.matrix(&format!("{stacked}.{name}"), rows, cols)?;
        if s.len() != count {
            return Err(ArtifactError::Tensor {
                name: format!("{stacked}.{name}.weight"),
                reason: format!("stacks {} experts; the config has {count}", s.len()),
            });
        }
        Ok(s)
    };
    let (gate, up, down) = (
        stack("gate_proj", inner, width)?,
        stack("up_proj", inner, width)?,
        stack("down_proj", width, inner)?,
    );
    Ok((0..count)
        .filter_map(|e| {
            Some(Mlp {
                gate: gate.get(e)?,
                up: up.get(e)?,
                down: down.get(e)?,
                activation,
            })
        })
        .collect())
}

/// An expert's output for the `k`-th route of `row`: `((row, k), output)`.
type SlotOutput = ((usize, usize), Vec<f32>);

/// Which rows of a batch each chosen expert serves: `(row, k)` for the row's `k`-th route.
pub(crate) struct ExpertUsers {
    /// The chosen experts in order of first choice (row by row, each row in its router order).
    pub order: Vec<usize>,
    users: std::collections::HashMap<usize, Vec<(usize, usize)>>,
}

impl ExpertUsers {
    pub fn of(routes: &[Vec<(usize, f32)>]) -> ExpertUsers {
        let mut order = Vec::new();
        let mut users: std::collections::HashMap<usize, Vec<(usize, usize)>> =
            std::collections::HashMap::new();
        for (row, chosen) in routes.iter().enumerate() {
            for (k, &(e, _)) in chosen.iter().enumerate() {
                let served = users.entry(e).or_default();
                if served.is_empty() {
                    order.push(e);
                }
                served.push((row, k));
            }
        }
        ExpertUsers { order, users }
    }

    /// `expert` on the rows it serves: each output with its `(row, k)` slot.
    fn outputs(
        &self,
        e: usize,
        expert: &Mlp,
        input: &SharedRows,
        stats: &mut StepStats,
    ) -> Result<Vec<SlotOutput>, KernelError> {
        let served = self.users.get(&e).map_or(&[][..], Vec::as_slice);
        let rows: Vec<usize> = served.iter().map(|&(row, _)| row).collect();
        Ok(served
            .iter()
            .copied()
            .zip(expert.forward_on(input, &rows, stats)?)
            .collect())
    }

    /// Runs `expert` on the rows it serves, filling their slots of `outputs`.
    fn run(
        &self,
        e: usize,
        expert: &Mlp,
        input: &SharedRows,
        outputs: &mut [Vec<Vec<f32>>],
        stats: &mut StepStats,
    ) -> Result<(), KernelError> {
        for ((row, k), out) in self.outputs(e, expert, input, stats)? {
            outputs[row][k] = out;
        }
        Ok(())
    }
}

/// Per row of a batch, one expert output per route, in the route's order.
pub(crate) type RoutedOutputs = Vec<Vec<Vec<f32>>>;

/// A layer's routed experts: held, or read when the router picks them.
pub(crate) enum RoutedExperts<'a> {
    Resident(Vec<Mlp<'a>>),
    Streamed {
        layer: usize,
        parts: Vec<ExpertParts>,
    },
}

/// What a streamed run reads experts with: the artifact, the cache of loaded experts, and how
/// many reads may be in flight.
pub(crate) type Streaming<'a> = (&'a Artifact, &'a ExpertCache, usize);

/// Every row of `xs` through the experts its route chose: per row, one output per route, in
/// the route's order. An expert runs once for all the rows that chose it. A streamed layer's
/// chosen experts are fetched `slots` at a time (the slot pool one token's experts fill), so a
/// batch that chose many experts still holds at most that many loaded at once; `meanwhile`
/// (the shared experts' products) runs while the first ones are read, and its value is returned.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_routed<T>(
    experts: &RoutedExperts,
    activation: Activation,
    routes: &[Vec<(usize, f32)>],
    xs: &[Vec<f32>],
    streaming: Option<Streaming>,
    slots: usize,
    meanwhile: impl FnOnce(&mut StepStats) -> Result<T, ModelError>,
    stats: &mut StepStats,
) -> Result<(RoutedOutputs, T), ModelError> {
    let users = ExpertUsers::of(routes);
    let input = SharedRows::new(xs);
    let mut outputs: RoutedOutputs = routes.iter().map(|r| vec![Vec::new(); r.len()]).collect();
    let value = match (experts, streaming) {
        (RoutedExperts::Resident(held), _) => {
            if let Some(group) = held.first().and_then(|m| m.gate.int8_group()) {
                input.prepare(group);
            }
            run_resident_experts(held, &users, &input, &mut outputs, stats)?;
            meanwhile(stats)?
        }
        (RoutedExperts::Streamed { layer, parts }, Some(streaming)) => {
            let fetched = StreamedExperts {
                layer: *layer,
                parts,
                streaming,
                slots,
                activation,
            };
            fetched.run(&users, &input, &mut outputs, meanwhile, stats)?
        }
        (RoutedExperts::Streamed { .. }, None) => {
            return Err(ModelError::Artifact(ArtifactError::Tensor {
                name: "routed experts".into(),
                reason: "are streamed but the model holds no expert cache".into(),
            }));
        }
    };
    Ok((outputs, value))
}

/// The chosen held experts, each on whichever worker thread takes it: one expert's products
/// are one task instead of each product waking the other workers, and every output has the
/// bits its expert gives it on any thread (rows are computed independently).
fn run_resident_experts(
    held: &[Mlp],
    users: &ExpertUsers,
    input: &SharedRows,
    outputs: &mut RoutedOutputs,
    stats: &mut StepStats,
) -> Result<(), KernelError> {
    use rayon::prelude::*;
    let results: Vec<_> = users
        .order
        .par_iter()
        .map(|&e| {
            let expert = held.get(e).ok_or(KernelError::Length {
                what: "experts",
                expected: e + 1,
                actual: held.len(),
            })?;
            let mut own = StepStats::default();
            let outs = users.outputs(e, expert, input, &mut own)?;
            Ok::<_, KernelError>((outs, own))
        })
        .collect();
    for result in results {
        let (outs, own) = result?;
        for ((row, k), out) in outs {
            outputs[row][k] = out;
        }
        crate::generate::accumulate(stats, &own);
    }
    Ok(())
}

/// A streamed layer's chosen experts, fetched `slots` at a time.
struct StreamedExperts<'a> {
    layer: usize,
    parts: &'a [ExpertParts],
    streaming: Streaming<'a>,
    slots: usize,
    activation: Activation,
}

impl StreamedExperts<'_> {
    /// Runs the chosen experts as their reads finish, and `meanwhile` while the first ones are
    /// read (or after, when none was chosen); returns its value.
    fn run<T>(
        &self,
        users: &ExpertUsers,
        input: &SharedRows,
        outputs: &mut [Vec<Vec<f32>>],
        meanwhile: impl FnOnce(&mut StepStats) -> Result<T, ModelError>,
        stats: &mut StepStats,
    ) -> Result<T, ModelError> {
        if users.order.is_empty() {
            return meanwhile(stats);
        }
        let (artifact, cache, reads_in_flight) = self.streaming;
        let mut meanwhile = Some(meanwhile);
        let mut value = None;
        let mut meanwhile_stats = StepStats::default();
        let mut expert_stats = StepStats::default();
        let mut waited_total = Duration::ZERO;
        for chunk in users.order.chunks(self.slots.max(1)) {
            let first = meanwhile.take();
            let (out, waited) = with_fetched(
                artifact,
                cache,
                self.layer,
                self.parts,
                chunk,
                reads_in_flight,
                || first.map(|f| f(&mut meanwhile_stats)),
                |i, expert, fetch| {
                    let e = chunk[i];
                    let part = &self.parts[e];
                    expert_stats.expert_read_bytes += fetch.read_bytes;
                    expert_stats.direct_reads += fetch.direct_reads;
                    expert_stats.buffered_reads += fetch.buffered_reads;
                    match fetch.hit {
                        true => expert_stats.expert_cache_hits += 1,
                        false => expert_stats.expert_cache_misses += 1,
                    }
                    let mlp = Mlp {
                        gate: expert.gate.matrix(&part.gate)?,
                        up: expert.up.matrix(&part.up)?,
                        down: expert.down.matrix(&part.down)?,
                        activation: self.activation,
                    };
                    users.run(e, &mlp, input, outputs, &mut expert_stats)?;
                    Ok(())
                },
            )?;
            waited_total += waited;
            if let Some(out) = out {
                value = Some(out?);
            }
        }
        // The first chunk ran `meanwhile`, and there was one: the order is not empty.
        let value = value.ok_or_else(|| ArtifactError::Tensor {
            name: format!("layer {} experts", self.layer),
            reason: "no chunk of chosen experts was read".into(),
        })?;
        crate::generate::accumulate(stats, &expert_stats);
        stats.weight_bytes += meanwhile_stats.weight_bytes;
        stats.io_time += waited_total;
        Ok(value)
    }
}
