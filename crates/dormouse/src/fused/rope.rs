//! Rotary position embedding fused with the split into heads, and its backward pass.
//!
//! Forward: a projection's output `[B, T, H x Dh]` becomes the rotated heads `[B, H, T, Dh]`,
//! the two halves of each head turned by the angle of its absolute position (rotate-half
//! convention): `(x1 cos - x2 sin, x2 cos + x1 sin)`. A rotation's transpose is the rotation by
//! the opposite angle, so the backward pass turns the gradient back with `sin` negated and
//! merges the heads again.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous_f32, output, zeros};

/// `cos` and `sin` of every (position, frequency), `[positions, head_dim / 2]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeTables {
    /// The tables of `cos` and `sin` `[positions, head_dim / 2]` tensors.
    pub fn new(cos: &Tensor, sin: &Tensor) -> Result<Self> {
        let (_, half) = cos.dims2()?;
        if cos.dims() != sin.dims() || half == 0 {
            candle_core::bail!(
                "RoPE tables of shapes {:?} and {:?}",
                cos.dims(),
                sin.dims()
            );
        }
        Ok(RopeTables {
            cos: cos.flatten_all()?.to_vec1()?,
            sin: sin.flatten_all()?.to_vec1()?,
            half,
        })
    }

    pub fn head_dim(&self) -> usize {
        2 * self.half
    }

    pub fn positions(&self) -> usize {
        self.cos.len() / self.half
    }

    /// The `(cos, sin)` rows of `position`.
    fn angle(&self, position: usize) -> Result<(&[f32], &[f32])> {
        let range = position * self.half..(position + 1) * self.half;
        match (self.cos.get(range.clone()), self.sin.get(range)) {
            (Some(cos), Some(sin)) => Ok((cos, sin)),
            _ => candle_core::bail!("position {position} is past the RoPE tables"),
        }
    }

    /// Rotates every head of `x` (heads back to back) for `position`.
    pub fn rotate(&self, x: &mut [f32], position: usize) -> Result<()> {
        let (cos, sin) = self.angle(position)?;
        for head in x.chunks_exact_mut(self.head_dim()) {
            let (x1, x2) = head.split_at_mut(self.half);
            for i in 0..self.half {
                (x1[i], x2[i]) = turn(x1[i], x2[i], cos[i], sin[i]);
            }
        }
        Ok(())
    }

    /// Writes one head `src` into `dst`, rotated for `position` (by the opposite angle when
    /// `inverse`).
    fn rotate_into(
        &self,
        dst: &mut [f32],
        src: &[f32],
        position: usize,
        inverse: bool,
    ) -> Result<()> {
        let (cos, sin) = self.angle(position)?;
        let (d1, d2) = dst.split_at_mut(self.half);
        let (s1, s2) = src.split_at(self.half);
        for i in 0..self.half {
            let s = if inverse { -sin[i] } else { sin[i] };
            (d1[i], d2[i]) = turn(s1[i], s2[i], cos[i], s);
        }
        Ok(())
    }
}

/// The pair `(a, b)` turned by the angle of `(cos, sin)`: `(a cos - b sin, b cos + a sin)`.
#[inline(always)]
fn turn(a: f32, b: f32, cos: f32, sin: f32) -> (f32, f32) {
    (a * cos - b * sin, b * cos + a * sin)
}

/// `x [B, T, heads x Dh]` for positions `start..start + T` to rotated heads `[B, heads, T, Dh]`.
pub fn rope_heads(
    x: &Tensor,
    tables: &Arc<RopeTables>,
    heads: usize,
    start: usize,
) -> Result<Tensor> {
    x.contiguous()?.apply_op1(RopeHeads {
        tables: Arc::clone(tables),
        heads,
        start,
        rotate: true,
    })
}

/// The op [`rope_heads`] (`rotate`) or [`split_heads`] (not) applies for positions from 0,
/// for a caller that runs its backward pass itself.
pub(crate) fn heads_op(
    tables: &Arc<RopeTables>,
    heads: usize,
    rotate: bool,
) -> Box<dyn CustomOp1 + Send + Sync> {
    Box::new(RopeHeads {
        tables: Arc::clone(tables),
        heads,
        start: 0,
        rotate,
    })
}

