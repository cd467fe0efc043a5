//! Matrix-vector products straight from stored bytes, dequantizing on the fly.
//!
//! # Reduction order (the same bits on any number of threads)
//!
//! Threads split a product by **output rows** only; each row is computed start to finish by
//! one thread with the code below, so its bits never depend on the thread count or on which
//! thread ran it. For row `r` and input `x`, with `w[k]` the row's decoded elements:
//!
//! 1. The row is cut into segments: an affine group, an MXFP4 group of 32, an FP8 block's
//!    width (the last may be shorter), or the whole row for dense matrices.
//! 2. In a segment, 8 lanes accumulate in f32: lane `j` adds `w[8c + j] * x[8c + j]` for the
//!    segment's 8-element chunks `c` in ascending order, starting from 0.
//! 3. The segment folds into 8 row accumulators (starting from 0), segments in ascending
//!    order: `acc[j] += s * part[j]` (MXFP4, FP8; `s` the segment's scale), `acc[j] +=
//!    s * part[j] + b * xsum[j]` (affine: `b` the bias, `xsum[j]` lane `j`'s sum of `x` over
//!    the group, chunks ascending), or `acc[j] += part[j]` (dense).
//! 4. `y = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))`.
//!
//! Every operation is a separate f32 multiply or add (no fused multiply-add), so the SIMD path
//! (8 lanes in one AVX2 register, chosen at run time) and the scalar fallback give the same bits.
//! Decoding is exact (`decode.rs`). NaN codes (e4m3 0x7F/0xFF, e8m0 0xFF) propagate as NaN.
//!
//! A matrix set to [`Activations::Int8`] runs its affine 4- and 8-bit and MXFP4 products in the
//! second arithmetic `int8.rs` documents instead (8-bit activations, integer group sums), as
//! deterministic but not with these bits; every other format keeps the order above.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_int8;
pub mod decode;
mod format;
mod int8;
mod int8_fold;
mod int8_vector;
pub mod reference;
mod row;

use std::ops::Range;

use rayon::prelude::*;

pub use format::{BlockScale, FloatType, Format, QMatrix, RowBytes};
pub use int8_vector::Int8Vector;

/// The arithmetic of a product's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Activations {
    /// Exact: every weight decoded to f32 and multiplied with the f32 input, in the order
    /// above.
    #[default]
    F32,
    /// Affine 4- and 8-bit and MXFP4 matrices take their input quantized to 8 bits per group
    /// and sum each group in integers (`int8.rs` documents the arithmetic); other formats stay
    /// exact. Faster, and as deterministic, but not the exact path's bits.
    Int8,
}

