//! `y = x W^T` for `x [.., in]` and a weight `[out, in]`, as one node of the graph.
//!
//! candle's `Linear` is four nodes (a reshape, the weight's transpose, the product, a reshape
//! back), and candle's backward pass gives each node's input a zeroed gradient buffer and adds
//! into it: three extra passes over activation-sized memory per projection. Here the forward
//! product is candle's own CPU matmul (the same `gemm` call on the same layouts), and the
//! backward pass is the two products `dx = g W` and `dW = g^T x`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `x [.., in]` times the transpose of `weight [out, in]`: `[.., out]`.
pub fn linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&weight.contiguous()?, Linear)
}

/// The op [`linear`] applies, for a caller that runs its backward pass itself.
pub(crate) fn linear_op() -> Box<dyn CustomOp2 + Send + Sync> {
    Box::new(Linear)
}

struct Linear;

/// `(rows, in, out)` of a product, refusing mismatched shapes.
fn sizes(x: &Shape, weight: &Shape) -> Result<(usize, usize, usize)> {
    let (&[out, w_in], Some(&x_in)) = (weight.dims(), x.dims().last()) else {
        candle_core::bail!("a linear map of {x:?} by a weight {weight:?}");
    };
    if x_in != w_in || x_in == 0 {
        candle_core::bail!("a linear map of {x:?} by a weight {weight:?}");
    }
    Ok((x.elem_count() / x_in, x_in, out))
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if !xl.is_contiguous() || !wl.is_contiguous() {
            candle_core::bail!("the linear op takes contiguous tensors");
        }
        let (rows, inputs, outputs) = sizes(xl.shape(), wl.shape())?;
        let x = Layout::contiguous_with_offset((rows, inputs), xl.start_offset());
        let weight_t =
            Layout::contiguous_with_offset((outputs, inputs), wl.start_offset()).transpose(0, 1)?;
        let y = xs.matmul(ws, (1, rows, outputs, inputs), &x, &weight_t)?;
        let mut dims = xl.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = outputs;
        }
        Ok((y, Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, inputs, outputs) = sizes(x.shape(), weight.shape())?;
        let grad = grad.detach().contiguous()?.reshape((rows, outputs))?;
        let dx = grad.matmul(&weight.detach())?.reshape(x.shape())?;
        let x = x.detach().reshape((rows, inputs))?;
        let dw = grad.t()?.matmul(&x)?;
        Ok((Some(dx), Some(dw)))
    }
}
