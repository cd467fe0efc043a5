//! `y = x W^T` for `x [.., in]` and a weight `[out, in]`, as one node of the graph.
//!
//! candle's `Linear` is four nodes (a reshape, the weight's transpose, the product, a reshape
//! back), and candle's backward pass gives each node's input a zeroed gradient buffer and adds
//! into it: three extra passes over activation-sized memory per projection. Here the forward
//! product is the gemm call candle's CPU matmul makes on the same layouts (same bits) but
//! written into memory that is not zeroed first ([`fresh_gemm`]), and the backward pass is
//! the two products `dx = g W` and `dW = g^T x`, made the same way.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use fresh_gemm::{Matrix, product};

use super::{contiguous_f32, output, with_f32s};

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
        let (rows, inputs, outputs) = sizes(xl.shape(), wl.shape())?;
        let x = contiguous_f32(self.name(), xs, xl)?;
        let weight = contiguous_f32(self.name(), ws, wl)?;
        let y = times_transposed(x, rows, inputs, weight, outputs)?;
        let mut dims = xl.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = outputs;
        }
        Ok(output(y, &Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, inputs, outputs) = sizes(x.shape(), weight.shape())?;
        let (dx, dw) = with_f32s(self.name(), [grad, weight, x], |[g, w, x]| {
            let dx = times(g, rows, outputs, w, inputs)?;
            Ok((dx, transposed_times(g, rows, outputs, x, inputs)?))
        })?;
        let device = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), device)?),
            Some(Tensor::from_vec(dw, weight.shape(), device)?),
        ))
    }
}

/// A row-major `rows x cols` operand, refused (not read) past its slice.
fn matrix(values: &[f32], rows: usize, cols: usize) -> Result<Matrix<'_>> {
    Matrix::row_major(values, rows, cols).map_err(candle_core::Error::wrap)
}

fn product_of(lhs: Matrix<'_>, rhs: Matrix<'_>) -> Result<Vec<f32>> {
    product(lhs, rhs).map_err(candle_core::Error::wrap)
}

/// `x [rows, inputs]` times the transpose of `weight [outputs, inputs]`: `[rows, outputs]`.
pub(crate) fn times_transposed(
    x: &[f32],
    rows: usize,
    inputs: usize,
    weight: &[f32],
    outputs: usize,
) -> Result<Vec<f32>> {
    product_of(
        matrix(x, rows, inputs)?,
        matrix(weight, outputs, inputs)?.t(),
    )
}

/// `grad [rows, outputs]` times `weight [outputs, inputs]`: `[rows, inputs]`.
pub(crate) fn times(
    grad: &[f32],
    rows: usize,
    outputs: usize,
    weight: &[f32],
    inputs: usize,
) -> Result<Vec<f32>> {
    product_of(
        matrix(grad, rows, outputs)?,
        matrix(weight, outputs, inputs)?,
    )
}

/// The transpose of `grad [rows, outputs]` times `x [rows, inputs]`: `[outputs, inputs]`.
pub(crate) fn transposed_times(
    grad: &[f32],
    rows: usize,
    outputs: usize,
    x: &[f32],
    inputs: usize,
) -> Result<Vec<f32>> {
    product_of(matrix(grad, rows, outputs)?.t(), matrix(x, rows, inputs)?)
}
