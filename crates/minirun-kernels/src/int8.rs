//! Affine 4- and 8-bit and MXFP4 products with 8-bit activations: the input is quantized once
//! per vector, each group's dot product is an exact integer sum, and only the fold over groups
//! is in f32. This is a different arithmetic from the exact path (`mod.rs`), chosen for speed:
//! it is fixed and the same on every thread count and instruction set, but its results are not
//! the exact path's bits.
//!
//! # The arithmetic
//!
//! Quantizing `x` for groups of `G` columns (the matrix's affine group), for each group `g`:
//!
//! 1. `amax = max |x_k|` over the group (f32; a NaN input makes `amax` NaN).
//! 2. `d = amax / 127`; when `amax` is 0, `d = 0` and every code is 0.
//! 3. `q_k = round(x_k / d)` (half away from zero), clamped to [-127, 127] (a NaN gives 0).
//! 4. `sum`: lane `j` of 8 adds `x_{8c + j}` for ascending `c`, in f32, then
//!    `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
//!
//! Row `r`, with `w_k = s_g * c_k + b_g` (`c_k` the stored 4- or 8-bit codes):
//!
//! 1. `i_g = Σ c_k * q_k` over the group, exactly (an i32; at most 128 x 255 x 127 for
//!    8-bit codes).
//! 2. Eight accumulators `a_0..a_7 = 0`; for each group ascending,
//!    `a_{g mod 8} = a_{g mod 8} + ((s_g * d_g) * f32(i_g) + b_g * sum_g)`, each multiply and
//!    add a separate f32 operation (no fused multiply-add).
//! 3. `y_r = ((a_0 + a_4) + (a_2 + a_6)) + ((a_1 + a_5) + (a_3 + a_7))`.
//!
//! Eight accumulators rather than one: a single chain of adds bound a row to the add's
//! latency, and with eight, eight groups' terms are added in one vector instruction.
//!
//! MXFP4 rows (`w_k = 2^(e_g - 127) * e2m1(c_k)`, groups of 32) take the same steps with
//! integer weights: `t_k = 2 * e2m1(c_k)` is an integer in [-12, 12] ([`E2M1_DOUBLED`]), so
//!
//! 1. `i_g = Σ t_k * q_k` over the group, exactly (at most 32 x 12 x 127);
//! 2. `a_{g mod 8} = a_{g mod 8} + (h_g * d_g) * f32(i_g)`, with `h_g = e8m0(e_g) * 0.5`
//!    (exact: every e8m0 value halves without rounding; NaN for the code 0xFF), and no bias;
//! 3. `y_r` as above.
//!
//! Any order of the integer additions gives the same `i_g`, so the SIMD path (`avx2_int8.rs`)
//! may lay lanes out as it likes; the f32 operations are the same sequence on every path.

use std::ops::Range;

use rayon::prelude::*;

use super::format::{Format, QMatrix};
use super::int8_fold::{E2M1_DOUBLED, MXFP4_GROUP, combine, fold};
use super::int8_vector::Int8Vector;
use super::{KernelError, ROWS_PER_TASK, SERIAL_CELLS, check_len, unweave};

/// The group a matrix's 8-bit inputs are quantized for, or why 8-bit activations cannot run
/// on it.
fn input_group(m: &QMatrix) -> Result<usize, KernelError> {
    match m.format {
        Format::Affine {
            bits: 4 | 8, group, ..
        } => Ok(group),
        Format::Mxfp4 => Ok(MXFP4_GROUP),
        other => Err(KernelError::Shape {
            rows: m.rows,
            cols: m.cols,
            what: format!(
                "{other:?} weights and 8-bit activations (affine 4- and 8-bit and MXFP4 only)"
            ),
        }),
    }
}

/// Checks that `x` was quantized for the matrix's group and has its length.
fn check_input(m: &QMatrix, x: &Int8Vector) -> Result<(), KernelError> {
    let group = input_group(m)?;
    if group != x.group {
        return Err(KernelError::Shape {
            rows: m.rows,
            cols: m.cols,
            what: format!(
                "group {group} and an input quantized for groups of {}",
                x.group
            ),
        });
    }
    check_len("x", m.cols, x.len())
}