/// Why a matrix or a product was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("a {rows} x {cols} matrix with {what} is not supported")]
    Shape {
        rows: usize,
        cols: usize,
        what: String,
    },
    #[error("the {what} bytes are {actual}, the shape needs {expected}")]
    Bytes {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("{what} has {actual} elements, the product needs {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}

/// Rows handed to one rayon task. It changes no result bit (see the module docs).
const ROWS_PER_TASK: usize = 16;

/// Below this many weights a product runs on the calling thread: splitting it would wake the
/// other workers for less work than the wake-up costs (the per-head attention projections, a
/// router). It changes no result bit.
pub const SERIAL_CELLS: usize = 1 << 18;

/// `by_row[r * batch + b]` into `outs[b][r]` (`batch = outs.len()`), sixteen rows at a time so
/// that each output's cache line is written whole: output by output, a row's `batch` stores
/// would land a power of two apart, all in one cache set, and evict one another.
pub(crate) fn unweave<O: AsMut<[f32]>>(by_row: &[f32], outs: &mut [O]) {
    // Below this many values the transpose takes less than waking another worker.
    const SERIAL_VALUES: usize = 1 << 14;
    if by_row.len() < SERIAL_VALUES || rayon::current_num_threads() == 1 {
        return unweave_serially(by_row, outs);
    }
    // Bands of rows on whichever worker takes them: each band's slices of every output.
    const BAND_ROWS: usize = 256;
    let batch = outs.len();
    let mut bands: Vec<Vec<&mut [f32]>> = Vec::new();
    for out in outs.iter_mut() {
        for (band, rows) in out.as_mut().chunks_mut(BAND_ROWS).enumerate() {
            if band == bands.len() {
                bands.push(Vec::with_capacity(batch));
            }
            bands[band].push(rows);
        }
    }
    bands
        .into_par_iter()
        .zip(by_row.par_chunks(BAND_ROWS * batch))
        .for_each(|(mut band, by_row)| unweave_serially(by_row, &mut band));
}

fn unweave_serially<O: AsMut<[f32]>>(by_row: &[f32], outs: &mut [O]) {
    const ROWS_AT_ONCE: usize = 16;
    let batch = outs.len();
    if batch == 0 {
        return;
    }
    let rows = by_row.len() / batch;
    for start in (0..rows).step_by(ROWS_AT_ONCE) {
        let end = (start + ROWS_AT_ONCE).min(rows);
        for (b, out) in outs.iter_mut().enumerate() {
            let out = &mut out.as_mut()[start..end];
            for (i, o) in out.iter_mut().enumerate() {
                *o = by_row[(start + i) * batch + b];
            }
        }
    }
}

struct RowsOp<'a, 'm> {
    m: &'a QMatrix<'m>,
    first: usize,
    x: &'a [f32],
    xsum: &'a [[f32; 8]],
    y: &'a mut [f32],
}

impl pulp::WithSimd for RowsOp<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (i, out) in self.y.iter_mut().enumerate() {
            *out = row::dot(self.m, self.first + i, self.x, self.xsum);
        }
    }
}

/// Runs the kernel `make` builds compiled for AVX2, and for F16C too where the matrix takes
/// the token and the machine has it: f16 and FP8 rows without NaN codes widen each chunk through
/// `vcvtph2ps` instead of a dozen or ten integer operations (the same values, so the same bits),
/// and FP8, affine, MXFP4 and dense rows prefetch their bytes through it (a hint). `make` gets
/// the token to hand the kernel, or `None`.
#[cfg(target_arch = "x86_64")]
fn run_avx2<K: pulp::WithSimd<Output = ()>>(
    v3: pulp::x86::V3,
    m: &QMatrix,
    make: impl FnOnce(Option<x86_f16c::F16c>) -> K,
) {
    let takes_token = match m.format {
        Format::Fp8Block { .. } => !m.fp8_nan_codes,
        Format::Dense(_) | Format::Affine { .. } | Format::Mxfp4 => true,
    };
    let f16c = takes_token.then(x86_f16c::F16c::try_new).flatten();
    match f16c {
        Some(token) => {
            let kernel = make(f16c);
            token.vectorize(
                #[inline(always)]
                || kernel.with_simd(v3),
            )
        }
        None => pulp::Simd::vectorize(v3, make(None)),
    }
}

/// `x` times 256, for the F16C decoding of FP8 (which then skips its own multiply by 256 of
/// every weight): empty where the machine lacks F16C or where an element is not finite or is
/// so large (2^119 or more) that times 256 it could overflow, so that every product keeps
/// its bits.
fn fp8_x_times_256(x: &[f32]) -> Vec<[f32; 8]> {
    const TWO_TO_THE_119: f32 = f32::from_bits((127 + 119) << 23);
    #[cfg(target_arch = "x86_64")]
    if x86_f16c::F16c::try_new().is_some() && x.iter().all(|v| v.abs() < TWO_TO_THE_119) {
        return x
            .as_chunks::<8>()
            .0
            .iter()
            .map(|c| c.map(|v| v * 256.0))
            .collect();
    }
    let _ = x;
    Vec::new()
}

