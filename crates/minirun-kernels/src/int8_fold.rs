//! The f32 steps of the 8-bit row arithmetic (`int8.rs`) that every path shares: MXFP4's
//! integer weights and halved scales, each group's term folded into its accumulator, and the
//! accumulators combined. One copy, so the portable and SIMD paths cannot drift apart in bits.

use crate::format::{Format, QMatrix};
use crate::int8_vector::Int8Vector;

/// The group of columns an MXFP4 scale covers, and so the group its 8-bit inputs take.
pub(crate) const MXFP4_GROUP: usize = 32;

/// Twice the e2m1 value of each 4-bit code: integers, so that MXFP4 group sums are exact.
pub(crate) const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the value of an e8m0 scale byte, `h_g` of the MXFP4 fold.
#[inline(always)]
pub(crate) fn mxfp4_half_scale(byte: u8) -> f32 {
    crate::decode::e8m0(u32::from(byte)) * 0.5
}

/// Step 2 of the row arithmetic: group `g`'s term (the matrix's group `index`) added to its
/// accumulator.
#[inline(always)]
pub(crate) fn fold(
    m: &QMatrix,
    index: usize,
    acc: &mut [f32; 8],
    i: i32,
    x: &Int8Vector,
    g: usize,
) {
    match m.format {
        Format::Affine { scale, .. } => {
            let s = scale.read(m.scales, index);
            let b = scale.read(m.biases, index);
            acc[g % 8] += (s * x.steps[g]) * i as f32 + b * x.sums[g];
        }
        Format::Mxfp4 => {
            let h = mxfp4_half_scale(m.scales[index]);
            acc[g % 8] += (h * x.steps[g]) * i as f32;
        }
        // Reached only by a caller's mistake: the whole row turns NaN rather than a number.
        _ => acc.fill(f32::NAN),
    }
}

/// Step 3: the accumulators added pairwise.
#[inline(always)]
pub(crate) fn combine(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::FloatType;

    /// A format the 8-bit fold has no step for turns the row NaN, never a plausible number.
    #[test]
    fn a_format_without_an_8_bit_fold_poisons_the_row() {
        let packed = [0u8; 4 * 32];
        let m = QMatrix {
            format: Format::Dense(FloatType::F32),
            rows: 1,
            cols: 32,
            packed: &packed,
            scales: &[],
            biases: &[],
            fp8_nan_codes: false,
            activations: crate::Activations::Int8,
        };
        let x = Int8Vector::quantize(&[1.0; 32], MXFP4_GROUP).unwrap();
        let mut acc = [0.0f32; 8];
        fold(&m, 0, &mut acc, 5, &x, 0);
        assert!(combine(acc).is_nan());
    }
}
