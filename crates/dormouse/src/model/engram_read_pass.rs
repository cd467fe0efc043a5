//! The Engram read of a block, `h + sigmoid(gate(h)) * proj(memory)`, forward and backward
//! for the training pass, with the bits candle's autograd gives it.
//!
//! The element-wise passes over `[B, T, d_model]` run on every thread; the two sums autograd
//! takes (the gate's gradient over each row, the bias's over all rows) and the sigmoid's
//! backward are candle's own ops on the same values, and the gate weight's gradient is the
//! gemm call candle's matmul backward makes.

use candle_core::{D, Module, Result, Tensor};
use candle_nn::Linear;
use fresh_gemm::{Matrix, product};
use rayon::prelude::*;

use super::EngramRead;
use crate::fused::applied::Applied2;
use crate::fused::linear::linear_op;
use crate::fused::{with_f32, with_f32s, zeros};

/// What the read's backward pass needs: its input, the gate `[B, T, 1]` (and its values, one
/// per row) and the projection.
pub(super) struct EngramTape {
    input: Tensor,
    gate: Tensor,
    gate_values: Vec<f32>,
    proj: Applied2,
}

/// The f32 values of a contiguous tensor, copied out (the gate: one value per row).
fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// `(rows, d)` of a `[.., d]` tensor.
fn rows_of(t: &Tensor) -> Result<(usize, usize)> {
    let d = t.dim(D::Minus1)?;
    Ok((t.elem_count() / d.max(1), d))
}

/// A new tensor of `like`'s shape whose row `i` (of `d` values) `f` writes from row `i` of
/// `a` and of `b` (both of that shape), the rows in parallel.
fn map_rows(
    like: &Tensor,
    [a, b]: [&Tensor; 2],
    f: impl Fn(usize, &[f32], &[f32], &mut [f32]) + Sync,
) -> Result<Tensor> {
    let (_, d) = rows_of(like)?;
    let mut out = zeros(like.elem_count());
    with_f32s("engram read", [a, b], |[a, b]| {
        if a.len() != out.len() || b.len() != out.len() {
            candle_core::bail!("the Engram read's rows differ in size");
        }
        out.par_chunks_mut(d)
            .zip(a.par_chunks(d).zip(b.par_chunks(d)))
            .enumerate()
            .for_each(|(row, (out, (a, b)))| f(row, a, b, out));
        Ok(())
    })?;
    Tensor::from_vec(out, like.shape(), like.device())
}

/// The read's output from `h` and the memory rows, and what its backward pass needs.
pub(super) fn forward(
    read: &EngramRead,
    h: &Tensor,
    memory: &Tensor,
) -> Result<(Tensor, EngramTape)> {
    let gate_layer = Linear::new(
        read.gate.weight().detach(),
        read.gate.bias().map(Tensor::detach),
    );
    let gate = candle_nn::ops::sigmoid(&gate_layer.forward(h)?)?;
    let proj = Applied2::new(linear_op(), memory, &read.proj.weight().detach())?;
    let s = values(&gate)?;
    // `h + p s` as autograd's graph rounds it: the product, then the sum.
    let out = map_rows(h, [h, proj.output()], |row, h, p, out| {
        for ((o, &h), &p) in out.iter_mut().zip(h).zip(p) {
            *o = h + p * s[row];
        }
    })?;
    let tape = EngramTape {
        input: h.clone(),
        gate,
        gate_values: s,
        proj,
    };
    Ok((out, tape))
}

/// The gradients of the read's input and memory rows from its output's `dh`, the gate's
/// and the projection's parameter gradients into `grads`.
pub(super) fn backward(
    read: &EngramRead,
    tape: EngramTape,
    dh: &Tensor,
    grads: &mut candle_core::backprop::GradStore,
) -> Result<(Tensor, Tensor)> {
    let EngramTape {
        input,
        gate,
        gate_values: s,
        proj,
    } = tape;
    let d_proj = map_rows(dh, [dh, dh], |row, g, _, out| {
        for (o, &g) in out.iter_mut().zip(g) {
            *o = g * s[row];
        }
    })?;
    let by_proj = map_rows(dh, [dh, proj.output()], |_, g, p, out| {
        for ((o, &g), &p) in out.iter_mut().zip(g).zip(p) {
            *o = g * p;
        }
    })?;
    // As autograd: the broadcast's sum, then sigmoid's backward `g (1 - s) s`.
    let d_gate = by_proj.sum_keepdim(D::Minus1)?;
    let d_pre = d_gate.mul(&gate.ones_like()?.sub(&gate)?.mul(&gate)?)?;
    let d_bias = d_pre.sum_keepdim((0, 1))?.squeeze(0)?.squeeze(0)?;
    let (rows, d) = rows_of(&input)?;
    let pre = values(&d_pre)?;
    let weight = values(read.gate.weight())?;
    let d_weight = with_f32("engram read", &input.contiguous()?, |x| {
        let x = Matrix::row_major(x, rows, d).map_err(candle_core::Error::wrap)?;
        let pre = Matrix::row_major(&pre, rows, 1).map_err(candle_core::Error::wrap)?;
        product(x.t(), pre).map_err(candle_core::Error::wrap)
    })?;
    // The gate's share of the input's gradient is a product of one term per element, added
    // to the residual path's.
    let d_input = map_rows(dh, [dh, dh], |row, g, _, out| {
        for ((o, &g), &w) in out.iter_mut().zip(g).zip(&weight) {
            *o = g + pre[row] * w;
        }
    })?;
    let (d_memory, d_proj_weight) = proj.grads(&d_proj)?;
    grads.insert(
        read.gate.weight(),
        Tensor::from_vec(d_weight, read.gate.weight().shape(), dh.device())?,
    );
    if let Some(bias) = read.gate.bias() {
        grads.insert(bias, d_bias);
    }
    grads.insert(read.proj.weight(), d_proj_weight);
    Ok((d_input, d_memory))
}
