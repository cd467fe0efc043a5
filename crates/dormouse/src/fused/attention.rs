//! Causal self-attention as one op: `softmax(scale q k^T) v` for each head, the weights never
//! stored, and its backward pass, which recomputes them.
//!
//! Query `i` of a block that starts at absolute position `start` sees keys `0..=start + i`; a
//! row's scores are computed for those keys only, so the masked half of the products is never
//! done. Forward keeps each row's `log(sum(exp))` for the backward pass, which recomputes the
//! weights `p` from it and, with `g` the output's gradient and `o` the output,
//! `ds = p (g v^T - g . o)`, `dq = scale ds k`, `dk = scale ds^T q`, `dv = p^T g`.
//!
//! Each sequence is one task; within it the heads, queries and keys run in a fixed order, every
//! sum adding its terms in index order, so the bits depend on nothing but the inputs. The inner
//! loops are compiled for the widest vectors the CPU has (pulp's run-time dispatch); they are
//! separate multiplies and adds, never fused, and `exp` is [`super::vector_exp`]'s, so every
//! variant gives the same bits.

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use pulp::Simd;
use rayon::prelude::*;

use super::vector_exp::exp_in_place;
use super::{contiguous_f32, output};

/// Attention of `q [B, H, T, Dh]` (positions `start..start + T`) over `k`, `v` `[B, H, S, Dh]`,
/// returned with the heads merged: `[B, T, H x Dh]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (_, _, _, dh) = q.dims4()?;
    q.contiguous()?.apply_op3(
        &k.contiguous()?,
        &v.contiguous()?,
        CausalAttention {
            scale: 1.0 / (dh as f32).sqrt(),
            start,
            row_log_sums: OnceLock::new(),
        },
    )
}

struct CausalAttention {
    scale: f32,
    start: usize,
    /// `max + ln(sum(exp(score - max)))` of every query row, `[B, H, T]`, kept by forward.
    row_log_sums: OnceLock<Vec<f32>>,
}

/// The sizes of one call.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
}

impl Dims {
    fn of(q: &Shape, k: &Shape, v: &Shape) -> Result<Self> {
        let (&[b, h, t, dh], &[kb, kh, s, kd]) = (q.dims(), k.dims()) else {
            candle_core::bail!(
                "attention takes [B, H, T, Dh] queries and keys, not {q:?} and {k:?}"
            );
        };
        if (kb, kh, kd) != (b, h, dh) || v.dims() != k.dims() || dh == 0 {
            candle_core::bail!("attention of queries {q:?} over keys {k:?} and values {v:?}");
        }
        Ok(Dims {
            batch: b,
            heads: h,
            queries: t,
            keys: s,
            head_dim: dh,
        })
    }

    /// Elements of one sequence's queries, and of its keys.
    fn per_sequence(&self) -> (usize, usize) {
        let h = self.heads * self.head_dim;
        (h * self.queries, h * self.keys)
    }
}

impl CausalAttention {
    /// Keys query `i` of the block sees.
    fn visible(&self, query: usize, keys: usize) -> usize {
        (self.start + query + 1).min(keys)
    }
}

/// Vectors summed side by side: independent sums keep the adder busy where one sum would
/// wait for each add before the next.
const BLOCKS: usize = 4;

/// Key strides are padded to a multiple of this, so a group of [`BLOCKS`] of the widest
/// vectors (16 lanes) never reads past a row.
const KEY_PADDING: usize = BLOCKS * 16;

/// `[rows, cols]` to `[cols, stride]` (`stride >= rows`; the padding is left as it is).
#[inline(always)]
fn transpose_into(dst: &mut [f32], src: &[f32], cols: usize, stride: usize) {
    for (r, row) in src.chunks_exact(cols).enumerate() {
        for (c, &value) in row.iter().enumerate() {
            dst[c * stride + r] = value;
        }
    }
}

#[inline(always)]
fn load<S: Simd>(values: &[f32]) -> S::f32s {
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(&values[..S::F32_LANES]))
}