fn run_rows(m: &QMatrix, first: usize, x: &[f32], xsum: &[[f32; 8]], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(wide) = x86_vnni::Vnni512::try_new().filter(|_| avx2::takes_wide(m)) {
        let vbmi = x86_vnni::Vbmi512::try_new();
        return avx2::rows_wide(wide, vbmi, m, first, x, xsum, y);
    }
    run_rows_256(m, first, x, xsum, y)
}

/// `run_rows` with 512-bit registers but without VBMI's byte picks even where the CPU has
/// them (tests compare the paths).
fn run_rows_512_without_vbmi(
    m: &QMatrix,
    first: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(wide) = x86_vnni::Vnni512::try_new().filter(|_| avx2::takes_wide(m)) {
        return avx2::rows_wide(wide, None, m, first, x, xsum, y);
    }
    run_rows_256(m, first, x, xsum, y)
}

/// `run_rows` with 256-bit registers even where 512-bit ones exist (tests compare the paths).
fn run_rows_256(m: &QMatrix, first: usize, x: &[f32], xsum: &[[f32; 8]], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return run_avx2(v3, m, |f16c| avx2::Rows {
            v3,
            f16c,
            m,
            first,
            x,
            xsum,
            y,
        });
    }
    run_rows_portable(m, first, x, xsum, y);
}

fn run_rows_portable(m: &QMatrix, first: usize, x: &[f32], xsum: &[[f32; 8]], y: &mut [f32]) {
    pulp::Arch::new().dispatch(RowsOp {
        m,
        first,
        x,
        xsum,
        y,
    });
}

struct RowsBatchOp<'a, 'm> {
    m: &'a QMatrix<'m>,
    first: usize,
    xs: &'a [&'a [f32]],
    xsums: &'a [Vec<[f32; 8]>],
    out: &'a mut [f32],
}

impl pulp::WithSimd for RowsBatchOp<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let batch = self.xs.len();
        for (i, out) in self.out.chunks_exact_mut(batch).enumerate() {
            for (b, o) in out.iter_mut().enumerate() {
                *o = row::dot(self.m, self.first + i, self.xs[b], &self.xsums[b]);
            }
        }
    }
}

/// Rows `first..` against `x` (with its lane sums), into `y`.
type RowsKernel = fn(&QMatrix, usize, &[f32], &[[f32; 8]], &mut [f32]);

/// Rows `first..` against every vector of `xs` (with their lane sums), into
/// `out[i * batch + b]`.
type BatchRowsKernel = fn(&QMatrix, usize, &[&[f32]], &[Vec<[f32; 8]>], &mut [f32]);

/// Rows `first..` against every vector of `xs`, into `out[i * batch + b]`: tiles of rows and
/// vectors, each stored chunk decoded once per tile.
fn run_rows_batch(
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(vbmi) = x86_vnni::Vbmi512::try_new().filter(|_| avx2::takes_batch_tiled(m)) {
        let tiled = xs.len() / avx2::TILE_VECTORS * avx2::TILE_VECTORS;
        if tiled > 0 {
            avx2::rows_batch_tiled(vbmi, m, first, xs, xsums, tiled, out);
        }
        return rows_one_vector_at_a_time(m, first, xs, xsums, tiled, out);
    }
    run_rows_batch_256(m, first, xs, xsums, out)
}

/// Rows `first..` against the vectors of `xs` from `from` on, each in turn through `matvec`'s
/// own row kernel, into `out[i * batch + b]`: the vectors that fill no tile. Interleaved with
/// the tiles' vectors a quad of rows at a time, they ran slower than separate products.
fn rows_one_vector_at_a_time(
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    from: usize,
    out: &mut [f32],
) {
    let batch = xs.len();
    let mut y = [0f32; ROWS_PER_TASK];
    for (rows, out) in out.chunks_mut(ROWS_PER_TASK * batch).enumerate() {
        let n = out.len() / batch;
        let each = xs.iter().zip(xsums).enumerate().skip(from);
        for (b, (x, xsum)) in each {
            run_rows(m, first + rows * ROWS_PER_TASK, x, xsum, &mut y[..n]);
            for (i, v) in y[..n].iter().enumerate() {
                out[i * batch + b] = *v;
            }
        }
    }
}