/// Row `r`'s product, portable code (the definition above, step by step).
pub(crate) fn dot_portable(m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
    let group = x.group;
    let groups = m.cols / group;
    let mut acc = [0f32; 8];
    for g in 0..groups {
        let codes = &x.codes[g * group..(g + 1) * group];
        let i = match m.format {
            Format::Affine { bits: 8, .. } => {
                let bytes = &m.packed[r * m.cols + g * group..r * m.cols + (g + 1) * group];
                bytes
                    .iter()
                    .zip(codes)
                    .map(|(&q, &c)| i32::from(q) * i32::from(c))
                    .sum()
            }
            _ => {
                let start = (r * m.cols + g * group) / 2;
                let bytes = &m.packed[start..start + group / 2];
                let weight = |code: u8| match m.format {
                    Format::Mxfp4 => i32::from(E2M1_DOUBLED[usize::from(code)]),
                    _ => i32::from(code),
                };
                let mut i = 0i32;
                for (k, &byte) in bytes.iter().enumerate() {
                    i += weight(byte & 15) * i32::from(codes[2 * k]);
                    i += weight(byte >> 4) * i32::from(codes[2 * k + 1]);
                }
                i
            }
        };
        fold(m, r * groups + g, &mut acc, i, x, g);
    }
    combine(acc)
}

type RowsBatchInt8 = fn(&QMatrix, usize, &[&Int8Vector], &mut [f32]);

fn rows_batch_portable(m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
    for (i, row_out) in out.chunks_exact_mut(xs.len()).enumerate() {
        for (o, x) in row_out.iter_mut().zip(xs) {
            *o = dot_portable(m, first + i, x);
        }
    }
}

