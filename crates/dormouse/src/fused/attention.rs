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
//! sum adding its terms in a fixed order ([`super::lanes`] for a row's sums), so the bits depend on nothing but the inputs. The inner
//! loops are compiled for the widest vectors the CPU has (pulp's run-time dispatch); their sums
//! are [`super::tile`]'s fused multiply-adds and `exp` is [`super::vector_exp`]'s, so every
//! variant gives the same bits.

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use pulp::Simd;
use rayon::prelude::*;

use super::lanes;
use super::tile::{KEY_PADDING, row_sums, row_sums_of, transpose_into};
use super::vector_exp::exp_in_place;
use super::{contiguous_f32, output, with_f32s, zeros};

/// Attention of `q [B, H, T, Dh]` (positions `start..start + T`) over `k`, `v` `[B, H, S, Dh]`,
/// returned with the heads merged: `[B, T, H x Dh]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (_, _, _, dh) = q.dims4()?;
    q.contiguous()?.apply_op3(
        &k.contiguous()?,
        &v.contiguous()?,
        CausalAttention::new(dh, start),
    )
}

/// The op [`causal_attention`] applies to heads of `head_dim` from position 0, for a caller
/// that runs its backward pass itself (the op keeps what that pass reads).
pub(crate) fn attention_op(head_dim: usize) -> Box<dyn CustomOp3 + Send + Sync> {
    Box::new(CausalAttention::new(head_dim, 0))
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
        let empty = [h, t, s, dh].contains(&0);
        if (kb, kh, kd) != (b, h, dh) || v.dims() != k.dims() || empty {
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

/// Query rows (and in the backward pass key rows) a tile computes at once.
const ROWS: usize = 4;

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
        let mut out = zeros(q.len());
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
        let grads = self.backward(dims, log_sums, [q, k, v, out, grad])?;
        let [dq, dk, dv] = grads.map(Some);
        Ok((dq, dk, dv))
    }
}