/// `run_rows_batch` with 256-bit registers even where wider ones exist (tests compare the
/// paths).
fn run_rows_batch_256(
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return run_avx2(v3, m, |f16c| avx2::RowsBatch {
            v3,
            f16c,
            m,
            first,
            xs,
            xsums,
            out,
        });
    }
    run_rows_batch_portable(m, first, xs, xsums, out);
}

fn run_rows_batch_portable(
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    out: &mut [f32],
) {
    pulp::Arch::new().dispatch(RowsBatchOp {
        m,
        first,
        xs,
        xsums,
        out,
    });
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            actual,
        })
    }
}

impl QMatrix<'_> {
    /// What a row kernel needs of `x` besides `x`, in chunks of eight: the affine fold's lane
    /// sums (`row::lane_sums`); for FP8 matrices the F16C path decodes, `x` times 256
    /// (`fp8_x_times_256`); nothing otherwise. The portable path reads only the lane sums.
    fn kernel_inputs(&self, x: &[f32]) -> Vec<[f32; 8]> {
        match self.format {
            Format::Affine { group, .. } => row::lane_sums(x, group),
            Format::Fp8Block { .. } if !self.fp8_nan_codes => fp8_x_times_256(x),
            _ => Vec::new(),
        }
    }

    /// `y = W x` over all rows, in the matrix's [`Activations`].
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_rows(0..self.rows, x, y)
    }

    /// `y[i] = (W x)[rows.start + i]`: a band of output rows, bit-identical to the same rows
    /// of a full `matvec`.
    pub fn matvec_rows(
        &self,
        rows: Range<usize>,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        check_len("x", self.cols, x.len())?;
        check_len("y", rows.len(), y.len())?;
        if rows.end > self.rows {
            return Err(KernelError::Length {
                what: "the row range",
                expected: self.rows,
                actual: rows.end,
            });
        }
        if self.activations() == Activations::Int8 {
            return self.matvec_int8_band(rows, x, y);
        }
        let xsum = self.kernel_inputs(x);
        if rows.len() * self.cols < SERIAL_CELLS || rayon::current_num_threads() == 1 {
            run_rows(self, rows.start, x, &xsum, y);
        } else {
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(task, band)| {
                    run_rows(self, rows.start + task * ROWS_PER_TASK, x, &xsum, band);
                });
        }
        Ok(())
    }

    /// `Y = X W^T` for a small batch (in the matrix's [`Activations`]): `xs` holds `batch` input vectors one after another,
    /// `ys` receives `batch` output vectors one after another. Each output vector has exactly
    /// the bits `matvec` gives for its input. Threads take bands of rows; in a band, each
    /// stored chunk is decoded once for four vectors and each input chunk loaded once for two
    /// rows, every vector running `matvec`'s operations on the decoded values in its order.
    pub fn matmul(&self, xs: &[f32], batch: usize, ys: &mut [f32]) -> Result<(), KernelError> {
        self.matmul_with(xs, batch, ys, run_rows_batch)
    }

    /// `matmul` through the portable code even where an explicit SIMD path exists: tests
    /// compare the two bit for bit.
    #[doc(hidden)]
    pub fn matmul_portable(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_with(xs, batch, ys, run_rows_batch_portable)
    }

    /// `matmul` through the 256-bit code even where 512-bit registers exist: tests compare the
    /// paths bit for bit.
    #[doc(hidden)]
    pub fn matmul_256bit(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_with(xs, batch, ys, run_rows_batch_256)
    }

    fn matmul_with(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
        rows_kernel: BatchRowsKernel,
    ) -> Result<(), KernelError> {
        check_len("xs", batch * self.cols, xs.len())?;
        check_len("ys", batch * self.rows, ys.len())?;
        if batch == 0 {
            return Ok(());
        }
        if self.activations() == Activations::Int8 {
            return self.matmul_int8(xs, batch, ys);
        }
        let vectors: Vec<&[f32]> = xs.chunks_exact(self.cols).collect();
        let xsums: Vec<Vec<[f32; 8]>> = vectors.iter().map(|x| self.kernel_inputs(x)).collect();
        // Row-major by output row (`by_row[r * batch + b]`), so that a band of rows is one
        // contiguous slice a thread can own; transposed into `ys` at the end.
        let mut by_row = vec![0f32; self.rows * batch];
        let band = |task: usize, out: &mut [f32]| {
            rows_kernel(self, task * ROWS_PER_TASK, &vectors, &xsums, out);
        };
        if self.rows * self.cols < SERIAL_CELLS || rayon::current_num_threads() == 1 {
            by_row
                .chunks_mut(ROWS_PER_TASK * batch)
                .enumerate()
                .for_each(|(task, out)| band(task, out));
        } else {
            by_row
                .par_chunks_mut(ROWS_PER_TASK * batch)
                .enumerate()
                .for_each(|(task, out)| band(task, out));
        }
        let mut outs: Vec<&mut [f32]> = ys.chunks_exact_mut(self.rows).collect();
        unweave(&by_row, &mut outs);
        Ok(())
    }

    /// `matvec` on one thread through `run`, one of the row paths tests compare.
    fn matvec_through(&self, x: &[f32], y: &mut [f32], run: RowsKernel) -> Result<(), KernelError> {
        check_len("x", self.cols, x.len())?;
        check_len("y", self.rows, y.len())?;
        let xsum = self.kernel_inputs(x);
        run(self, 0, x, &xsum, y);
        Ok(())
    }

    /// `matvec` on one thread through the 256-bit code even where 512-bit registers exist:
    /// tests compare the paths bit for bit.
    #[doc(hidden)]
    pub fn matvec_256bit(&self, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_through(x, y, run_rows_256)
    }

    /// `matvec` on one thread through the 512-bit code without VBMI even where the CPU has it:
    /// tests compare the paths bit for bit.
    #[doc(hidden)]
    pub fn matvec_512bit_without_vbmi(&self, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_through(x, y, run_rows_512_without_vbmi)
    }

    /// `matvec` on one thread through the portable code (`row.rs`) even where an explicit
    /// SIMD path exists: tests compare the two bit for bit.
    #[doc(hidden)]
    pub fn matvec_portable(&self, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_through(x, y, run_rows_portable)
    }

    /// `y = W[rows]^T x`: `y[c] = sum over r in rows (ascending) of x[r - rows.start] * w[r][c]`,
    /// each row dequantized as `dequantize_row` gives it. Used for the absorbed attention of
    /// checkpoints that store `kv_b_proj` whole.
    pub fn vecmat_rows(
        &self,
        rows: Range<usize>,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        check_len("x", rows.len(), x.len())?;
        check_len("y", self.cols, y.len())?;
        if rows.end > self.rows {
            return Err(KernelError::Length {
                what: "the row range",
                expected: self.rows,
                actual: rows.end,
            });
        }
        y.fill(0.0);
        let mut w = vec![0f32; self.cols];
        for (r, &xr) in rows.zip(x) {
            row::dequantize_row(self, r, &mut w);
            for (out, &wc) in y.iter_mut().zip(&w) {
                *out += xr * wc;
            }
        }
        Ok(())
    }

    /// Row `r` as f32 values (an embedding lookup): one f32 operation per element.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        check_len("the output row", self.cols, out.len())?;
        if r >= self.rows {
            return Err(KernelError::Length {
                what: "the row index",
                expected: self.rows,
                actual: r,
            });
        }
        row::dequantize_row(self, r, out);
        Ok(())
    }
}
