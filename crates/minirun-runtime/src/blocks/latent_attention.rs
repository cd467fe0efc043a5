//! Multi-head latent attention (DeepSeek-V3, Kimi K3's MLA layers).

use crate::blocks::products::apply_batch;
use crate::engine::decode_policy::LayerState;
use minirun_kernels::{Format, KernelError, QMatrix};
use minirun_stream::artifact::{ArtifactError, Stack};
use minirun_stream::matrix::Matrix;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

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
        embed_q: Matrix<'a>,
        unembed_out: Matrix<'a>,
    },
    /// Hugging Face: `[heads * (nope + v), kv_lora]`; head h's key rows come first.
    Whole(Matrix<'a>),
}

/// `run(h)` for every head `h`, heads on whichever worker takes them: a head's projection is
/// too small to be worth splitting between threads (each split wakes the other workers), and
/// sixteen of them are not. Each head's outputs are computed as they would be alone.
fn each_head<T: Send>(
    heads: usize,
    stats: &mut StepStats,
    run: impl Fn(usize, &mut StepStats) -> Result<T, ModelError> + Sync,
) -> Result<Vec<T>, ModelError> {
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
        stats.add(&own);
        outs.push(out);
    }
    Ok(outs)
}

fn head<'a>(stack: &Stack<'a>, h: usize) -> Result<QMatrix<'a>, KernelError> {
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
    ) -> Result<Vec<Vec<Vec<f32>>>, ModelError> {
        let width = d.nope + d.rope;
        let mut q_latents = vec![Vec::with_capacity(d.heads); qs.len()];
        match self {
            LatentProjections::Split { embed_q, .. } => {
                let per_head = embed_q.with_stack(|embed_q| {
                    each_head(d.heads, stats, |h, stats| {
                        let rows: Vec<Vec<f32>> = qs
                            .iter()
                            .map(|q| q[h * width..h * width + d.nope].to_vec())
                            .collect();
                        apply_batch(&head(embed_q, h)?, &rows, stats)
                    })
                })?;
                for latents in per_head {
                    for (t, latent) in latents.into_iter().enumerate() {
                        q_latents[t].push(latent);
                    }
                }
            }
            LatentProjections::Whole(m) => m.with(|m| {
                for (q, per_head) in qs.iter().zip(&mut q_latents) {
                    for h in 0..d.heads {
                        let first = h * (d.nope + d.v);
                        let mut latent = vec![0f32; d.lora];
                        let q_nope = &q[h * width..h * width + d.nope];
                        m.vecmat_rows(first..first + d.nope, q_nope, &mut latent)?;
                        per_head.push(latent);
                    }
                }
                Ok::<_, KernelError>(())
            })?,
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
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut outs = vec![vec![0f32; d.heads * d.v]; mixed.len()];
        match self {
            LatentProjections::Split { unembed_out, .. } => {
                let per_head = unembed_out.with_stack(|unembed_out| {
                    each_head(d.heads, stats, |h, stats| {
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
                    })
                })?;
                for (h, head_outs) in per_head.into_iter().enumerate() {
                    for (out, head_out) in outs.iter_mut().zip(head_outs) {
                        out[h * d.v..(h + 1) * d.v].copy_from_slice(&head_out);
                    }
                }
            }
            LatentProjections::Whole(m) => m.with(|m| {
                for (out, per_head) in outs.iter_mut().zip(mixed) {
                    for (h, latent) in per_head.iter().enumerate() {
                        let first = h * (d.nope + d.v) + d.nope;
                        let head_out = &mut out[h * d.v..(h + 1) * d.v];
                        m.matvec_rows(first..first + d.v, latent, head_out)?;
                    }
                    stats.weight_bytes += m.stored_bytes() as u64;
                }
                Ok::<_, KernelError>(())
            })?,
        }
        Ok(outs)
    }
}

impl<'w> LatentProjections<'w> {
    /// MLX's per-head `embed_q` (`[heads, lora, nope]`) and `unembed_out` (`[heads, v, lora]`)
    /// under `w`'s prefix.
    pub fn split(
        w: &Weights<'w>,
        dims: LatentDims,
    ) -> Result<LatentProjections<'w>, ArtifactError> {
        let LatentDims {
            heads,
            nope,
            v,
            lora,
            ..
        } = dims;
        let embed_q = w.stack("embed_q", lora, nope)?;
        let unembed_out = w.stack("unembed_out", v, lora)?;
        for (s, name) in [(&embed_q, "embed_q"), (&unembed_out, "unembed_out")] {
            if s.len() != heads {
                return Err(ArtifactError::Tensor {
                    name: w.name(&format!("{name}.weight")),
                    reason: format!("holds {} heads; num_attention_heads is {heads}", s.len()),
                });
            }
        }
        Ok(LatentProjections::Split {
            embed_q,
            unembed_out,
        })
    }

    /// The Hugging Face layout's whole `kv_b_proj` (`[heads * (nope + v), lora]`) under `w`'s
    /// prefix. An MLX-quantized one is refused: mlx-lm splits it and quantizes the halves again
    /// along other axes, so it would compute with other weights than these.
    pub fn whole(
        w: &Weights<'w>,
        dims: LatentDims,
    ) -> Result<LatentProjections<'w>, ArtifactError> {
        let rows = dims.heads * (dims.nope + dims.v);
        let m = w.matrix("kv_b_proj", rows, dims.lora)?;
        if matches!(m.format(), Format::Affine { .. } | Format::Mxfp4) {
            return Err(ArtifactError::Tensor {
                name: w.name("kv_b_proj.weight"),
                reason: "is MLX-quantized in the Hugging Face layout; mlx-lm would re-quantize it as embed_q/unembed_out, so its result is not defined by the checkpoint. Convert with mlx-lm (which writes embed_q/unembed_out) and pack that, or store kv_b_proj unquantized".into(),
            });
        }
        Ok(LatentProjections::Whole(m))
    }
}

/// One layer's latent KV cache: per position, the normalised latent and the positional key.
#[derive(Debug, Clone, Default)]
pub struct LatentCache {
    pub latent: Vec<f32>,
    pub key: Vec<f32>,
    positions: usize,
}

impl LatentCache {
    /// One position's latent and key, after the others.
    pub fn push(&mut self, latent: &[f32], key: &[f32]) {
        self.latent.extend_from_slice(latent);
        self.key.extend_from_slice(key);
        self.positions += 1;
    }
}

impl LayerState for LatentCache {
    /// Back to the first `len` positions: a latent cache only appends, so it can always be
    /// cut back.
    fn cut_back(&mut self, len: usize) -> bool {
        if len >= self.positions {
            return true;
        }
        let latent_width = self.latent.len() / self.positions;
        let key_width = self.key.len() / self.positions;
        self.latent.truncate(len * latent_width);
        self.key.truncate(len * key_width);
        self.positions = len;
        true
    }
}
