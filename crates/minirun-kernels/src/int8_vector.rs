//! The input of the 8-bit arithmetic (`int8.rs`): a vector quantized once per group (steps 1
//! to 4 of its quantization), laid out for both the portable and the SIMD row paths.

use crate::KernelError;

/// Columns of one block of quantized codes: the SIMD path reads two blocks (one 32-byte
/// register of 4-bit codes) at a time.
pub(crate) const BLOCK: usize = 32;

/// An input vector quantized to 8 bits for groups of `group` columns.
#[derive(Debug, Clone)]
pub struct Int8Vector {
    pub(crate) group: usize,
    /// The codes of each pair of 32-column blocks as `[even columns of both, odd columns of
    /// both]`, 64 bytes a pair, the last pair zero-padded: the order in which the low and high
    /// nibbles of 32 packed bytes line up with them.
    pub(crate) paired: Vec<i8>,
    /// The codes in column order (the portable path reads these).
    pub(crate) codes: Vec<i8>,
    /// `d_g` per group.
    pub(crate) steps: Vec<f32>,
    /// `sum_g` per group.
    pub(crate) sums: Vec<f32>,
}

impl Int8Vector {
    /// Quantizes `x` for groups of `group` columns (32, 64 or 128, dividing `x.len()`).
    pub fn quantize(x: &[f32], group: usize) -> Result<Int8Vector, KernelError> {
        if !matches!(group, 32 | 64 | 128) || !x.len().is_multiple_of(group) || x.is_empty() {
            return Err(KernelError::Shape {
                rows: 1,
                cols: x.len(),
                what: format!("8-bit activations in groups of {group}"),
            });
        }
        let mut codes = vec![0i8; x.len()];
        let mut steps = Vec::with_capacity(x.len() / group);
        let mut sums = Vec::with_capacity(x.len() / group);
        pulp::Arch::new().dispatch(QuantizeGroups {
            x,
            group,
            codes: &mut codes,
            steps: &mut steps,
            sums: &mut sums,
        });
        let paired = pair_blocks(&codes);
        Ok(Int8Vector {
            group,
            paired,
            codes,
            steps,
            sums,
        })
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    pub fn group(&self) -> usize {
        self.group
    }
}

/// Steps 1 to 4 for every group, compiled for the widest instructions the machine has (each
/// step is element-wise or a fixed-order sum, so every width gives the same bits).
struct QuantizeGroups<'a> {
    x: &'a [f32],
    pub(crate) group: usize,
    codes: &'a mut [i8],
    steps: &'a mut Vec<f32>,
    sums: &'a mut Vec<f32>,
}

impl pulp::WithSimd for QuantizeGroups<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let groups = self.x.chunks_exact(self.group);
        for (g, codes) in groups.zip(self.codes.chunks_exact_mut(self.group)) {
            let amax = in_lanes(g, 0f32, |m, v| {
                let a = v.abs();
                if a > m || a.is_nan() { a } else { m }
            });
            let d = amax / 127.0;
            for (code, &v) in codes.iter_mut().zip(g) {
                let q = if amax == 0.0 {
                    0.0
                } else {
                    round_half_away(v / d)
                };
                *code = code_of(q);
            }
            self.steps.push(d);
            self.sums.push(in_lanes(g, 0f32, |s, v| s + v));
        }
    }
}

/// `op` folded over `values` in 8 lanes (lane `j` takes elements `8c + j`, `c` ascending, from
/// `init`), the lanes then combined as `((l0 op l4) op (l2 op l6)) op ((l1 op l5) op (l3 op
/// l7))`; `values.len()` is a multiple of 8.
#[inline(always)]
fn in_lanes(values: &[f32], init: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [init; 8];
    for chunk in values.as_chunks::<8>().0 {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = op(*lane, v);
        }
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    op(op(op(l0, l4), op(l2, l6)), op(op(l1, l5), op(l3, l7)))
}

/// `q.clamp(-127.0, 127.0) as i8` (NaN to 0) in operations that vectorize: a float `as` an
/// integer saturates lane by lane, which compilers emit one element at a time. Adding 1.5 x 2^23
/// to an integer-valued float of magnitude at most 127 leaves it exactly in the low mantissa
/// bits, whose low byte is the code in two's complement.
#[inline(always)]
fn code_of(q: f32) -> i8 {
    const MANTISSA_SHIFT: f32 = 12_582_912.0;
    let clamped = q.clamp(-127.0, 127.0);
    let finite = if clamped.is_nan() { 0.0 } else { clamped };
    (finite + MANTISSA_SHIFT).to_bits() as u8 as i8
}

/// `v.round()` (half away from zero) in operations that vectorize: `v - trunc(v)` is exact.
#[inline(always)]
fn round_half_away(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + 1f32.copysign(v)
    } else {
        t
    }
}

fn pair_blocks(codes: &[i8]) -> Vec<i8> {
    let pairs = codes.len().div_ceil(2 * BLOCK);
    let mut paired = vec![0i8; pairs * 2 * BLOCK];
    for (p, out) in paired.chunks_exact_mut(2 * BLOCK).enumerate() {
        let (even, odd) = out.split_at_mut(BLOCK);
        for half in 0..2 {
            let start = (2 * p + half) * BLOCK;
            let Some(block) = codes.get(start..start + BLOCK) else {
                break;
            };
            for j in 0..BLOCK / 2 {
                even[half * BLOCK / 2 + j] = block[2 * j];
                odd[half * BLOCK / 2 + j] = block[2 * j + 1];
            }
        }
    }
    paired
}

#[cfg(test)]
mod tests {
    use super::{code_of, round_half_away};

    /// The vectorizable code is the saturating cast on every value class: the clamp's ends,
    /// values past them both ways, NaN, infinities, signed zeros, and a stride through all bits.
    #[test]
    fn code_of_is_the_clamped_saturating_cast() {
        let special = [
            127.0,
            -127.0,
            128.0,
            -128.0,
            126.0,
            -1.0,
            0.0,
            -0.0,
            1e30,
            -1e30,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let integers = (-300..=300).map(|i| i as f32);
        let stride = (0..u32::MAX).step_by(4099).map(f32::from_bits);
        for q in special.into_iter().chain(integers).chain(stride) {
            let q = round_half_away(q);
            assert_eq!(code_of(q), q.clamp(-127.0, 127.0) as i8, "{q:e}");
        }
    }

    /// The vectorizable rounding is `f32::round` on every value class: halves both ways,
    /// values past 2^23 (already integers), infinities, NaN, and a stride through all bits.
    #[test]
    fn round_half_away_is_f32_round() {
        let special = [
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            126.5,
            -126.5,
            0.49999997,
            -0.49999997,
            0.0,
            -0.0,
            8388607.5,
            8388608.0,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
        ];
        let stride = (0..u32::MAX).step_by(4099).map(f32::from_bits);
        for v in special.into_iter().chain(stride) {
            let (got, want) = (round_half_away(v), v.round());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{v:e}: {got:e}, f32::round gives {want:e}"
            );
        }
    }
}
