//! The products every layer runs, each counted in the step's figures.

use crate::blocks::shared_rows::SharedRows;
use minirun_kernels::{KernelError, QMatrix};
use minirun_stream::step::StepStats;

/// `y = W x` into a new vector, counting the bytes read.
pub(crate) fn apply(
    m: &QMatrix,
    x: &[f32],
    stats: &mut StepStats,
) -> Result<Vec<f32>, KernelError> {
    let mut y = vec![0f32; m.rows()];
    m.matvec(x, &mut y)?;
    stats.weight_bytes += m.stored_bytes() as u64;
    Ok(y)
}

/// `W x` for every `x` of a batch, the matrix's bytes read once for all of them: each output
/// has the bits [`apply`] gives it alone (`QMatrix::matmul`).
pub(crate) fn apply_batch<X: AsRef<[f32]>>(
    m: &QMatrix,
    xs: &[X],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    if let [x] = xs {
        return Ok(vec![apply(m, x.as_ref(), stats)?]);
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
    m: &QMatrix,
    input: &SharedRows,
    which: &[usize],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    let Some(group) = m.int8_group() else {
        return apply_batch(m, &SharedRows::pick(input.values(), which)?, stats);
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