impl CausalAttention {
    fn new(head_dim: usize, start: usize) -> Self {
        CausalAttention {
            scale: 1.0 / (head_dim as f32).sqrt(),
            start,
            row_log_sums: OnceLock::new(),
        }
    }

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
        let mut weights = vec![0f32; ROWS * stride];
        for head in 0..heads {
            let head_rows = HeadRows {
                q: &q[head * queries * dh..][..queries * dh],
                k: &k[head * keys * dh..][..keys * dh],
                v: &v[head * keys * dh..][..keys * dh],
                keys_t: &mut keys_t,
                stride,
            };
            transpose_into(head_rows.keys_t, head_rows.k, dh, stride);
            let mut first = 0;
            while first < queries {
                let rows = Rows {
                    first,
                    out: &mut *out,
                    log_sums: &mut log_sums[head * queries..(head + 1) * queries],
                    weights: &mut weights,
                    head,
                };
                if queries - first >= ROWS {
                    self.forward_rows::<S, ROWS>(simd, dims, &head_rows, rows);
                    first += ROWS;
                } else {
                    self.forward_rows::<S, 1>(simd, dims, &head_rows, rows);
                    first += 1;
                }
            }
        }
    }

    /// Query rows `first..first + R` of one head: their weights, outputs and log-sums.
    #[inline(always)]
    fn forward_rows<S: Simd, const R: usize>(
        &self,
        simd: S,
        dims: Dims,
        head_rows: &HeadRows<'_>,
        rows: Rows<'_>,
    ) {
        let Dims {
            heads,
            keys,
            head_dim: dh,
            ..
        } = dims;
        let HeadRows { q, v, stride, .. } = *head_rows;
        let Rows {
            first,
            out,
            log_sums,
            weights,
            head,
        } = rows;
        let seen = |r: usize| self.visible(first + r, keys);
        let widest = seen(R - 1);
        let lanes = S::F32_LANES;
        row_sums::<S, R>(
            simd,
            head_rows.keys_t,
            (stride, widest.next_multiple_of(lanes)),
            0..dh,
            |r, d| q[(first + r) * dh + d],
            |r, at, sums| weights[r * stride + at..][..sums.len()].copy_from_slice(sums),
        );
        let mut totals = [0f32; R];
        for (r, total) in totals.iter_mut().enumerate() {
            let p = &mut weights[r * stride..][..seen(r)];
            for s in p.iter_mut() {
                *s *= self.scale;
            }
            let max = lanes::max(p);
            for s in p.iter_mut() {
                *s -= max;
            }
            exp_in_place(simd, p);
            *total = lanes::sum(p);
            log_sums[first + r] = max + total.ln();
            // The keys this row does not see weigh nothing in the tile's sums.
            weights[r * stride + seen(r)..r * stride + widest].fill(0.0);
        }
        let weights = &*weights;
        row_sums::<S, R>(
            simd,
            v,
            (dh, dh),
            0..widest,
            |r, j| weights[r * stride + j],
            |r, at, sums| {
                let o = &mut out[(first + r) * heads * dh + head * dh + at..][..sums.len()];
                for (o, &s) in o.iter_mut().zip(sums) {
                    *o = s / totals[r];
                }
            },
        );
    }

    /// `(dq, dk, dv)` from `q`, `k`, `v`, the output and its gradient.
    fn backward(&self, dims: Dims, log_sums: &[f32], inputs: [&Tensor; 5]) -> Result<[Tensor; 3]> {
        let (dq, dk, dv) = with_f32s(self.name(), inputs, |[q, k, v, out, grad]| {
            let (q_len, k_len) = dims.per_sequence();
            let (mut dq, mut dk, mut dv) = (zeros(q.len()), zeros(k.len()), zeros(v.len()));
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
            Ok((dq, dk, dv))
        })?;
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
        let lanes = S::F32_LANES;
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
            let dq = &mut dq[at_q..][..queries * dh];
            let mut first = 0;
            while first < queries {
                let r = (queries - first).min(ROWS);
                let seen = |r: usize| self.visible(first + r, keys);
                let widest = seen(r - 1).next_multiple_of(lanes);
                // Scores (from the queries and the keys) into p, and the weights' gradients
                // before the softmax (from the output's gradient and the values) into ds.
                for (m_t, x, sums) in [(&keys_t, q, &mut p), (&values_t, &g[..], &mut ds)] {
                    row_sums_of(
                        simd,
                        r,
                        m_t,
                        (stride, widest),
                        0..dh,
                        |row, d| x[(first + row) * dh + d],
                        |row, at, values| {
                            sums[(first + row) * stride + at..][..values.len()]
                                .copy_from_slice(values)
                        },
                    );
                }
                for row in 0..r {
                    let i = first + row;
                    let n = seen(row);
                    let log_sum = log_sums[head * queries + i];
                    let p = &mut p[i * stride..][..keys];
                    for s in p[..n].iter_mut() {
                        *s = *s * self.scale - log_sum;
                    }
                    exp_in_place(simd, &mut p[..n]);
                    p[n..].fill(0.0);
                    let (g_i, o_i) = (&g[i * dh..(i + 1) * dh], &o[i * dh..(i + 1) * dh]);
                    let g_dot_o = lanes::dot(g_i, o_i);
                    let ds = &mut ds[i * stride..][..keys];
                    for (ds, &p) in ds[..n].iter_mut().zip(p.iter()) {
                        *ds = p * (*ds - g_dot_o) * self.scale;
                    }
                    ds[n..].fill(0.0);
                }
                let ds = &ds;
                row_sums_of(
                    simd,
                    r,
                    k,
                    (dh, dh),
                    0..seen(r - 1),
                    |row, j| ds[(first + row) * stride + j],
                    |row, at, sums| {
                        dq[(first + row) * dh + at..][..sums.len()].copy_from_slice(sums)
                    },
                );
                first += r;
            }
            let dk = &mut dk[at_k..][..keys * dh];
            let dv = &mut dv[at_k..][..keys * dh];
            let mut j0 = 0;
            while j0 < keys {
                let r = (keys - j0).min(ROWS);
                // The first query that sees key j0 (later keys are seen by fewer queries, and
                // the rows of the ones that do not see them hold 0).
                let seen_from = j0.saturating_sub(self.start).min(queries);
                for (rows, coefs, grads) in [(q, &ds, &mut *dk), (&g[..], &p, &mut *dv)] {
                    row_sums_of(
                        simd,
                        r,
                        rows,
                        (dh, dh),
                        seen_from..queries,
                        |row, i| coefs[i * stride + j0 + row],
                        |row, at, sums| {
                            grads[(j0 + row) * dh + at..][..sums.len()].copy_from_slice(sums)
                        },
                    );
                }
                j0 += r;
            }
        }
    }
}

/// One head's inputs in a forward pass.
struct HeadRows<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    keys_t: &'a mut [f32],
    stride: usize,
}

/// Where a group of query rows of one head writes.
struct Rows<'a> {
    first: usize,
    out: &'a mut [f32],
    log_sums: &'a mut [f32],
    weights: &'a mut [f32],
    head: usize,
}
