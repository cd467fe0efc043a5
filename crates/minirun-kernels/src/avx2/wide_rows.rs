//! The exact path's four rows at once (`dot4`) with 512-bit registers (`x86_vnni::Vnni512`)
//! for affine 4- and 8-bit, MXFP4 and BF16 matrices: rows `r` and `r + 1` share one register
//! (row `r` in the eight low lanes, row `r + 1` in the eight high ones), as do rows `r + 2`
//! and `r + 3`.
//! Every lane does the operations of its row's lane in `dot4`, in the same order (a decoded
//! weight times `x`, added into the segment's part; the part folded into the row's
//! accumulators at the segment's end; the same eight-lane reduction), so each row keeps its
//! bits while each instruction does two rows' work.

use pulp::bytemuck::cast;
use pulp::f32x8;
use std::arch::x86_64::{__m256i, __m512, __m512i};
use x86_vnni::Vnni512;

use super::{CACHE_LINE, E2M1_POSITIVE, NIBBLE_SHIFTS, PREFETCH_DISTANCE, four_ahead, reduce};
use crate::decode;
use crate::format::{FloatType, Format, QMatrix};

/// Whether [`dot4_wide`] decodes this format.
pub(super) fn decodes(format: Format) -> bool {
    matches!(
        format,
        Format::Affine { bits: 4 | 8, .. } | Format::Mxfp4 | Format::Dense(FloatType::BF16)
    )
}

