//! RMSNorm over the last axis, `y = x / sqrt(mean(x^2) + eps) * w`, and its backward pass.
//!
//! With `s = sqrt(mean(x^2) + eps)`, `n = x / s` and `g` the gradient of `y`:
//! `dx = (g w - n mean(g w n)) / s` row by row, and `dw = sum over rows of g n`.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::lanes;
use super::{ROWS_PER_CHUNK, contiguous_f32, output, row_length, same_length, with_f32s, zeros};

/// `x [.., d]` normalised over its last axis and scaled by `weight [d]`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&weight.contiguous()?, RmsNorm { eps: eps as f32 })
}

/// The op [`rms_norm`] applies, for a caller that runs its backward pass itself.
pub(crate) fn rms_norm_op(eps: f64) -> Box<dyn CustomOp2 + Send + Sync> {
    Box::new(RmsNorm { eps: eps as f32 })
}

struct RmsNorm {
    eps: f32,
}

/// `sqrt(mean(x^2) + eps)` of one row, summed in the lane order.
fn root_mean_square(row: &[f32], eps: f32) -> f32 {
    let squares = lanes::sum_of_squares(row);
    (squares / row.len() as f32 + eps).sqrt()
}

fn checked_weight<'a>(
    op: &str,
    storage: &'a CpuStorage,
    layout: &Layout,
    d: usize,
) -> Result<&'a [f32]> {
    let weight = contiguous_f32(op, storage, layout)?;
    if weight.len() != d {
        candle_core::bail!("{op}: a weight of {} for rows of {d}", weight.len());
    }
    Ok(weight)
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = row_length(self.name(), xl.shape())?;
        let x = contiguous_f32(self.name(), xs, xl)?;
        let weight = checked_weight(self.name(), ws, wl, d)?;
        let mut y = zeros(x.len());
        y.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(y, x)| {
            let s = root_mean_square(x, self.eps);
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(weight) {
                *y = x / s * w;
            }
        });
        Ok(output(y, xl.shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = row_length(self.name(), x.shape())?;
        let (dx, dw) = with_f32s(self.name(), [x, weight, grad], |[xs, w, g]| {
            if w.len() != d {
                candle_core::bail!("rms-norm: a weight of {} for rows of {d}", w.len());
            }
            same_length(self.name(), xs, g)?;
            Ok(grads(xs, w, g, d, self.eps))
        })?;
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), x.device())?),
            Some(Tensor::from_vec(dw, weight.shape(), x.device())?),
        ))
    }
}

/// `(dx, dw)` from `x`, `w` and the output's gradient `g`, in one pass over the rows:
/// chunks of [`ROWS_PER_CHUNK`] rows in parallel, each row's `dx` and the chunk's share of
/// `dw` (its rows in order), then the chunks' shares added in order.
fn grads(x: &[f32], weight: &[f32], grad: &[f32], d: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
    let chunk = d * ROWS_PER_CHUNK;
    let mut dx = zeros(x.len());
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk).zip(grad.par_chunks(chunk)))
        .map(|(dx, (x, g))| {
            let mut sum = vec![0f32; d];
            for ((dx, x), g) in dx.chunks_mut(d).zip(x.chunks(d)).zip(g.chunks(d)) {
                let s = root_mean_square(x, eps);
                let dot = lanes::sum_by(d, |i| g[i] * weight[i] * (x[i] / s));
                let mean = dot / d as f32;
                for (((dx, &x), &g), &w) in dx.iter_mut().zip(x).zip(g).zip(weight) {
                    *dx = (g * w - x / s * mean) / s;
                }
                for ((sum, &x), &g) in sum.iter_mut().zip(x).zip(g) {
                    *sum += g * (x / s);
                }
            }
            sum
        })
        .collect();
    let mut dw = vec![0f32; d];
    for partial in &partials {
        for (dw, p) in dw.iter_mut().zip(partial) {
            *dw += p;
        }
    }
    (dx, dw)
}
