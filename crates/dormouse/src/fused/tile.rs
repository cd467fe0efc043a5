//! The register tiles of the attention kernels: `R` rows of `N` vectors of sums at once, so
//! each vector loaded serves `R` rows and `R x N` independent sums keep the adder busy where
//! one sum would wait for each add before the next.
//!
//! Every sum adds its terms in the order given, each term one fused multiply-add (a single
//! rounding: the FMA instruction in a vector, a correctly rounded `mul_add` in pulp's scalar
//! path and the tails), so a lane gets the same bits in a 16-lane, an 8-lane or a 1-lane
//! register.

use pulp::Simd;

/// The widest vectors' lanes (AVX-512): key strides padded to a multiple of
/// [`KEY_PADDING`] let a group of four of them never read past a row.
const WIDEST_LANES: usize = 16;

/// Vectors per row of a tile at most.
pub const MAX_VECTORS: usize = 4;

/// Key strides are padded to a multiple of this.
pub const KEY_PADDING: usize = MAX_VECTORS * WIDEST_LANES;

/// `[rows, cols]` to `[cols, stride]` (`stride >= rows`; the padding is left as it is).
#[inline(always)]
pub fn transpose_into(dst: &mut [f32], src: &[f32], cols: usize, stride: usize) {
    for (r, row) in src.chunks_exact(cols).enumerate() {
        for (c, &value) in row.iter().enumerate() {
            dst[c * stride + r] = value;
        }
    }
}

#[inline(always)]
fn load<S: Simd>(values: &[f32]) -> S::f32s {
    bytemuck::pod_read_unaligned(bytemuck::cast_slice(&values[..S::F32_LANES]))
}

/// `acc[r][b] = sum over t in range of coef(r, t) x rows[t][offset + b x lanes..]`, `rows`
/// `row_stride` apart, summed in order of `t`.
#[inline(always)]
pub fn tile<S: Simd, const R: usize, const N: usize>(
    simd: S,
    rows: &[f32],
    (row_stride, offset): (usize, usize),
    range: std::ops::Range<usize>,
    coef: impl Fn(usize, usize) -> f32,
) -> [[S::f32s; N]; R] {
    let lanes = S::F32_LANES;
    let mut acc = [[simd.splat_f32s(0.0); N]; R];
    for t in range {
        let row = &rows[t * row_stride + offset..][..N * lanes];
        let values: [S::f32s; N] = std::array::from_fn(|b| load::<S>(&row[b * lanes..]));
        for (r, acc) in acc.iter_mut().enumerate() {
            let c = simd.splat_f32s(coef(r, t));
            for (a, &v) in acc.iter_mut().zip(&values) {
                *a = simd.mul_add_f32s(c, v, *a);
            }
        }
    }
    acc
}

/// `write(r, c, sum)` for every output `c < width` of `R` rows, where
/// `sum = sum over t in range of coef(r, t) x rows[t][c]` (`rows` `row_stride` apart, at least
/// `width` long), in order of `t`.
#[inline(always)]
pub fn row_sums<S: Simd, const R: usize>(
    simd: S,
    rows: &[f32],
    (row_stride, width): (usize, usize),
    range: std::ops::Range<usize>,
    coef: impl Fn(usize, usize) -> f32,
    mut write: impl FnMut(usize, usize, &[f32]),
) {
    let lanes = S::F32_LANES;
    let mut at = 0;
    while width - at >= lanes {
        let place = (row_stride, at);
        let mut put = |r: usize, sums: &[f32]| write(r, at, sums);
        let taken = match ((width - at) / lanes).min(MAX_VECTORS) {
            1 => emit(
                &tile::<S, R, 1>(simd, rows, place, range.clone(), &coef),
                &mut put,
            ),
            2 => emit(
                &tile::<S, R, 2>(simd, rows, place, range.clone(), &coef),
                &mut put,
            ),
            3 => emit(
                &tile::<S, R, 3>(simd, rows, place, range.clone(), &coef),
                &mut put,
            ),
            _ => emit(
                &tile::<S, R, 4>(simd, rows, place, range.clone(), &coef),
                &mut put,
            ),
        };
        at += taken;
    }
    if at < width {
        // Fewer outputs than lanes are left: one at a time, in the same order.
        let mut sums = [0f32; WIDEST_LANES];
        let sums = &mut sums[..(width - at).min(WIDEST_LANES)];
        for r in 0..R {
            sums.fill(0.0);
            for t in range.clone() {
                let c = coef(r, t);
                let row = &rows[t * row_stride + at..][..sums.len()];
                for (s, &v) in sums.iter_mut().zip(row) {
                    *s = c.mul_add(v, *s);
                }
            }
            write(r, at, sums);
        }
    }
}

/// [`row_sums`] for `rows` rows, 1 to 4, chosen at run time.
#[inline(always)]
pub fn row_sums_of<S: Simd>(
    simd: S,
    rows: usize,
    matrix: &[f32],
    place: (usize, usize),
    range: std::ops::Range<usize>,
    coef: impl Fn(usize, usize) -> f32,
    write: impl FnMut(usize, usize, &[f32]),
) {
    match rows {
        1 => row_sums::<S, 1>(simd, matrix, place, range, coef, write),
        2 => row_sums::<S, 2>(simd, matrix, place, range, coef, write),
        3 => row_sums::<S, 3>(simd, matrix, place, range, coef, write),
        _ => row_sums::<S, 4>(simd, matrix, place, range, coef, write),
    }
}

/// Hands each tile row to `put` as f32s; returns the elements per row.
#[inline(always)]
fn emit<V: bytemuck::Pod, const N: usize, const R: usize>(
    acc: &[[V; N]; R],
    put: &mut impl FnMut(usize, &[f32]),
) -> usize {
    let mut len = 0;
    for (r, row) in acc.iter().enumerate() {
        let values = bytemuck::cast_slice::<_, f32>(row);
        len = values.len();
        put(r, values);
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `row_sums` of 4 rows over a `[terms, 70]` matrix (four vectors, a remainder of whole
    /// vectors and a scalar tail at every width), as bits.
    fn sums_at<S: Simd>(simd: S, matrix: &[f32], coefs: &[f32]) -> Vec<u32> {
        let (width, terms) = (70, matrix.len() / 70);
        let mut out = vec![0u32; 4 * width];
        row_sums::<S, 4>(
            simd,
            matrix,
            (width, width),
            0..terms,
            |r, t| coefs[r * terms + t],
            |r, at, sums| {
                for (o, s) in out[r * width + at..].iter_mut().zip(sums) {
                    *o = s.to_bits();
                }
            },
        );
        out
    }

    #[test]
    fn every_vector_width_gives_the_scalar_bits() {
        let value = |i: usize| ((i * 7919 % 1009) as f32 - 504.0) / 97.0;
        let matrix: Vec<f32> = (0..33 * 70).map(value).collect();
        let coefs: Vec<f32> = (0..4 * 33).map(|i| value(i * 31 + 5)).collect();
        let scalar = sums_at(pulp::Scalar::new(), &matrix, &coefs);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(v3) = pulp::x86::V3::try_new() {
                assert_eq!(sums_at(v3, &matrix, &coefs), scalar, "8 lanes");
            }
            if let Some(v4) = pulp::x86::V4::try_new() {
                assert_eq!(sums_at(v4, &matrix, &coefs), scalar, "16 lanes");
            }
        }
        assert!(scalar.iter().any(|&b| b != 0));
    }
}
