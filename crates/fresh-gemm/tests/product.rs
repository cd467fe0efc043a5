//! `product` against a plain f64 sum of products, on row-major, transposed and banded
//! operands; refused shapes; and memory that held other values before: every element of a
//! result is written.

use fresh_gemm::{Matrix, ShapeError, product};
use proptest::prelude::*;

/// `(i, j)` of a row-major `rows x cols` matrix, summed in f64.
fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
        }
    }
    out
}

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], k: usize) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let bound = 1e-5 * (k as f64).sqrt() * (1.0 + w.abs());
        assert!((f64::from(*g) - w).abs() <= bound, "{g} against {w}");
    }
}

/// `b` stored transposed: `[n, k]` row-major.
fn transposed(b: &[f32], k: usize, n: usize) -> Vec<f32> {
    let mut t = vec![0f32; b.len()];
    for p in 0..k {
        for j in 0..n {
            t[j * k + p] = b[p * n + j];
        }
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn products_match_a_plain_sum(m in 1usize..70, k in 1usize..90, n in 1usize..70, seed: u64) {
        let (a, b) = (values(m * k, seed), values(k * n, seed ^ 1));
        let want = reference(&a, &b, m, k, n);
        let lhs = Matrix::row_major(&a, m, k).unwrap();
        let got = product(lhs, Matrix::row_major(&b, k, n).unwrap()).unwrap();
        assert_close(&got, &want, k);
        // The same product with the right operand read transposed in place.
        let bt = transposed(&b, k, n);
        let got = product(lhs, Matrix::row_major(&bt, n, k).unwrap().t()).unwrap();
        assert_close(&got, &want, k);
    }
}

#[test]
fn a_band_of_columns_is_read_in_place() {
    // A 4 x 6 matrix whose columns 2..5 are the left operand.
    let wide = values(24, 3);
    let band: Vec<f32> = (0..4)
        .flat_map(|i| wide[i * 6 + 2..i * 6 + 5].to_vec())
        .collect();
    let b = values(3 * 5, 4);
    let lhs = Matrix::strided(&wide[2..], 4, 3, 6, 1).unwrap();
    let got = product(lhs, Matrix::row_major(&b, 3, 5).unwrap()).unwrap();
    assert_close(&got, &reference(&band, &b, 4, 3, 5), 3);
}

#[test]
fn memory_that_held_other_values_is_overwritten_everywhere() {
    // Small enough for the allocator to hand the freed NaNs straight back.
    for (m, k, n) in [(17, 5, 23), (64, 64, 64), (1, 300, 7), (31, 1, 1)] {
        for _ in 0..4 {
            drop(vec![f32::NAN; m * n]);
            let (a, b) = (values(m * k, 7), values(k * n, 8));
            let got = product(
                Matrix::row_major(&a, m, k).unwrap(),
                Matrix::row_major(&b, k, n).unwrap(),
            )
            .unwrap();
            assert!(got.iter().all(|v| v.is_finite()), "{m} x {k} x {n}");
            assert_close(&got, &reference(&a, &b, m, k, n), k);
        }
    }
}

#[test]
fn empty_inner_sizes_give_zeros_and_empty_results_nothing() {
    let none: [f32; 0] = [];
    let a = Matrix::row_major(&none, 3, 0).unwrap();
    let b = Matrix::row_major(&none, 0, 2).unwrap();
    assert_eq!(product(a, b).unwrap(), vec![0.0; 6]);
    let a = Matrix::row_major(&none, 0, 4).unwrap();
    let b = Matrix::row_major(&[1.0; 8], 4, 2).unwrap();
    assert_eq!(product(a, b).unwrap(), Vec::<f32>::new());
}

#[test]
fn operands_past_their_slices_and_mismatched_sizes_are_refused() {
    let six = [1.0f32; 6];
    assert!(matches!(
        Matrix::row_major(&six, 2, 4),
        Err(ShapeError::OutOfBounds { len: 6, .. })
    ));
    assert!(Matrix::strided(&six, 2, 3, 4, 1).is_err());
    assert!(Matrix::strided(&six, 2, 2, usize::MAX, 1).is_err());
    let a = Matrix::row_major(&six, 2, 3).unwrap();
    assert_eq!(
        product(a, a).unwrap_err(),
        ShapeError::Mismatch {
            lhs_rows: 2,
            lhs_cols: 3,
            rhs_rows: 2,
            rhs_cols: 3
        }
    );
}