/// `dot4` for the formats [`decodes`] names; `None` for the others.
#[inline(always)]
pub(super) fn dot4_wide(
    wide: Vnni512,
    m: &QMatrix,
    r: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
) -> Option<[f32; 4]> {
    let row_bytes = m.row_bytes();
    let rows: [&[u8]; 4] =
        std::array::from_fn(|i| &m.packed[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
    let tail = m.packed.get(r * row_bytes..).unwrap_or(&[]);
    match m.format {
        Format::Affine { bits, group, scale } => {
            let groups = m.cols / group;
            let pair = |i: usize| AffinePair {
                m,
                scale,
                first_groups: [(r + i) * groups, (r + i + 1) * groups],
                xsum,
            };
            let k = [pair(0), pair(2)];
            match bits {
                4 => Some(segmented4_wide::<4, _>(wide, rows, tail, x, group, &k)),
                8 => Some(segmented4_wide::<8, _>(wide, rows, tail, x, group, &k)),
                _ => None,
            }
        }
        Format::Mxfp4 => {
            let groups = m.cols / 32;
            let pair = |i: usize| Mxfp4Pair {
                scales: m.scales,
                first: [(r + i) * groups, (r + i + 1) * groups],
            };
            let k = [pair(0), pair(2)];
            Some(segmented4_wide::<4, _>(wide, rows, tail, x, 32, &k))
        }
        Format::Dense(FloatType::BF16) => Some(dense4_wide(wide, rows, tail, x)),
        _ => None,
    }
}

/// How a format decodes one chunk of two rows (eight weights each, row `r` to the low lanes)
/// and folds a segment's part into their accumulators.
trait PairSegments<const CB: usize> {
    fn decode(&self, wide: Vnni512, low: &[u8; CB], high: &[u8; CB]) -> __m512;
    fn finish(&self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512;
}

/// Affine 4- and 8-bit: codes to f32; a segment (group) folded as `s * part + b * xsum`.
struct AffinePair<'a, 'm> {
    m: &'a QMatrix<'m>,
    scale: FloatType,
    first_groups: [usize; 2],
    xsum: &'a [[f32; 8]],
}

impl PairSegments<4> for AffinePair<'_, '_> {
    #[inline(always)]
    fn decode(&self, wide: Vnni512, low: &[u8; 4], high: &[u8; 4]) -> __m512 {
        wide.i32_to_f32(wide.and(raw_nibbles(wide, low, high), wide.splat_i32(15)))
    }

    #[inline(always)]
    fn finish(&self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        self.fold(wide, g, part, acc)
    }
}

/// Affine 8-bit: bytes to f32, folded as 4-bit is.
impl PairSegments<8> for AffinePair<'_, '_> {
    #[inline(always)]
    fn decode(&self, wide: Vnni512, low: &[u8; 8], high: &[u8; 8]) -> __m512 {
        wide.i32_to_f32(wide.widen_u8(cast([*low, *high])))
    }

    #[inline(always)]
    fn finish(&self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        self.fold(wide, g, part, acc)
    }
}

impl AffinePair<'_, '_> {
    /// Group `g`'s part folded into the two rows' accumulators: `acc + (s * part + b * xsum)`.
    #[inline(always)]
    fn fold(&self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        let [a, b] = self.first_groups;
        let read = |values: &[u8], at: usize| self.scale.read(values, at + g);
        let s = wide.splat_two_f32(read(self.m.scales, a), read(self.m.scales, b));
        let bias = wide.splat_two_f32(read(self.m.biases, a), read(self.m.biases, b));
        let xsum: f32x8 = cast(self.xsum[g]);
        let term = wide.add_f32(
            wide.mul_f32(s, part),
            wide.mul_f32(bias, wide.repeat_f32(cast(xsum))),
        );
        wide.add_f32(acc, term)
    }
}

/// MXFP4: e2m1 codes to f32; a segment (group of 32) folded as `acc + 2^e * part`.
struct Mxfp4Pair<'a> {
    scales: &'a [u8],
    first: [usize; 2],
}

impl PairSegments<4> for Mxfp4Pair<'_> {
    #[inline(always)]
    fn decode(&self, wide: Vnni512, low: &[u8; 4], high: &[u8; 4]) -> __m512 {
        let code = raw_nibbles(wide, low, high);
        // The table twice: the lookup reads the low four bits, whose top one is the sign.
        let table: __m512 = cast([E2M1_POSITIVE, E2M1_POSITIVE]);
        let magnitude: __m512i = cast(wide.lookup_f32(code, table));
        let sign = wide.and(
            wide.shift_left_28(code),
            wide.splat_i32(0x8000_0000u32 as i32),
        );
        cast(wide.xor(magnitude, sign))
    }

    #[inline(always)]
    fn finish(&self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512 {
        let scale = |at: usize| decode::e8m0(u32::from(self.scales[at + segment]));
        let s = wide.splat_two_f32(scale(self.first[0]), scale(self.first[1]));
        wide.add_f32(acc, wide.mul_f32(s, part))
    }
}

/// The eight nibbles of each row's word, each in the low bits of its lane, higher bits not
/// cleared (as `raw_nibbles` of the parent).
#[inline(always)]
fn raw_nibbles(wide: Vnni512, low: &[u8; 4], high: &[u8; 4]) -> __m512i {
    let words = wide.splat_two_i32(i32::from_le_bytes(*low), i32::from_le_bytes(*high));
    let shifts: __m512i = cast([NIBBLE_SHIFTS, NIBBLE_SHIFTS]);
    wide.shift_right_var(words, shifts)
}

/// `segmented4` with two rows per register: the same chunks, parts and folds per lane.
#[inline(always)]
fn segmented4_wide<const CB: usize, K: PairSegments<CB>>(
    wide: Vnni512,
    rows: [&[u8]; 4],
    tail: &[u8],
    x: &[f32],
    seg: usize,
    k: &[K; 2],
) -> [f32; 4] {
    let narrow = wide.vnni();
    let zero: __m512 = cast([0f32; 16]);
    let (mut a01, mut a23) = (zero, zero);
    let [c0, c1, c2, c3] = rows.map(|r| r.as_chunks::<CB>().0);
    let per_segment = seg / 8;
    for (s, x_segment) in x.as_chunks::<8>().0.chunks(per_segment).enumerate() {
        let first = s * per_segment;
        let at = first * CB + PREFETCH_DISTANCE;
        for line in (0..x_segment.len() * CB).step_by(CACHE_LINE) {
            for i in 0..4 {
                narrow.prefetch(four_ahead(tail, rows[0].len(), i, at + line));
            }
        }
        let (mut p01, mut p23) = (zero, zero);
        for (c, x8) in x_segment.iter().enumerate() {
            let x8: f32x8 = cast(*x8);
            let x16 = wide.repeat_f32(cast(x8));
            let w01 = k[0].decode(wide, &c0[first + c], &c1[first + c]);
            let w23 = k[1].decode(wide, &c2[first + c], &c3[first + c]);
            p01 = wide.add_f32(p01, wide.mul_f32(w01, x16));
            p23 = wide.add_f32(p23, wide.mul_f32(w23, x16));
        }
        a01 = k[0].finish(wide, s, p01, a01);
        a23 = k[1].finish(wide, s, p23, a23);
    }
    let (r0, r1) = split(wide, a01);
    let (r2, r3) = split(wide, a23);
    [reduce(r0), reduce(r1), reduce(r2), reduce(r3)]
}

/// `dense4` for BF16 with two rows per register.
#[inline(always)]
fn dense4_wide(wide: Vnni512, rows: [&[u8]; 4], tail: &[u8], x: &[f32]) -> [f32; 4] {
    const CB: usize = 16;
    let narrow = wide.vnni();
    let zero: __m512 = cast([0f32; 16]);
    let (mut p01, mut p23) = (zero, zero);
    let [w0, w1, w2, w3] = rows.map(|r| r.as_chunks::<CB>().0);
    let row_bytes = rows[0].len();
    for (c, x8) in x.as_chunks::<8>().0.iter().enumerate() {
        if c % (CACHE_LINE / CB) == 0 {
            let at = c * CB + PREFETCH_DISTANCE;
            for i in 0..4 {
                narrow.prefetch(four_ahead(tail, row_bytes, i, at));
            }
        }
        let x8: f32x8 = cast(*x8);
        let x16 = wide.repeat_f32(cast(x8));
        let b01 = bf16_pair(wide, &w0[c], &w1[c]);
        let b23 = bf16_pair(wide, &w2[c], &w3[c]);
        p01 = wide.add_f32(p01, wide.mul_f32(b01, x16));
        p23 = wide.add_f32(p23, wide.mul_f32(b23, x16));
    }
    // `dense4` folds each row's part into zero accumulators: the same add here.
    let (r0, r1) = split(wide, wide.add_f32(zero, p01));
    let (r2, r3) = split(wide, wide.add_f32(zero, p23));
    [reduce(r0), reduce(r1), reduce(r2), reduce(r3)]
}

/// Eight BF16 values of two rows as f32 (row `low` in the low lanes).
#[inline(always)]
fn bf16_pair(wide: Vnni512, low: &[u8; 16], high: &[u8; 16]) -> __m512 {
    let both: __m256i = cast([*low, *high]);
    cast(wide.shift_left_16(wide.widen_u16(both)))
}

/// A register's two rows' accumulators, eight lanes each.
#[inline(always)]
fn split(wide: Vnni512, a: __m512) -> (f32x8, f32x8) {
    let (low, high) = wide.halves(cast(a));
    (cast(low), cast(high))
}
