//! The SwiGLU gate `silu(a) x b` (`silu(a) = a sigmoid(a)`), and its backward pass:
//! `da = g b sigmoid(a) (1 + a (1 - sigmoid(a)))`, `db = g silu(a)`.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::vector_exp::exp_all;
use super::{contiguous_f32, output};

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `silu(gate) x up`, element by element (same shapes).
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

struct SwiGlu;

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

fn same_length(op: &str, a: &[f32], b: &[f32]) -> Result<()> {
    if a.len() != b.len() {
        candle_core::bail!("{op}: operands of {} and {} elements", a.len(), b.len());
    }
    Ok(())
}

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
        let (gate, up) = (
            contiguous_f32(self.name(), gs, gl)?,
            contiguous_f32(self.name(), us, ul)?,
        );
        let mut out = vec![0f32; gate.len()];
        out.par_chunks_mut(CHUNK)
            .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
            .for_each(|(out, (gate, up))| {
                sigmoids(out, gate);
                for ((o, &a), &b) in out.iter_mut().zip(gate).zip(up) {
                    *o = a * *o * b;
                }
            });
        Ok(output(out, gl.shape()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let d_gate = gate.apply_op3_no_bwd(up, &grad, &SwiGluGrad::Gate)?;
        let d_up = gate.apply_op3_no_bwd(up, &grad, &SwiGluGrad::Up)?;
        Ok((Some(d_gate), Some(d_up)))
    }
}

/// One operand's gradient from `(gate, up, grad)`.
enum SwiGluGrad {
    Gate,
    Up,
}

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        match self {
            SwiGluGrad::Gate => "swiglu-gate-grad",
            SwiGluGrad::Up => "swiglu-up-grad",
        }
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let gate = contiguous_f32(self.name(), gs, gl)?;
        let up = contiguous_f32(self.name(), us, ul)?;
        let grad = contiguous_f32(self.name(), ds, dl)?;
        same_length(self.name(), gate, up)?;
        same_length(self.name(), gate, grad)?;
        let mut out = vec![0f32; gate.len()];
        out.par_chunks_mut(CHUNK)
            .zip(
                gate.par_chunks(CHUNK)
                    .zip(up.par_chunks(CHUNK).zip(grad.par_chunks(CHUNK))),
            )
            .for_each(|(out, (gate, (up, grad)))| {
                sigmoids(out, gate);
                for (((o, &a), &b), &g) in out.iter_mut().zip(gate).zip(up).zip(grad) {
                    let s = *o;
                    *o = match self {
                        SwiGluGrad::Gate => g * b * s * (1.0 + a * (1.0 - s)),
                        SwiGluGrad::Up => g * a * s,
                    };
                }
            });
        Ok(output(out, gl.shape()))
    }
}
