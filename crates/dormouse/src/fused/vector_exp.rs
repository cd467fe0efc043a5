//! `exp` over whole vectors, with the same bits at every vector width and in the scalar tail.
//!
//! `exp(x) = 2^k exp(r)` with `k = round(x / ln 2)` (by the 1.5 x 2^23 rounding trick) and
//! `r = x - k ln 2` (ln 2 split in two parts, so `r` is exact to f32), then Cephes' degree-6
//! polynomial for `exp(r)` on `|r| <= ln 2 / 2`, and `2^k` built in the exponent bits. Every
//! step is a separate f32 multiply or add, never fused, so a lane computes the same bits in a
//! 16-lane, an 8-lane or a 1-lane (pulp's `Scalar`) register. Within 2 ulp of the true value
//! on `[-87.3, 88.37]`; below it the result is 0, above it is clamped.

use pulp::Simd;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 x 2^23`: adding it rounds a float of magnitude below 2^22 to an integer.
const ROUNDER: f32 = 12_582_912.0;
const SMALLEST: f32 = -87.3;
const LARGEST: f32 = 88.37;
/// Cephes `expf`'s coefficients, highest degree first.
const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `exp` of every lane of `x`.
#[inline(always)]
pub fn exp_vector<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let splat = |v: f32| simd.splat_f32s(v);
    let underflow = simd.less_than_f32s(x, splat(SMALLEST));
    let x = simd.min_f32s(simd.max_f32s(x, splat(SMALLEST)), splat(LARGEST));
    let shifted = simd.add_f32s(simd.mul_f32s(x, splat(LOG2_E)), splat(ROUNDER));
    let k = simd.sub_f32s(shifted, splat(ROUNDER));
    let r = simd.sub_f32s(x, simd.mul_f32s(k, splat(LN2_HI)));
    let r = simd.sub_f32s(r, simd.mul_f32s(k, splat(LN2_LO)));
    let mut p = splat(POLY[0]);
    for &c in &POLY[1..] {
        p = simd.add_f32s(simd.mul_f32s(p, r), splat(c));
    }
    let r2 = simd.mul_f32s(r, r);
    let e = simd.add_f32s(simd.add_f32s(simd.mul_f32s(p, r2), r), splat(1.0));
    // The integer k sits in the low mantissa bits of `shifted`; moved into the exponent field
    // and biased, it is 2^k (the rounder's own bits shift out of the word).
    let bits = simd.transmute_u32s_f32s(shifted);
    let bits = simd.wrapping_dyn_shl_u32s(bits, simd.splat_u32s(23));
    let two_k = simd.transmute_f32s_u32s(simd.add_u32s(bits, simd.splat_u32s(127 << 23)));
    simd.select_f32s(underflow, splat(0.0), simd.mul_f32s(e, two_k))
}

/// `exp` of every element of `values`, in place.
#[inline(always)]
pub fn exp_in_place<S: Simd>(simd: S, values: &mut [f32]) {
    let lanes = S::F32_LANES;
    let whole = values.len() - values.len() % lanes;
    let (body, tail) = values.split_at_mut(whole);
    for chunk in body.chunks_exact_mut(lanes) {
        let x: S::f32s = bytemuck::pod_read_unaligned(bytemuck::cast_slice(chunk));
        chunk.copy_from_slice(bytemuck::cast_slice(std::slice::from_ref(&exp_vector(
            simd, x,
        ))));
    }
    let scalar = pulp::Scalar::new();
    for v in tail {
        *v = exp_vector(scalar, *v);
    }
}

/// [`exp_in_place`] compiled for the widest vector instructions this CPU has.
pub fn exp_all(values: &mut [f32]) {
    struct Exp<'a>(&'a mut [f32]);
    impl pulp::WithSimd for Exp<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            exp_in_place(simd, self.0)
        }
    }
    pulp::Arch::new().dispatch(Exp(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar_exp(x: f32) -> f32 {
        exp_vector(pulp::Scalar::new(), x)
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_f64_exp_across_its_range() {
        let mut worst = 0f64;
        let mut x = SMALLEST;
        while x < LARGEST {
            let ours = f64::from(scalar_exp(x));
            let truth = f64::from(x).exp();
            let ulp = f64::from(((truth as f32).next_up() - truth as f32).abs());
            worst = worst.max((ours - truth).abs() / ulp);
            x += 0.013_7;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
    }

    #[test]
    fn every_vector_width_gives_the_scalar_bits() {
        let mut values: Vec<f32> = (0..1000).map(|i| (i as f32 - 600.0) * 0.173).collect();
        let expected: Vec<u32> = values.iter().map(|&x| scalar_exp(x).to_bits()).collect();
        exp_all(&mut values);
        let got: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn far_below_the_range_is_zero_and_exp_of_zero_is_one() {
        assert_eq!(scalar_exp(-1000.0), 0.0);
        assert_eq!(scalar_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(scalar_exp(0.0), 1.0);
    }
}
