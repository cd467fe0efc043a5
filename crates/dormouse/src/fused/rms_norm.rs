//! RMSNorm over the last axis, `y = x / sqrt(mean(x^2) + eps) * w`, and its backward pass.
//!
//! With `s = sqrt(mean(x^2) + eps)`, `n = x / s` and `g` the gradient of `y`:
//! `dx = (g w - n mean(g w n)) / s` row by row, and `dw = sum over rows of g n`.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::lanes;
use super::{ROWS_PER_CHUNK, contiguous_f32, output, row_length, same_length, zeros};

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
        let (x, weight, grad) = (x.contiguous()?, weight.contiguous()?, grad.contiguous()?);
        let eps = self.eps;
        let dx = x.apply_op3_no_bwd(&weight, &grad, &InputGrad { eps })?;
        let dw = x.apply_op2_no_bwd(&grad, &WeightGrad { eps })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// `dx` from `(x, w, g)`.
struct InputGrad {
    eps: f32,
}

impl CustomOp3 for InputGrad {
    fn name(&self) -> &'static str {
        "rms-norm-input-grad"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = row_length(self.name(), xl.shape())?;
        let x = contiguous_f32(self.name(), xs, xl)?;
        let weight = checked_weight(self.name(), ws, wl, d)?;
        let grad = contiguous_f32(self.name(), gs, gl)?;
        same_length(self.name(), x, grad)?;
        let mut dx = zeros(x.len());
        dx.par_chunks_mut(d)
            .zip(x.par_chunks(d).zip(grad.par_chunks(d)))
            .for_each(|(dx, (x, g))| {
                let s = root_mean_square(x, self.eps);
                let dot = lanes::sum_by(d, |i| g[i] * weight[i] * (x[i] / s));
                let mean = dot / d as f32;
                for (((dx, &x), &g), &w) in dx.iter_mut().zip(x).zip(g).zip(weight) {
                    *dx = (g * w - x / s * mean) / s;
                }
            });
        Ok(output(dx, xl.shape()))
    }
}

/// `dw` from `(x, g)`: chunks of [`ROWS_PER_CHUNK`] rows in parallel, then the chunks in order.
struct WeightGrad {
    eps: f32,
}

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "rms-norm-weight-grad"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = row_length(self.name(), xl.shape())?;
        let x = contiguous_f32(self.name(), xs, xl)?;
        let grad = contiguous_f32(self.name(), gs, gl)?;
        same_length(self.name(), x, grad)?;
        let chunk = d * ROWS_PER_CHUNK;
        let partials: Vec<Vec<f32>> = x
            .par_chunks(chunk)
            .zip(grad.par_chunks(chunk))
            .map(|(x, g)| {
                let mut sum = vec![0f32; d];
                for (x, g) in x.chunks(d).zip(g.chunks(d)) {
                    let s = root_mean_square(x, self.eps);
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
        Ok(output(dw, &Shape::from(d)))
    }
}
