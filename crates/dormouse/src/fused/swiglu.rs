//! The SwiGLU gate `silu(a) x b` (`silu(a) = a sigmoid(a)`), and its backward pass:
//! `da = g b sigmoid(a) (1 + a (1 - sigmoid(a)))`, `db = g silu(a)`.
//!
//! Two ops: [`swiglu`] of two given tensors, and [`swiglu_projections`], which also does the
//! two products that make them from the MLP's input (`a = x Wg^T`, `b = x Wu^T`) as one node:
//! the pre-activations it keeps for its backward pass never become graph tensors, so candle
//! gives them no zeroed gradient buffers, and the input's gradient is summed inside.

use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::linear::{times, times_transposed, transposed_times};
use super::vector_exp::exp_all;
use super::{contiguous_f32, output, same_length, with_f32s, zeros};

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `silu(gate) x up`, element by element (same shapes).
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

/// `silu(x W_gate^T) x (x W_up^T)` for `x [.., in]` and weights `[hidden, in]`: `[.., hidden]`.
pub fn swiglu_projections(x: &Tensor, w_gate: &Tensor, w_up: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &w_gate.contiguous()?,
        &w_up.contiguous()?,
        SwiGluProjections {
            pre_activations: OnceLock::new(),
        },
    )
}

/// The op [`swiglu_projections`] applies, for a caller that runs its backward pass itself
/// (the op keeps what that pass reads).
pub(crate) fn swiglu_projections_op() -> Box<dyn CustomOp3 + Send + Sync> {
    Box::new(SwiGluProjections {
        pre_activations: OnceLock::new(),
    })
}

/// `out[i] = sigmoid(a[i]) = 1 / (1 + exp(-a[i]))`, with [`exp_all`]'s `exp`.
fn sigmoids(out: &mut [f32], a: &[f32]) {
    for (o, &a) in out.iter_mut().zip(a) {
        *o = -a;
    }
    exp_all(out);
    for o in out.iter_mut() {
        *o = 1.0 / (1.0 + *o);
    }
}

/// `silu(gate) x up`.
fn gated(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut out = zeros(gate.len());
    out.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(out, (gate, up))| {
            sigmoids(out, gate);
            for ((o, &a), &b) in out.iter_mut().zip(gate).zip(up) {
                *o = a * *o * b;
            }
        });
    out
}

/// `(d gate, d up)` from the gradient of `silu(gate) x up`, in one pass.
fn gated_grads(gate: &[f32], up: &[f32], grad: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (mut d_gate, mut d_up) = (zeros(gate.len()), zeros(gate.len()));
    d_gate
        .par_chunks_mut(CHUNK)
        .zip(d_up.par_chunks_mut(CHUNK))
        .zip(
            gate.par_chunks(CHUNK)
                .zip(up.par_chunks(CHUNK).zip(grad.par_chunks(CHUNK))),
        )
        .for_each(|((d_gate, d_up), (gate, (up, grad)))| {
            sigmoids(d_up, gate);
            let rows = d_gate.iter_mut().zip(d_up.iter_mut());
            for (((dg, du), &a), (&b, &g)) in rows.zip(gate).zip(up.iter().zip(grad)) {
                let s = *du;
                *dg = g * b * s * (1.0 + a * (1.0 - s));
                *du = g * a * s;
            }
        });
    (d_gate, d_up)
}

/// `dst[i] += src[i]`, in parallel chunks.
fn add_assign(dst: &mut [f32], src: &[f32]) {
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(dst, src)| {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += s;
            }
        });
}

/// Both gradients of a gate, as values.
fn gate_grad_values(gate: &Tensor, up: &Tensor, grad: &Tensor) -> Result<(Vec<f32>, Vec<f32>)> {
    with_f32s("swiglu-grad", [gate, up, grad], |[gate, up, grad]| {
        same_length("swiglu-grad", gate, up)?;
        same_length("swiglu-grad", gate, grad)?;
        Ok(gated_grads(gate, up, grad))
    })
}