/// `x [B, T, heads x Dh]` to heads `[B, heads, T, Dh]` without rotating them (the values of
/// attention): one node, where a reshape, a transpose and a copy are three. `Dh` is the
/// tables' head size.
pub fn split_heads(x: &Tensor, tables: &Arc<RopeTables>, heads: usize) -> Result<Tensor> {
    x.contiguous()?.apply_op1(RopeHeads {
        tables: Arc::clone(tables),
        heads,
        start: 0,
        rotate: false,
    })
}

struct RopeHeads {
    tables: Arc<RopeTables>,
    heads: usize,
    start: usize,
    /// False: only split (or merge) the heads.
    rotate: bool,
}

impl RopeHeads {
    /// Writes one head `src` into `dst`: rotated for `position` if the op rotates (by the
    /// opposite angle when `inverse`), else copied.
    fn place(&self, dst: &mut [f32], src: &[f32], position: usize, inverse: bool) -> Result<()> {
        if self.rotate {
            self.tables.rotate_into(dst, src, position, inverse)
        } else {
            dst.copy_from_slice(src);
            Ok(())
        }
    }
}

impl RopeHeads {
    /// `(B, T, Dh)` of the merged layout `[B, T, heads x Dh]`.
    fn check(&self, shape: &Shape, merged: bool) -> Result<(usize, usize, usize)> {
        let dh = self.tables.head_dim();
        let dims = shape.dims();
        let (b, t) = match (merged, dims) {
            (true, &[b, t, d]) if d == self.heads * dh => (b, t),
            (false, &[b, h, t, d]) if h == self.heads && d == dh => (b, t),
            _ => candle_core::bail!(
                "RoPE over {} heads of {dh}: an input of shape {dims:?}",
                self.heads
            ),
        };
        if t == 0 || self.heads == 0 {
            candle_core::bail!("RoPE over {} heads: an input of shape {dims:?}", self.heads);
        }
        if self.start + t > self.tables.positions() {
            candle_core::bail!(
                "positions up to {} are past the RoPE tables ({})",
                self.start + t,
                self.tables.positions()
            );
        }
        Ok((b, t, dh))
    }
}

impl CustomOp1 for RopeHeads {
    fn name(&self) -> &'static str {
        "rope-heads"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, t, dh) = self.check(layout.shape(), true)?;
        let x = contiguous_f32(self.name(), storage, layout)?;
        let d = self.heads * dh;
        let mut out = zeros(x.len());
        // One (sequence, head) per task: its [T, Dh] block of the output is contiguous.
        out.par_chunks_mut(t * dh)
            .enumerate()
            .try_for_each(|(block, out)| {
                let (seq, head) = (block / self.heads, block % self.heads);
                for (pos, out) in out.chunks_mut(dh).enumerate() {
                    let at = (seq * t + pos) * d + head * dh;
                    self.place(out, &x[at..at + dh], self.start + pos, false)?;
                }
                Ok::<_, candle_core::Error>(())
            })?;
        Ok(output(out, &Shape::from((b, self.heads, t, dh))))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = UnropeHeads {
            inner: RopeHeads {
                tables: Arc::clone(&self.tables),
                heads: self.heads,
                start: self.start,
                rotate: self.rotate,
            },
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&op)?))
    }
}

/// The gradient `[B, heads, T, Dh]` turned back and merged to `[B, T, heads x Dh]`.
struct UnropeHeads {
    inner: RopeHeads,
}

impl CustomOp1 for UnropeHeads {
    fn name(&self) -> &'static str {
        "rope-heads-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let RopeHeads { heads, start, .. } = &self.inner;
        let (b, t, dh) = self.inner.check(layout.shape(), false)?;
        let grad = contiguous_f32(self.name(), storage, layout)?;
        let d = heads * dh;
        let mut out = zeros(grad.len());
        // One (sequence, position) row of the merged layout per task.
        out.par_chunks_mut(d)
            .enumerate()
            .try_for_each(|(row, out)| {
                let (seq, pos) = (row / t, row % t);
                for (head, out) in out.chunks_mut(dh).enumerate() {
                    let at = ((seq * heads + head) * t + pos) * dh;
                    self.inner
                        .place(out, &grad[at..at + dh], start + pos, true)?;
                }
                Ok::<_, candle_core::Error>(())
            })?;
        Ok(output(out, &Shape::from((b, t, d))))
    }
}
