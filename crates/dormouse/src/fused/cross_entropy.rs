//! Mean cross-entropy of logits against target classes, and its backward pass.
//!
//! Each row's loss `logsumexp(l) - l[target]` is computed in f32 (the max subtracted first,
//! `exp` from [`super::vector_exp`]);
//! the mean sums the rows in f64 in order. With `g` the loss's gradient, the logits' gradient
//! is `g / N x (softmax(l) - onehot(target))`.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::lanes;
use super::vector_exp::exp_all;
use super::{contiguous_f32, output, row_length, zeros};

/// Mean over the rows of `logits [N, V]` of `-log softmax(row)[targets[row]]`.
pub fn cross_entropy(logits: &Tensor, targets: Vec<u32>) -> Result<Tensor> {
    logits
        .contiguous()?
        .apply_op1_arc(std::sync::Arc::new(cross_entropy_op(logits, targets)?))
}

/// The op [`cross_entropy`] applies to `logits` `[N, V]`, for a caller that runs its backward
/// pass itself; refuses targets that do not fit the logits.
pub(crate) fn cross_entropy_op(
    logits: &Tensor,
    targets: Vec<u32>,
) -> Result<Box<dyn CustomOp1 + Send + Sync>> {
    let (rows, classes) = logits.dims2()?;
    if targets.len() != rows {
        candle_core::bail!(
            "cross-entropy of {rows} rows against {} targets",
            targets.len()
        );
    }
    if let Some(&bad) = targets.iter().find(|&&t| t as usize >= classes) {
        candle_core::bail!("cross-entropy over {classes} classes: a target of {bad}");
    }
    Ok(Box::new(CrossEntropy {
        targets: Arc::new(targets),
    }))
}

struct CrossEntropy {
    targets: Arc<Vec<u32>>,
}

/// `exp(l - max)` of one row into `exps`, and `(max, their sum in the lane order)`.
fn shifted_exps(row: &[f32], exps: &mut [f32]) -> (f32, f32) {
    let max = lanes::max(row);
    for (e, &l) in exps.iter_mut().zip(row) {
        *e = l - max;
    }
    exp_all(exps);
    (max, lanes::sum(exps))
}

impl CustomOp1 for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let classes = row_length(self.name(), layout.shape())?;
        let logits = contiguous_f32(self.name(), storage, layout)?;
        let losses: Vec<f32> = logits
            .par_chunks(classes)
            .zip(self.targets.par_iter())
            .map_init(
                || vec![0f32; classes],
                |exps, (row, &target)| {
                    let (max, total) = shifted_exps(row, exps);
                    total.ln() - (row[target as usize] - max)
                },
            )
            .collect();
        let sum: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        let mean = (sum / losses.len().max(1) as f64) as f32;
        Ok(output(vec![mean], &Shape::from(())))
    }

    fn bwd(&self, logits: &Tensor, _loss: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = CrossEntropyGrad {
            targets: Arc::clone(&self.targets),
            grad: grad.to_scalar::<f32>()?,
        };
        Ok(Some(logits.apply_op1_no_bwd(&op)?))
    }
}

struct CrossEntropyGrad {
    targets: Arc<Vec<u32>>,
    grad: f32,
}

impl CustomOp1 for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "cross-entropy-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let classes = row_length(self.name(), layout.shape())?;
        let logits = contiguous_f32(self.name(), storage, layout)?;
        let per_row = self.grad / self.targets.len().max(1) as f32;
        let mut dl = zeros(logits.len());
        dl.par_chunks_mut(classes)
            .zip(logits.par_chunks(classes).zip(self.targets.par_iter()))
            .for_each(|(dl, (row, &target))| {
                let (_, total) = shifted_exps(row, dl);
                for dl in dl.iter_mut() {
                    *dl = per_row * (*dl / total);
                }
                dl[target as usize] -= per_row;
            });
        Ok(output(dl, layout.shape()))
    }
}