/// Both gradients of a gate as tensors of the gate's shape.
fn gate_grads(gate: &Tensor, up: &Tensor, grad: &Tensor) -> Result<(Tensor, Tensor)> {
    let (d_gate, d_up) = gate_grad_values(gate, up, grad)?;
    Ok((
        Tensor::from_vec(d_gate, gate.shape(), gate.device())?,
        Tensor::from_vec(d_up, gate.shape(), gate.device())?,
    ))
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if gl.shape() != ul.shape() {
            candle_core::bail!("swiglu of shapes {:?} and {:?}", gl.shape(), ul.shape());
        }
        let gate = contiguous_f32(self.name(), gs, gl)?;
        let up = contiguous_f32(self.name(), us, ul)?;
        Ok(output(gated(gate, up), gl.shape()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (d_gate, d_up) = gate_grads(gate, up, grad)?;
        Ok((Some(d_gate), Some(d_up)))
    }
}

struct SwiGluProjections {
    /// `(x W_gate^T, x W_up^T)` as `[rows, hidden]`, kept by forward.
    pre_activations: OnceLock<(Tensor, Tensor)>,
}

/// `(rows, in, hidden)` of the MLP's input and weights, refusing mismatched shapes.
fn projection_sizes(x: &Shape, w_gate: &Shape, w_up: &Shape) -> Result<(usize, usize, usize)> {
    let (&[hidden, w_in], Some(&x_in)) = (w_gate.dims(), x.dims().last()) else {
        candle_core::bail!("the SwiGLU projections of {x:?} by weights {w_gate:?}, {w_up:?}");
    };
    if x_in != w_in || x_in == 0 || w_up != w_gate {
        candle_core::bail!("the SwiGLU projections of {x:?} by weights {w_gate:?}, {w_up:?}");
    }
    Ok((x.elem_count() / x_in, x_in, hidden))
}

impl CustomOp3 for SwiGluProjections {
    fn name(&self) -> &'static str {
        "swiglu-projections"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if !(xl.is_contiguous() && gl.is_contiguous() && ul.is_contiguous()) {
            candle_core::bail!("the SwiGLU projections take contiguous tensors");
        }
        let (rows, inputs, hidden) = projection_sizes(xl.shape(), gl.shape(), ul.shape())?;
        let x = contiguous_f32(self.name(), xs, xl)?;
        let product = |ws: &CpuStorage, wl: &Layout| -> Result<Vec<f32>> {
            let w = contiguous_f32(self.name(), ws, wl)?;
            times_transposed(x, rows, inputs, w, hidden)
        };
        let (gate, up) = (product(gs, gl)?, product(us, ul)?);
        let out = gated(&gate, &up);
        let device = candle_core::Device::Cpu;
        let kept = (
            Tensor::from_vec(gate, (rows, hidden), &device)?,
            Tensor::from_vec(up, (rows, hidden), &device)?,
        );
        // A second forward of the same op (never done by candle) would keep the first.
        let _ = self.pre_activations.set(kept);
        let mut dims = xl.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = hidden;
        }
        Ok(output(out, &Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w_gate: &Tensor,
        w_up: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some((gate, up)) = self.pre_activations.get() else {
            candle_core::bail!("the SwiGLU projections' backward pass ran before their forward");
        };
        let (rows, inputs, hidden) = projection_sizes(x.shape(), w_gate.shape(), w_up.shape())?;
        let (d_gate, d_up) = gate_grad_values(gate, up, &grad.reshape((rows, hidden))?)?;
        let (dx, dw_gate, dw_up) =
            with_f32s(self.name(), [x, w_gate, w_up], |[x, w_gate, w_up]| {
                let mut dx = times(&d_gate, rows, hidden, w_gate, inputs)?;
                let from_up = times(&d_up, rows, hidden, w_up, inputs)?;
                add_assign(&mut dx, &from_up);
                let dw_gate = transposed_times(&d_gate, rows, hidden, x, inputs)?;
                let dw_up = transposed_times(&d_up, rows, hidden, x, inputs)?;
                Ok((dx, dw_gate, dw_up))
            })?;
        let device = x.device();
        let dx = Tensor::from_vec(dx, x.shape(), device)?;
        let dw_gate = Tensor::from_vec(dw_gate, w_gate.shape(), device)?;
        let dw_up = Tensor::from_vec(dw_up, w_up.shape(), device)?;
        Ok((Some(dx), Some(dw_gate), Some(dw_up)))
    }
}
