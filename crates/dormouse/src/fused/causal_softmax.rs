//! The attention weights of causal self-attention, `softmax(scale x scores)` over the keys a
//! query may see, in one pass, and its backward pass.
//!
//! Query `i` of a block that starts at absolute position `start` sees keys `0..=start + i`;
//! the weights of the keys after it are exactly 0 (as `-inf` added before a softmax gives).
//! With `p` the weights of a row and `g` their gradient, the scores' gradient is
//! `scale x p (g - sum(p g))`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous_f32, output, row_length};

/// Weights of `scores [.., T, S]` (query rows at positions `start..start + T`).
pub fn causal_softmax(scores: &Tensor, scale: f64, start: usize) -> Result<Tensor> {
    scores.contiguous()?.apply_op1(CausalSoftmax {
        scale: scale as f32,
        start,
    })
}

struct CausalSoftmax {
    scale: f32,
    start: usize,
}

impl CausalSoftmax {
    /// `(T, S)` of a scores layout.
    fn rows(&self, op: &str, shape: &Shape) -> Result<(usize, usize)> {
        let keys = row_length(op, shape)?;
        let dims = shape.dims();
        if dims.len() < 2 {
            candle_core::bail!("{op} needs [.., queries, keys] scores, not shape {dims:?}");
        }
        Ok((dims[dims.len() - 2], keys))
    }

    /// Keys query `i` of a block sees.
    fn visible(&self, query: usize, keys: usize) -> usize {
        (self.start + query + 1).min(keys)
    }
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (queries, keys) = self.rows(self.name(), layout.shape())?;
        let scores = contiguous_f32(self.name(), storage, layout)?;
        let mut weights = vec![0f32; scores.len()];
        weights
            .par_chunks_mut(keys)
            .zip(scores.par_chunks(keys))
            .enumerate()
            .for_each(|(row, (p, s))| {
                let seen = self.visible(row % queries, keys);
                let (p, s) = (&mut p[..seen], &s[..seen]);
                let max = s
                    .iter()
                    .map(|&v| v * self.scale)
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0f32;
                for (p, &s) in p.iter_mut().zip(s) {
                    *p = (s * self.scale - max).exp();
                    total += *p;
                }
                for p in p.iter_mut() {
                    *p /= total;
                }
            });
        Ok(output(weights, layout.shape()))
    }

    fn bwd(&self, _scores: &Tensor, weights: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = CausalSoftmaxGrad {
            inner: CausalSoftmax {
                scale: self.scale,
                start: self.start,
            },
        };
        Ok(Some(weights.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// The scores' gradient from `(weights, grad of weights)`.
struct CausalSoftmaxGrad {
    inner: CausalSoftmax,
}

impl CustomOp2 for CausalSoftmaxGrad {
    fn name(&self) -> &'static str {
        "causal-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        ps: &CpuStorage,
        pl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (queries, keys) = self.inner.rows(self.name(), pl.shape())?;
        let weights = contiguous_f32(self.name(), ps, pl)?;
        let grad = contiguous_f32(self.name(), gs, gl)?;
        if grad.len() != weights.len() {
            candle_core::bail!(
                "{}: a gradient of {} for {}",
                self.name(),
                grad.len(),
                weights.len()
            );
        }
        let scale = self.inner.scale;
        let mut ds = vec![0f32; weights.len()];
        ds.par_chunks_mut(keys)
            .zip(weights.par_chunks(keys).zip(grad.par_chunks(keys)))
            .enumerate()
            .for_each(|(row, (ds, (p, g)))| {
                let seen = self.inner.visible(row % queries, keys);
                let (ds, p, g) = (&mut ds[..seen], &p[..seen], &g[..seen]);
                let dot: f32 = p.iter().zip(g).map(|(p, g)| p * g).sum();
                for ((ds, &p), &g) in ds.iter_mut().zip(p).zip(g) {
                    *ds = scale * p * (g - dot);
                }
            });
        Ok(output(ds, pl.shape()))
    }
}