fn rows_batch_fast(m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(wide) = x86_vnni::Vnni512::try_new() {
        return super::avx2_int8::rows_batch_vnni512(wide, m, first, xs, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = x86_vnni::Vnni::try_new() {
        return super::avx2_int8::rows_batch_vnni(vnni, m, first, xs, out);
    }
    rows_batch_avx2(m, first, xs, out)
}

/// The 256-bit VNNI path even where 512-bit VNNI exists (tests compare the paths).
fn rows_batch_vnni256(m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = x86_vnni::Vnni::try_new() {
        return super::avx2_int8::rows_batch_vnni(vnni, m, first, xs, out);
    }
    rows_batch_avx2(m, first, xs, out)
}

/// The AVX2 path even where VNNI exists (tests compare the paths).
fn rows_batch_avx2(m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return super::avx2_int8::rows_batch(v3, m, first, xs, out);
    }
    rows_batch_portable(m, first, xs, out)
}

impl QMatrix<'_> {
    /// `y = W x` with 8-bit activations (the module's arithmetic): affine 4- and 8-bit and
    /// MXFP4 matrices only, `x` quantized for the matrix's group. The same bits on any number
    /// of threads.
    pub fn matvec_int8(&self, x: &Int8Vector, y: &mut [f32]) -> Result<(), KernelError> {
        check_input(self, x)?;
        check_len("y", self.rows, y.len())?;
        self.int8_bands(0..self.rows, &[x], y, rows_batch_fast);
        Ok(())
    }

    /// `matvec_int8` through the portable code even where a SIMD path exists: tests compare
    /// the two bit for bit.
    #[doc(hidden)]
    pub fn matvec_int8_portable(&self, x: &Int8Vector, y: &mut [f32]) -> Result<(), KernelError> {
        check_input(self, x)?;
        check_len("y", self.rows, y.len())?;
        self.int8_bands(0..self.rows, &[x], y, rows_batch_portable);
        Ok(())
    }

    /// Rows `rows` of `W x`, `x` quantized here (what `matvec_rows` runs for a matrix whose
    /// activations are 8-bit; the caller checked the lengths and the range).
    pub(crate) fn matvec_int8_band(
        &self,
        rows: Range<usize>,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        let x = Int8Vector::quantize(x, input_group(self)?)?;
        check_input(self, &x)?;
        self.int8_bands(rows, &[&x], y, rows_batch_fast);
        Ok(())
    }

    /// `Y = X W^T` for `batch` vectors one after another in `xs` (into `ys`, likewise), each
    /// quantized here: every output vector has the bits of its own 8-bit-activation product,
    /// and each row of the matrix is read once for the whole batch.
    pub(crate) fn matmul_int8(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_int8_with(xs, batch, ys, rows_batch_fast)
    }

    /// `matmul` with 8-bit activations through the AVX2 code even where VNNI exists: tests
    /// compare the paths.
    #[doc(hidden)]
    pub fn matmul_int8_avx2(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_int8_with(xs, batch, ys, rows_batch_avx2)
    }

    /// `matmul` with 8-bit activations through the 256-bit VNNI code (octets of rows) even
    /// where 512-bit VNNI exists (sixteens): tests compare the paths.
    #[doc(hidden)]
    pub fn matmul_int8_vnni256(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_int8_with(xs, batch, ys, rows_batch_vnni256)
    }

    /// `matmul` with 8-bit activations through the portable code: tests compare the two.
    #[doc(hidden)]
    pub fn matmul_int8_portable(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
    ) -> Result<(), KernelError> {
        self.matmul_int8_with(xs, batch, ys, rows_batch_portable)
    }

    fn matmul_int8_with(
        &self,
        xs: &[f32],
        batch: usize,
        ys: &mut [f32],
        kernel: RowsBatchInt8,
    ) -> Result<(), KernelError> {
        let group = input_group(self)?;
        check_len("xs", batch * self.cols, xs.len())?;
        check_len("ys", batch * self.rows, ys.len())?;
        if batch == 0 {
            return Ok(());
        }
        // Quantized on whichever worker takes each vector where the product itself is split
        // between workers: on one, it would be the batch's serial part.
        let split = self.rows * self.cols >= SERIAL_CELLS && rayon::current_num_threads() > 1;
        let vectors = if batch > 1 && split {
            xs.par_chunks_exact(self.cols)
                .map(|x| Int8Vector::quantize(x, group))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            xs.chunks_exact(self.cols)
                .map(|x| Int8Vector::quantize(x, group))
                .collect::<Result<Vec<_>, _>>()?
        };
        let vectors: Vec<&Int8Vector> = vectors.iter().collect();
        let mut outs: Vec<&mut [f32]> = ys.chunks_exact_mut(self.rows).collect();
        self.int8_products(&vectors, &mut outs, kernel);
        Ok(())
    }

    /// `W x` for every vector of `xs`, each already quantized for this matrix's group (so that
    /// products sharing an input quantize it once), one output vector each: every output has
    /// the bits of its own product, and each row of the matrix is read once for the batch.
    pub fn matmul_quantized(&self, xs: &[&Int8Vector]) -> Result<Vec<Vec<f32>>, KernelError> {
        for x in xs {
            check_input(self, x)?;
        }
        let mut outs = vec![vec![0f32; self.rows]; xs.len()];
        self.int8_products(xs, &mut outs, rows_batch_fast);
        Ok(outs)
    }

    /// Every vector of `xs` (checked) into its output of `outs` (one per vector, `rows` long):
    /// a lone vector straight into its output, a batch row-major, then unweaved.
    fn int8_products<O: AsMut<[f32]>>(
        &self,
        xs: &[&Int8Vector],
        outs: &mut [O],
        kernel: RowsBatchInt8,
    ) {
        match outs {
            [] => {}
            [out] => self.int8_bands(0..self.rows, xs, out.as_mut(), kernel),
            _ => {
                let mut by_row = vec![0f32; self.rows * xs.len()];
                self.int8_bands(0..self.rows, xs, &mut by_row, kernel);
                unweave(&by_row, outs);
            }
        }
    }

    /// The group 8-bit inputs of this matrix are quantized for, when its products take 8-bit
    /// activations.
    pub fn int8_group(&self) -> Option<usize> {
        match self.activations() {
            super::Activations::Int8 => input_group(self).ok(),
            super::Activations::F32 => None,
        }
    }

    /// Rows `rows` against every vector of `xs` into `out[i * batch + b]`, split between
    /// threads by bands of rows (each row computed whole by one thread). On one thread a batch
    /// still goes band by band, so that a band's rows stay in cache for all its vectors
    /// instead of the whole matrix being read again for each.
    fn int8_bands(
        &self,
        rows: Range<usize>,
        xs: &[&Int8Vector],
        out: &mut [f32],
        kernel: RowsBatchInt8,
    ) {
        let batch = xs.len();
        if rows.len() * self.cols < SERIAL_CELLS || rayon::current_num_threads() == 1 {
            if batch == 1 {
                return kernel(self, rows.start, xs, out);
            }
            for (task, band) in out.chunks_mut(ROWS_PER_TASK * batch).enumerate() {
                kernel(self, rows.start + task * ROWS_PER_TASK, xs, band);
            }
        } else {
            out.par_chunks_mut(ROWS_PER_TASK * batch)
                .enumerate()
                .for_each(|(task, band)| kernel(self, rows.start + task * ROWS_PER_TASK, xs, band));
        }
    }
}