/// `N` vectors of sums: `acc[b] += coef(j) rows[j][offset + b x lanes..]` for `j` in `range`
/// in order, `rows` `row_stride` apart. Multiplies and adds are separate roundings, so a lane
/// gets the same bits at every vector width.
#[inline(always)]
fn blocked_sums<S: Simd, const N: usize>(
    simd: S,
    rows: &[f32],
    (row_stride, offset): (usize, usize),
    range: std::ops::Range<usize>,
    coef: impl Fn(usize) -> f32,
) -> [S::f32s; N] {
    let lanes = S::F32_LANES;
    let mut acc = [simd.splat_f32s(0.0); N];
    for j in range {
        let c = simd.splat_f32s(coef(j));
        let row = &rows[j * row_stride + offset..][..N * lanes];
        for (b, acc) in acc.iter_mut().enumerate() {
            *acc = simd.add_f32s(*acc, simd.mul_f32s(c, load::<S>(&row[b * lanes..])));
        }
    }
    acc
}

/// `out[j] = sum over d of x[d] m_t[d][j]` for every `j < out.len()`, with `m_t` a matrix
/// transposed to `[x.len(), stride]`, `stride` a multiple of [`KEY_PADDING`] (so the last
/// group may read padding). Each output sums its terms in order of `d`.
#[inline(always)]
fn products_transposed<S: Simd>(simd: S, out: &mut [f32], x: &[f32], m_t: &[f32], stride: usize) {
    let width = BLOCKS * S::F32_LANES;
    for (group, out) in out.chunks_mut(width).enumerate() {
        let acc =
            blocked_sums::<S, BLOCKS>(simd, m_t, (stride, group * width), 0..x.len(), |d| x[d]);
        for (o, a) in out.iter_mut().zip(bytemuck::cast_slice::<_, f32>(&acc)) {
            *o = *a;
        }
    }
}

/// `out[c] += sum over j of coef(j) rows[j][c]` for the `rows` (each `out.len()` long) whose
/// index is in `range`, every output summing its terms in order of `j`.
#[inline(always)]
fn add_combination<S: Simd>(
    simd: S,
    out: &mut [f32],
    rows: &[f32],
    range: std::ops::Range<usize>,
    coef: impl Fn(usize) -> f32,
) {
    let (width, lanes) = (out.len(), S::F32_LANES);
    let mut at = 0;
    while width - at >= lanes {
        let place = (width, at);
        let added = match (width - at) / lanes {
            1 => add_to(
                &mut out[at..],
                &blocked_sums::<S, 1>(simd, rows, place, range.clone(), &coef),
            ),
            2 => add_to(
                &mut out[at..],
                &blocked_sums::<S, 2>(simd, rows, place, range.clone(), &coef),
            ),
            3 => add_to(
                &mut out[at..],
                &blocked_sums::<S, 3>(simd, rows, place, range.clone(), &coef),
            ),
            _ => add_to(
                &mut out[at..],
                &blocked_sums::<S, BLOCKS>(simd, rows, place, range.clone(), &coef),
            ),
        };
        at += added;
    }
    for j in range {
        let c = coef(j);
        for (o, &r) in out[at..]
            .iter_mut()
            .zip(&rows[j * width + at..(j + 1) * width])
        {
            *o += c * r;
        }
    }
}

/// Adds the vectors `acc` to the front of `out`; returns how many elements that was.
#[inline(always)]
fn add_to<V: bytemuck::Pod>(out: &mut [f32], acc: &[V]) -> usize {
    let values = bytemuck::cast_slice::<_, f32>(acc);
    for (o, a) in out.iter_mut().zip(values) {
        *o += *a;
    }
    values.len()
}

/// One sequence's work, run through pulp's dispatch so that the loops of the methods it
/// inlines are compiled for the widest vector instructions this CPU has.
enum SequenceTask<'a> {
    Forward {
        op: &'a CausalAttention,
        dims: Dims,
        out: &'a mut [f32],
        log_sums: &'a mut [f32],
        inputs: [&'a [f32]; 3],
    },
    Backward {
        op: &'a CausalAttention,
        dims: Dims,
        grads: [&'a mut [f32]; 3],
        inputs: [&'a [f32]; 5],
        log_sums: &'a [f32],
    },
}

impl pulp::WithSimd for SequenceTask<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        match self {
            SequenceTask::Forward {
                op,
                dims,
                out,
                log_sums,
                inputs: [q, k, v],
            } => op.forward_sequence(simd, dims, out, log_sums, q, k, v),
            SequenceTask::Backward {
                op,
                dims,
                grads,
                inputs,
                log_sums,
            } => op.backward_sequence(simd, dims, grads, inputs, log_sums),
        }
    }
}

