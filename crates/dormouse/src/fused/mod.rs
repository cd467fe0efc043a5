//! Fused CPU kernels for training, each a candle custom op with its own backward pass.
//!
//! Built from tensor primitives, one RMSNorm is six candle kernels forward and more backward,
//! each a pass over memory into a freshly allocated buffer; the causal softmax over a batch's
//! attention scores is seven. Each op here reads its inputs once and writes its output once,
//! and its backward pass is one or two more such kernels. The work is split over rows with
//! rayon, and every output element is computed by one thread in a fixed order, so the bits do
//! not depend on the number of threads; reductions across rows ([`rms_norm`]'s weight
//! gradient, [`cross_entropy`]'s mean) sum fixed-size chunks and then the chunks in order.
//!
//! The ops take and return f32 tensors on the CPU and refuse anything else by name.

pub mod applied;
pub mod attention;
pub mod cross_entropy;
pub mod in_place;
pub mod lanes;
pub mod linear;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;
pub mod tile;
pub mod vector_exp;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows a reduction across rows sums before the partial sums are added in order.
const ROWS_PER_CHUNK: usize = 64;

/// The f32 elements of a contiguous operand.
fn contiguous_f32<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else {
        candle_core::bail!("{op} takes f32 tensors, not {:?}", storage.dtype());
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op} takes contiguous tensors");
    };
    Ok(&values[start..end])
}

/// Runs `f` on the f32 elements of a contiguous CPU tensor.
pub(crate) fn with_f32<R>(op: &str, t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("{op} runs on the CPU");
    };
    f(contiguous_f32(op, cpu, layout)?)
}

/// Runs `f` on the f32 elements of several CPU tensors at once, each made contiguous first.
pub(crate) fn with_f32s<const N: usize, R>(
    op: &str,
    tensors: [&Tensor; N],
    f: impl FnOnce([&[f32]; N]) -> Result<R>,
) -> Result<R> {
    let contiguous = tensors
        .iter()
        .map(|t| t.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = contiguous.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(N);
    for (storage, layout) in &guards {
        let candle_core::Storage::Cpu(cpu) = &**storage else {
            candle_core::bail!("{op} runs on the CPU");
        };
        slices.push(contiguous_f32(op, cpu, layout)?);
    }
    let Ok(slices) = <[&[f32]; N]>::try_from(slices) else {
        candle_core::bail!("{op}: {N} operands expected");
    };
    f(slices)
}

/// Refuses operands of different lengths, naming the op.
fn same_length(op: &str, a: &[f32], b: &[f32]) -> Result<()> {
    if a.len() != b.len() {
        candle_core::bail!("{op}: operands of {} and {} elements", a.len(), b.len());
    }
    Ok(())
}

/// The size of the last axis of `shape` (an op's row length), refusing a scalar or empty row.
fn row_length(op: &str, shape: &Shape) -> Result<usize> {
    match shape.dims().last() {
        Some(&n) if n > 0 => Ok(n),
        _ => candle_core::bail!("{op} needs rows along the last axis, not shape {shape:?}"),
    }
}

/// Buffers at least this long are zeroed by every thread at once.
const PARALLEL_ZEROING_MIN: usize = 1 << 16;

/// `len` zeros for a kernel to write its output into. A long buffer is zeroed by all of
/// rayon's threads instead of by one pass on the calling thread (reused memory must be
/// cleared, and a serial pass the size of every activation of a step left the other cores
/// idle).
pub(crate) fn zeros(len: usize) -> Vec<f32> {
    if len < PARALLEL_ZEROING_MIN {
        return vec![0f32; len];
    }
    let mut values = Vec::with_capacity(len);
    values.par_extend(rayon::iter::repeat_n(0f32, len));
    values
}

/// `a + b`, element by element, for two f32 tensors of one shape, computed by all of
/// rayon's threads (candle's add runs on the calling thread) straight into the result.
pub fn sum(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dims() != b.dims() {
        candle_core::bail!("a sum of shapes {:?} and {:?}", a.dims(), b.dims());
    }
    let mut values = Vec::new();
    with_f32s("sum", [a, b], |[a, b]| {
        a.par_iter()
            .zip(b)
            .map(|(a, b)| a + b)
            .collect_into_vec(&mut values);
        Ok(())
    })?;
    Tensor::from_vec(values, a.shape(), a.device())
}

/// An op's output.
fn output(values: Vec<f32>, shape: &Shape) -> (CpuStorage, Shape) {
    (CpuStorage::F32(values), shape.clone())
}
