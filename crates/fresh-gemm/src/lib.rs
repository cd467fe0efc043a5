//! f32 matrix products written straight into freshly allocated memory.
//!
//! candle's CPU matmul allocates its result zeroed (`vec![0.0; m * n]`) and then has gemm
//! overwrite every element without reading it. The zeroing is a full pass over the result on
//! the calling thread, while the product itself runs on every core: in a training step that
//! allocates hundreds of megabytes of products, a serial pass the size of all of them. This
//! crate makes the same gemm call (same kernels, same parameters, so the same bits) into
//! memory that has not been written, and hands it back as a `Vec` once gemm has written
//! every element.
//!
//! ```
//! use fresh_gemm::{Matrix, product};
//! let a = Matrix::row_major(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).unwrap();
//! let b = Matrix::row_major(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 3, 2).unwrap();
//! assert_eq!(product(a, b).unwrap(), vec![4.0, 5.0, 10.0, 11.0]);
//! // The transpose is a view: no copy.
//! assert_eq!(product(a, a.t()).unwrap(), vec![14.0, 32.0, 32.0, 77.0]);
//! ```

use gemm::Parallelism;

/// Why a matrix or a product was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error(
        "a {rows} x {cols} matrix with strides ({row_stride}, {col_stride}) reaches past a slice of {len} values"
    )]
    OutOfBounds {
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
        len: usize,
    },
    #[error(
        "a product of {lhs_rows} x {lhs_cols} by {rhs_rows} x {rhs_cols}: the inner sizes differ"
    )]
    Mismatch {
        lhs_rows: usize,
        lhs_cols: usize,
        rhs_rows: usize,
        rhs_cols: usize,
    },
    #[error("a {rows} x {cols} result has more elements than memory can address")]
    TooLarge { rows: usize, cols: usize },
}

/// An f32 matrix read from a slice: element `(i, j)` is `values[i * row_stride + j *
/// col_stride]`, every one of them inside the slice (checked when it is made).
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Matrix<'a> {
    /// `rows x cols` values stored row after row.
    pub fn row_major(values: &'a [f32], rows: usize, cols: usize) -> Result<Self, ShapeError> {
        Self::strided(values, rows, cols, cols, 1)
    }

    /// A matrix laid out with any non-negative strides (a transpose, a band of columns).
    pub fn strided(
        values: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Result<Self, ShapeError> {
        let matrix = Matrix {
            values,
            rows,
            cols,
            row_stride,
            col_stride,
        };
        let out_of_bounds = ShapeError::OutOfBounds {
            rows,
            cols,
            row_stride,
            col_stride,
            len: values.len(),
        };
        if rows > 0 && cols > 0 {
            let last = (rows - 1)
                .checked_mul(row_stride)
                .zip((cols - 1).checked_mul(col_stride))
                .and_then(|(a, b)| a.checked_add(b));
            match last {
                Some(last) if last < values.len() => {}
                _ => return Err(out_of_bounds),
            }
        }
        if isize::try_from(row_stride).is_err() || isize::try_from(col_stride).is_err() {
            return Err(out_of_bounds);
        }
        Ok(matrix)
    }

    /// The transpose, reading the same values.
    pub fn t(self) -> Self {
        Matrix {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// `lhs x rhs`, row-major `[lhs.rows(), rhs.cols()]`, split over rayon's threads. Each
/// element is gemm's sum of its `k` products, whatever the number of threads.
pub fn product(lhs: Matrix<'_>, rhs: Matrix<'_>) -> Result<Vec<f32>, ShapeError> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    if rhs.rows != k {
        return Err(ShapeError::Mismatch {
            lhs_rows: m,
            lhs_cols: k,
            rhs_rows: rhs.rows,
            rhs_cols: n,
        });
    }
    let len = m
        .checked_mul(n)
        .filter(|&len| isize::try_from(len).is_ok())
        .ok_or(ShapeError::TooLarge { rows: m, cols: n })?;
    if len == 0 || k == 0 {
        // gemm's result of an empty inner dimension is all zeros; nothing to multiply.
        return Ok(vec![0.0; len]);
    }
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    let mut dst: Vec<f32> = Vec::with_capacity(len);
    write_product(&mut dst, lhs, rhs, parallelism);
    Ok(dst)
}

/// gemm's `dst = lhs x rhs` into `dst`'s spare capacity, then `dst`'s length set to the
/// `lhs.rows x rhs.cols` elements it wrote. The caller has checked the sizes: `dst` has
/// room for them, `lhs.cols == rhs.rows > 0`, and both operands lie inside their slices.
#[allow(unsafe_code)]
fn write_product(dst: &mut Vec<f32>, lhs: Matrix<'_>, rhs: Matrix<'_>, parallelism: Parallelism) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(dst.capacity() >= m * n && rhs.rows == k && k > 0);
    let [lhs_rs, lhs_cs, rhs_rs, rhs_cs] = [
        lhs.row_stride,
        lhs.col_stride,
        rhs.row_stride,
        rhs.col_stride,
    ]
    .map(|s| s as isize);
    let out = dst.spare_capacity_mut().as_mut_ptr().cast::<f32>();
    // SAFETY: every element gemm reads, `(i, j)` of either operand, is inside its slice
    // (`Matrix::strided` checked the last one; strides are non-negative and fit isize). gemm
    // writes the `m x n` row-major elements of `out`, inside the capacity asserted above, and
    // with `read_dst` false it never reads them (the destination is scaled by `alpha` only
    // when read; `beta` scales the product). These are the parameters candle's CPU matmul
    // passes.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            n as isize,
            false,
            lhs.values.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.values.as_ptr(),
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        // SAFETY: gemm has written all `m x n` elements (with `k > 0` it stores every block
        // of the destination).
        dst.set_len(m * n);
    }
}