impl CustomOp3 for CausalAttention {
    fn name(&self) -> &'static str {
        "causal-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = Dims::of(ql.shape(), kl.shape(), vl.shape())?;
        let (q, k, v) = (
            contiguous_f32(self.name(), qs, ql)?,
            contiguous_f32(self.name(), ks, kl)?,
            contiguous_f32(self.name(), vs, vl)?,
        );
        let (q_len, k_len) = dims.per_sequence();
        let mut out = vec![0f32; q.len()];
        let mut log_sums = vec![0f32; dims.batch * dims.heads * dims.queries];
        out.par_chunks_mut(q_len)
            .zip(log_sums.par_chunks_mut(dims.heads * dims.queries))
            .zip(
                q.par_chunks(q_len)
                    .zip(k.par_chunks(k_len).zip(v.par_chunks(k_len))),
            )
            .for_each(|((out, log_sums), (q, (k, v)))| {
                pulp::Arch::new().dispatch(SequenceTask::Forward {
                    op: self,
                    dims,
                    out,
                    log_sums,
                    inputs: [q, k, v],
                })
            });
        // A second forward of the same op (never done by candle) would keep the first sums.
        let _ = self.row_log_sums.set(log_sums);
        let (b, h, t, dh) = (dims.batch, dims.heads, dims.queries, dims.head_dim);
        Ok(output(out, &Shape::from((b, t, h * dh))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(log_sums) = self.row_log_sums.get() else {
            candle_core::bail!("the attention's backward pass ran before its forward pass");
        };
        let dims = Dims::of(q.shape(), k.shape(), v.shape())?;
        let [q, k, v, out, grad] = [q, k, v, out, grad].map(|t| t.contiguous());
        let (q, k, v, out, grad) = (q?, k?, v?, out?, grad?);
        let grads = self.backward(dims, log_sums, [&q, &k, &v, &out, &grad])?;
        let [dq, dk, dv] = grads.map(Some);
        Ok((dq, dk, dv))
    }
}

impl CausalAttention {
    /// One sequence: `out` `[T, H x Dh]`, `log_sums` `[H, T]`, `q` `[H, T, Dh]`, `k`, `v`
    /// `[H, S, Dh]`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn forward_sequence<S: Simd>(
        &self,
        simd: S,
        dims: Dims,
        out: &mut [f32],
        log_sums: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) {
        let Dims {
            heads,
            queries,
            keys,
            head_dim: dh,
            ..
        } = dims;
        let stride = keys.next_multiple_of(KEY_PADDING);
        let mut keys_t = vec![0f32; dh * stride];
        let mut scores = vec![0f32; stride];
        for head in 0..heads {
            let (q, k, v) = (
                &q[head * queries * dh..][..queries * dh],
                &k[head * keys * dh..][..keys * dh],
                &v[head * keys * dh..][..keys * dh],
            );
            transpose_into(&mut keys_t, k, dh, stride);
            for (i, query) in q.chunks_exact(dh).enumerate() {
                let n = self.visible(i, keys);
                products_transposed(simd, &mut scores[..n], query, &keys_t, stride);
                let p = &mut scores[..n];
                let max = p
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &s| m.max(s * self.scale));
                for s in p.iter_mut() {
                    *s = *s * self.scale - max;
                }
                exp_in_place(simd, p);
                let total: f32 = p.iter().sum();
                let o = &mut out[i * heads * dh + head * dh..][..dh];
                add_combination(simd, o, v, 0..n, |j| p[j]);
                for o in o.iter_mut() {
                    *o /= total;
                }
                log_sums[head * queries + i] = max + total.ln();
            }
        }
    }

    /// `(dq, dk, dv)` from `q`, `k`, `v`, the output and its gradient.
    fn backward(&self, dims: Dims, log_sums: &[f32], inputs: [&Tensor; 5]) -> Result<[Tensor; 3]> {
        let storages = inputs.map(|t| t.storage_and_layout());
        let mut slices = Vec::with_capacity(5);
        for (storage, layout) in &storages {
            let candle_core::Storage::Cpu(cpu) = &**storage else {
                candle_core::bail!("the attention op runs on the CPU");
            };
            slices.push(contiguous_f32(self.name(), cpu, layout)?);
        }
        let [q, k, v, out, grad] = [slices[0], slices[1], slices[2], slices[3], slices[4]];
        let (q_len, k_len) = dims.per_sequence();
        let (mut dq, mut dk, mut dv) = (
            vec![0f32; q.len()],
            vec![0f32; k.len()],
            vec![0f32; v.len()],
        );
        dq.par_chunks_mut(q_len)
            .zip(dk.par_chunks_mut(k_len).zip(dv.par_chunks_mut(k_len)))
            .zip(
                q.par_chunks(q_len)
                    .zip(k.par_chunks(k_len).zip(v.par_chunks(k_len))),
            )
            .zip(out.par_chunks(q_len).zip(grad.par_chunks(q_len)))
            .zip(log_sums.par_chunks(dims.heads * dims.queries))
            .for_each(|((((dq, (dk, dv)), (q, (k, v))), (out, grad)), log_sums)| {
                pulp::Arch::new().dispatch(SequenceTask::Backward {
                    op: self,
                    dims,
                    grads: [dq, dk, dv],
                    inputs: [q, k, v, out, grad],
                    log_sums,
                })
            });
        let device = inputs[0].device();
        Ok([
            Tensor::from_vec(dq, inputs[0].shape(), device)?,
            Tensor::from_vec(dk, inputs[1].shape(), device)?,
            Tensor::from_vec(dv, inputs[2].shape(), device)?,
        ])
    }

    #[inline(always)]
    fn backward_sequence<S: Simd>(
        &self,
        simd: S,
        dims: Dims,
        [dq, dk, dv]: [&mut [f32]; 3],
        [q, k, v, out, grad]: [&[f32]; 5],
        log_sums: &[f32],
    ) {
        let Dims {
            heads,
            queries,
            keys,
            head_dim: dh,
            ..
        } = dims;
        let stride = keys.next_multiple_of(KEY_PADDING);
        let (mut keys_t, mut values_t) = (vec![0f32; dh * stride], vec![0f32; dh * stride]);
        // Every query row's weights and score gradients, 0 past the keys it sees.
        let (mut p, mut ds) = (vec![0f32; queries * stride], vec![0f32; queries * stride]);
        let (mut g, mut o) = (vec![0f32; queries * dh], vec![0f32; queries * dh]);
        for head in 0..heads {
            let at_q = head * queries * dh;
            let at_k = head * keys * dh;
            let q = &q[at_q..][..queries * dh];
            let (k, v) = (&k[at_k..][..keys * dh], &v[at_k..][..keys * dh]);
            for (i, (g, o)) in g
                .chunks_exact_mut(dh)
                .zip(o.chunks_exact_mut(dh))
                .enumerate()
            {
                let at = i * heads * dh + head * dh;
                g.copy_from_slice(&grad[at..at + dh]);
                o.copy_from_slice(&out[at..at + dh]);
            }
            transpose_into(&mut keys_t, k, dh, stride);
            transpose_into(&mut values_t, v, dh, stride);
            for i in 0..queries {
                let n = self.visible(i, keys);
                let (query, g_i) = (&q[i * dh..(i + 1) * dh], &g[i * dh..(i + 1) * dh]);
                let p = &mut p[i * stride..][..n];
                products_transposed(simd, p, query, &keys_t, stride);
                let log_sum = log_sums[head * queries + i];
                for s in p.iter_mut() {
                    *s = *s * self.scale - log_sum;
                }
                exp_in_place(simd, p);
                let ds = &mut ds[i * stride..][..n];
                products_transposed(simd, ds, g_i, &values_t, stride);
                let o_i = &o[i * dh..(i + 1) * dh];
                let g_dot_o: f32 = g_i.iter().zip(o_i).map(|(g, o)| g * o).sum();
                for (ds, &p) in ds.iter_mut().zip(p.iter()) {
                    *ds = p * (*ds - g_dot_o) * self.scale;
                }
                let ds = &ds[..];
                add_combination(simd, &mut dq[at_q + i * dh..][..dh], k, 0..n, |j| ds[j]);
            }
            let dk = &mut dk[at_k..][..keys * dh];
            let dv = &mut dv[at_k..][..keys * dh];
            for j in 0..keys {
                // The first query that sees key j.
                let first = j.saturating_sub(self.start).min(queries);
                let (ds, p) = (&ds, &p);
                add_combination(
                    simd,
                    &mut dk[j * dh..(j + 1) * dh],
                    q,
                    first..queries,
                    |i| ds[i * stride + j],
                );
                add_combination(
                    simd,
                    &mut dv[j * dh..(j + 1) * dh],
                    &g,
                    first..queries,
                    |i| p[i * stride + j],
                );
            }
        }
    }
}
