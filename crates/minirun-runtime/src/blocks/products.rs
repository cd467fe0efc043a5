//! The products every layer runs, each counted in the step's figures, on a matrix held in
//! memory or a layer's matrix that may stream ([`Product`]).

use crate::blocks::shared_rows::SharedRows;
use minirun_kernels::{KernelError, QMatrix};
use minirun_stream::matrix::Matrix;
use minirun_stream::step::{ModelError, StepStats};

/// A matrix a product computes with: one in memory, or a layer's [`Matrix`], which a streamed
/// layer reads when its pass comes to it.
pub trait Product {
    fn with<R>(
        &self,
        f: impl FnOnce(&QMatrix<'_>) -> Result<R, KernelError>,
    ) -> Result<R, ModelError>;
}

impl Product for QMatrix<'_> {
    fn with<R>(
        &self,
        f: impl FnOnce(&QMatrix<'_>) -> Result<R, KernelError>,
    ) -> Result<R, ModelError> {
        Ok(f(self)?)
    }
}

impl Product for Matrix<'_> {
    fn with<R>(
        &self,
        f: impl FnOnce(&QMatrix<'_>) -> Result<R, KernelError>,
    ) -> Result<R, ModelError> {
        Matrix::with(self, f)
    }
}

/// `y = W x` into a new vector, counting the bytes read.
fn apply_held(m: &QMatrix, x: &[f32], stats: &mut StepStats) -> Result<Vec<f32>, KernelError> {
    let mut y = vec![0f32; m.rows()];
    m.matvec(x, &mut y)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(y)
}

/// `W x` for every `x` of a batch, the matrix's bytes read once for all of them: each output
/// has the bits [`apply`] gives it alone (`QMatrix::matmul`).
pub(crate) fn apply_batch<X: AsRef<[f32]>>(
    m: &impl Product,
    xs: &[X],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    m.with(|m| batch_held(m, xs, stats))
}

fn batch_held<X: AsRef<[f32]>>(
    m: &QMatrix,
    xs: &[X],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    if let [x] = xs {
        return Ok(vec![apply_held(m, x.as_ref(), stats)?]);
    }
    let mut flat = Vec::with_capacity(xs.len() * m.cols());
    for x in xs {
        flat.extend_from_slice(x.as_ref());
    }
    let mut ys = vec![0f32; xs.len() * m.rows()];
    m.matmul(&flat, xs.len(), &mut ys)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(ys.chunks_exact(m.rows()).map(<[f32]>::to_vec).collect())
}

/// [`apply_batch`] on rows `which` of a shared input: with 8-bit activations the rows are
/// quantized once for every product that reads them ([`SharedRows`]); each output has the bits
/// [`apply`] gives its row alone.
pub(crate) fn apply_shared(
    m: &impl Product,
    input: &SharedRows,
    which: &[usize],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    m.with(|m| shared_held(m, input, which, stats))
}

fn shared_held(
    m: &QMatrix,
    input: &SharedRows,
    which: &[usize],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    let Some(group) = m.int8_group() else {
        return batch_held(m, &SharedRows::pick(input.values(), which)?, stats);
    };
    let all = input.quantized(group)?;
    let outs = m.matmul_quantized(&SharedRows::pick(&all, which)?)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(outs)
}

/// The indices of the `k` largest `values` (all of them when fewer), largest first; ties go
/// to the lower index.
pub(crate) fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// `ys[i] += outs[i]` for every row of a batch.
pub(crate) fn add_rows(ys: &mut [Vec<f32>], outs: &[Vec<f32>]) {
    for (y, out) in ys.iter_mut().zip(outs) {
        y.iter_mut().zip(out).for_each(|(y, o)| *y += o);
    }
}
