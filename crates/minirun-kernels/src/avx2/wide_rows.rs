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
use x86_vnni::{Vbmi512, Vnni512};

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
    vbmi: Option<Vbmi512>,
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
            let held = |i: usize| AffineHeld::new(m, [r + i, r + i + 1], groups, xsum);
            let (mut plain, mut held) = ([pair(0), pair(2)], [held(0), held(2)]);
            match (bits, scale == FloatType::BF16) {
                (4, true) => Some(codes4(wide, vbmi, rows, tail, x, group, &mut held)),
                (4, false) => Some(codes4(
                    wide,
                    vbmi,
                    rows,
                    tail,
                    x,
                    group,
                    &mut plain.map(Plain),
                )),
                (8, true) => Some(segmented4_wide::<8, _>(
                    wide, rows, tail, x, group, &mut held,
                )),
                (8, false) => Some(segmented4_wide::<8, _>(
                    wide, rows, tail, x, group, &mut plain,
                )),
                _ => None,
            }
        }
        Format::Mxfp4 => {
            let groups = m.cols / 32;
            let pair = |i: usize| Mxfp4Pair {
                scales: m.scales,
                first: [(r + i) * groups, (r + i + 1) * groups],
            };
            match vbmi {
                Some(_) => {
                    let held = |i: usize| Mxfp4Held::new(m.scales, [r + i, r + i + 1], groups);
                    let mut held = [held(0), held(2)];
                    Some(codes4(wide, vbmi, rows, tail, x, 32, &mut held))
                }
                None => {
                    let mut k = [pair(0), pair(2)];
                    Some(segmented4_wide::<4, _>(wide, rows, tail, x, 32, &mut k))
                }
            }
        }
        Format::Dense(FloatType::BF16) => Some(dense4_wide(wide, rows, tail, x)),
        _ => None,
    }
}

/// How a format decodes one chunk of two rows (eight weights each, row `r` to the low lanes)
/// and folds a segment's part into their accumulators.
trait PairSegments<const CB: usize> {
    fn decode(&self, wide: Vnni512, low: &[u8; CB], high: &[u8; CB]) -> __m512;
    fn finish(&mut self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512;
}

/// Affine 4- and 8-bit: codes to f32; a segment (group) folded as `s * part + b * xsum`.
#[derive(Clone, Copy)]
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
    fn finish(&mut self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
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
    fn finish(&mut self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
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
#[derive(Clone, Copy)]
struct Mxfp4Pair<'a> {
    scales: &'a [u8],
    first: [usize; 2],
}

impl PairSegments<4> for Mxfp4Pair<'_> {
    #[inline(always)]
    fn decode(&self, wide: Vnni512, low: &[u8; 4], high: &[u8; 4]) -> __m512 {
        Nibbles::values(self, wide, raw_nibbles(wide, low, high))
    }

    #[inline(always)]
    fn finish(&mut self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512 {
        let scale = |at: usize| decode::e8m0(u32::from(self.scales[at + segment]));
        let s = wide.splat_two_f32(scale(self.first[0]), scale(self.first[1]));
        wide.add_f32(acc, wide.mul_f32(s, part))
    }
}

/// The values of sixteen 4-bit codes, each in the low four bits of its lane, whatever the
/// higher bits hold: one lookup (`vpermps` reads only those four bits).
trait Nibbles {
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512;
}

/// Codes 0 to 15 as f32: the values `vcvtdq2ps` gives the clean codes.
impl Nibbles for AffinePair<'_, '_> {
    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        wide.lookup_f32(codes, cast(CODES_AS_F32))
    }
}

/// The sixteen signed e2m1 values: the code whole, sign included (the 256-bit path looks up
/// eight magnitudes and moves the sign in; the same values, -0 for code 8 included).
impl Nibbles for Mxfp4Pair<'_> {
    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        wide.lookup_f32(codes, cast(E2M1))
    }
}

/// The sixteen e2m1 values by code: the eight magnitudes, then the same with the sign set.
const E2M1: [f32; 16] = {
    let mut all = [0f32; 16];
    let mut c = 0;
    while c < 8 {
        all[c] = E2M1_POSITIVE[c];
        all[c + 8] = -E2M1_POSITIVE[c];
        c += 1;
    }
    all
};

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
    k: &mut [K; 2],
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

/// What [`segmented4_picked`] needs of a format: the values of clean codes, and a segment's
/// fold, which may keep state from one segment to the next.
trait PickedSegments {
    type Pairs: PairSegments<4>;
    /// The same format for `segmented4_wide`.
    fn pairs(&self) -> Self::Pairs;
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512;
    fn finish(&mut self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512;
}

/// A [`PairSegments`] format as it is.
#[derive(Clone, Copy)]
struct Plain<K>(K);

impl<K: PairSegments<4> + Nibbles + Copy> PickedSegments for Plain<K> {
    type Pairs = K;

    fn pairs(&self) -> K {
        self.0
    }

    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        self.0.values(wide, codes)
    }

    #[inline(always)]
    fn finish(&mut self, wide: Vnni512, segment: usize, part: __m512, acc: __m512) -> __m512 {
        self.0.finish(wide, segment, part, acc)
    }
}

/// Affine 4-bit with BF16 scales and biases, two rows: each row's next sixteen scales and
/// biases loaded and widened at once and held, a segment's two picked from them with one
/// `vpermt2ps` each, where [`AffinePair`] reads and splats them one by one; the same values,
/// folded in the same order.
struct AffineHeld<'a, 'm> {
    m: &'a QMatrix<'m>,
    first_groups: [usize; 2],
    groups: usize,
    xsum: &'a [[f32; 8]],
    /// Row `r`'s scales, row `r + 1`'s, row `r`'s biases, row `r + 1`'s, for the sixteen
    /// segments from the last multiple of sixteen.
    held: [__m512; 4],
}

impl<'a, 'm> AffineHeld<'a, 'm> {
    fn new(m: &'a QMatrix<'m>, rows: [usize; 2], groups: usize, xsum: &'a [[f32; 8]]) -> Self {
        AffineHeld {
            m,
            first_groups: rows.map(|r| r * groups),
            groups,
            xsum,
            held: [cast([0f32; 16]); 4],
        }
    }
}

/// Sixteen BF16 values from `values[2 * at..]` as f32, zeros past `values`' end.
#[inline(always)]
fn sixteen_bf16(wide: Vnni512, values: &[u8], at: usize, available: usize) -> __m512 {
    let from = values.get(2 * at..).unwrap_or(&[]);
    let bits: __m256i = match from.as_chunks::<32>().0.first() {
        Some(all) if available >= 16 => cast(*all),
        _ => {
            let mut some = [0u8; 32];
            let n = (2 * available.min(16)).min(from.len());
            some[..n].copy_from_slice(&from[..n]);
            cast(some)
        }
    };
    cast(wide.shift_left_16(wide.widen_u16(bits)))
}

/// The sixteen 4-bit codes as f32, for a lookup that reads only a lane's low four bits.
const CODES_AS_F32: [f32; 16] = {
    let mut all = [0f32; 16];
    let mut c = 0;
    while c < 16 {
        all[c] = c as f32;
        c += 1;
    }
    all
};

/// Lane `i < 8` picks lane `s` of the first register, lane `8 + i` lane `s` of the second.
static SEGMENT_PICK: [[i32; 16]; 16] = {
    let mut all = [[0i32; 16]; 16];
    let mut s = 0;
    while s < 16 {
        let mut lane = 0;
        while lane < 16 {
            all[s][lane] = if lane < 8 { s as i32 } else { 16 + s as i32 };
            lane += 1;
        }
        s += 1;
    }
    all
};

/// Affine 8-bit decoded as [`AffinePair`] decodes it, folded with the held scales.
impl PairSegments<8> for AffineHeld<'_, '_> {
    #[inline(always)]
    fn decode(&self, wide: Vnni512, low: &[u8; 8], high: &[u8; 8]) -> __m512 {
        self.pairs().decode(wide, low, high)
    }

    #[inline(always)]
    fn finish(&mut self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        PickedSegments::finish(self, wide, g, part, acc)
    }
}

impl<'a, 'm> PickedSegments for AffineHeld<'a, 'm> {
    type Pairs = AffinePair<'a, 'm>;

    fn pairs(&self) -> AffinePair<'a, 'm> {
        AffinePair {
            m: self.m,
            scale: FloatType::BF16,
            first_groups: self.first_groups,
            xsum: self.xsum,
        }
    }

    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        self.pairs().values(wide, codes)
    }

    /// `AffinePair::fold`: `acc + (s * part + b * xsum)`.
    #[inline(always)]
    fn finish(&mut self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        self.hold(wide, g);
        self.fold(wide, g, self.xsum, part, acc)
    }
}

impl TileSegments for AffineHeld<'_, '_> {
    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        self.pairs().values(wide, codes)
    }

    #[inline(always)]
    fn hold(&mut self, wide: Vnni512, g: usize) {
        if g.is_multiple_of(16) {
            let [a, b] = self.first_groups.map(|first| first + g);
            let available = self.groups - g;
            let (scales, biases) = (self.m.scales, self.m.biases);
            self.held = [
                sixteen_bf16(wide, scales, a, available),
                sixteen_bf16(wide, scales, b, available),
                sixteen_bf16(wide, biases, a, available),
                sixteen_bf16(wide, biases, b, available),
            ];
        }
    }

    #[inline(always)]
    fn fold(
        &self,
        wide: Vnni512,
        g: usize,
        xsum: &[[f32; 8]],
        part: __m512,
        acc: __m512,
    ) -> __m512 {
        let pick: __m512i = cast(SEGMENT_PICK[g % 16]);
        let [s_low, s_high, b_low, b_high] = self.held;
        let s = wide.lookup_two_f32(s_low, pick, s_high);
        let bias = wide.lookup_two_f32(b_low, pick, b_high);
        let xsum: f32x8 = cast(xsum[g]);
        let term = wide.add_f32(
            wide.mul_f32(s, part),
            wide.mul_f32(bias, wide.repeat_f32(cast(xsum))),
        );
        wide.add_f32(acc, term)
    }
}

/// MXFP4, two rows: each row's next sixteen E8M0 scales loaded and decoded at once and held,
/// a segment's two picked from them with one `vpermt2ps`, where [`Mxfp4Pair`] decodes each
/// byte alone; the same values (`decode::e8m0`: 2^-127 for byte 0, NaN for 255), folded in the
/// same order.
struct Mxfp4Held<'a> {
    pair: Mxfp4Pair<'a>,
    groups: usize,
    /// Row `r`'s scales and row `r + 1`'s for the sixteen segments from the last multiple of
    /// sixteen.
    held: [__m512; 2],
}

impl<'a> Mxfp4Held<'a> {
    fn new(scales: &'a [u8], rows: [usize; 2], groups: usize) -> Self {
        let first = rows.map(|r| r * groups);
        Mxfp4Held {
            pair: Mxfp4Pair { scales, first },
            groups,
            held: [cast([0f32; 16]); 2],
        }
    }
}

/// Sixteen E8M0 scales from `scales[at..]` as f32 (`decode::e8m0`), past `available` zero.
#[inline(always)]
fn sixteen_e8m0(wide: Vnni512, scales: &[u8], at: usize, available: usize) -> __m512 {
    let from = scales.get(at..).unwrap_or(&[]);
    let bytes: [u8; 16] = match from.as_chunks::<16>().0.first() {
        Some(all) if available >= 16 => *all,
        _ => {
            let mut some = [0u8; 16];
            let n = available.min(16).min(from.len());
            some[..n].copy_from_slice(&from[..n]);
            some
        }
    };
    let byte = wide.widen_u8(cast(bytes));
    let normal = wide.shift_left_23(byte);
    let smallest = wide.splat_i32(0x0040_0000);
    let low = wide.where_equal(byte, wide.splat_i32(0), smallest, normal);
    let nan = wide.splat_i32(f32::NAN.to_bits() as i32);
    cast(wide.where_equal(byte, wide.splat_i32(0xFF), nan, low))
}

impl<'a> PickedSegments for Mxfp4Held<'a> {
    type Pairs = Mxfp4Pair<'a>;

    fn pairs(&self) -> Mxfp4Pair<'a> {
        self.pair
    }

    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        self.pair.values(wide, codes)
    }

    /// `Mxfp4Pair::finish`: `acc + 2^e * part`.
    #[inline(always)]
    fn finish(&mut self, wide: Vnni512, g: usize, part: __m512, acc: __m512) -> __m512 {
        self.hold(wide, g);
        self.fold(wide, g, &[], part, acc)
    }
}

impl TileSegments for Mxfp4Held<'_> {
    #[inline(always)]
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512 {
        self.pair.values(wide, codes)
    }

    #[inline(always)]
    fn hold(&mut self, wide: Vnni512, g: usize) {
        if g.is_multiple_of(16) {
            let available = self.groups - g;
            let scales = self.pair.scales;
            let [a, b] = self.pair.first;
            self.held = [
                sixteen_e8m0(wide, scales, a + g, available),
                sixteen_e8m0(wide, scales, b + g, available),
            ];
        }
    }

    /// `acc + 2^e * part` (MXFP4 has no bias, so no lane sums).
    #[inline(always)]
    fn fold(&self, wide: Vnni512, g: usize, _: &[[f32; 8]], part: __m512, acc: __m512) -> __m512 {
        let pick: __m512i = cast(SEGMENT_PICK[g % 16]);
        let s = wide.lookup_two_f32(self.held[0], pick, self.held[1]);
        wide.add_f32(acc, wide.mul_f32(s, part))
    }
}

/// `segmented4_wide` for 4-bit codes, through [`segmented4_picked`] where the CPU has VBMI and
/// the segments allow it.
#[inline(always)]
fn codes4<K: PickedSegments>(
    wide: Vnni512,
    vbmi: Option<Vbmi512>,
    rows: [&[u8]; 4],
    tail: &[u8],
    x: &[f32],
    seg: usize,
    k: &mut [K; 2],
) -> [f32; 4] {
    let pairs = [[rows[0], rows[1]], [rows[2], rows[3]]];
    match vbmi.filter(|_| picks(seg)) {
        Some(vbmi) => {
            let [[a, b], [c, d]] = picked(vbmi, pairs, tail, x, seg, k);
            [a, b, c, d]
        }
        None => segmented4_wide::<4, _>(wide, rows, tail, x, seg, &mut k.each_ref().map(K::pairs)),
    }
}

/// Whether [`segmented4_picked`] takes segments of `seg` codes.
fn picks(seg: usize) -> bool {
    seg / 8 == 4 || (seg / 8).is_multiple_of(8) && seg >= 64
}

/// [`segmented4_picked`] with the load size the segments allow.
#[inline(always)]
fn picked<K: PickedSegments>(
    vbmi: Vbmi512,
    rows: [[&[u8]; 2]; 2],
    tail: &[u8],
    x: &[f32],
    seg: usize,
    k: &mut [K; 2],
) -> [[f32; 2]; 2] {
    match seg / 8 {
        4 => segmented4_picked::<4, K>(vbmi, rows, tail, x, seg, k),
        _ => segmented4_picked::<8, K>(vbmi, rows, tail, x, seg, k),
    }
}

/// For chunk `c` of a load of `n` chunks per row (row `r`'s `4n` bytes, then row `r + 1`'s,
/// split into a register of low nibbles and one of high nibbles): lane `i < 8` takes code `i`
/// of row `r`'s word `c` (byte `4c + i / 2`, its high nibble for odd `i`) into its lowest
/// byte, lane `8 + i` the same of row `r + 1`.
const fn pick_index(n: usize, c: usize) -> [u8; 64] {
    let mut index = [0u8; 64];
    let mut lane = 0;
    while lane < 16 {
        let (row_start, code) = if lane < 8 {
            (0, lane)
        } else {
            (4 * n, lane - 8)
        };
        let high_nibble = (code % 2) as u8 * 64;
        index[4 * lane] = high_nibble + (row_start + 4 * c + code / 2) as u8;
        lane += 1;
    }
    index
}

/// [`pick_index`] for loads of four chunks (index 0) and of eight (index 1).
static PICK_INDEX: [[[u8; 64]; 8]; 2] = {
    let mut all = [[[0u8; 64]; 8]; 2];
    let mut c = 0;
    while c < 8 {
        all[0][c] = pick_index(4, c);
        all[1][c] = pick_index(8, c);
        c += 1;
    }
    all
};

/// Two rows' next `N` chunks (`4N` bytes each, `N` of 4 or 8) as one register's low `8N` bytes.
#[inline(always)]
fn load_pair<const N: usize>(wide: Vnni512, low: &[u8], high: &[u8]) -> __m512i {
    if N == 8 {
        let a: __m256i = cast(low.as_chunks::<32>().0[0]);
        let b: __m256i = cast(high.as_chunks::<32>().0[0]);
        wide.join(a, b)
    } else {
        let both: __m256i = cast([low.as_chunks::<16>().0[0], high.as_chunks::<16>().0[0]]);
        wide.join(both, both)
    }
}

/// Each byte's low nibble, and each byte's high nibble, as bytes.
#[inline(always)]
fn nibbles(vbmi: Vbmi512, bytes: __m512i) -> (__m512i, __m512i) {
    let wide = vbmi.wide();
    let mask = wide.splat_i32(0x0F0F_0F0F);
    let high = wide.and(vbmi.shift_right_4_u16(bytes), mask);
    (wide.and(bytes, mask), high)
}

/// `segmented4_wide` with each row's codes loaded `N` chunks at a time and split into low and
/// high nibbles once, then one byte pick per chunk (`vpermt2b`) putting two rows' sixteen codes
/// in their lanes; the values, parts and folds are `segmented4_wide`'s, lane for lane. A segment is `N` chunks (`N` = 4) or a whole number of loads (`N` = 8).
#[inline(always)]
fn segmented4_picked<const N: usize, K: PickedSegments>(
    vbmi: Vbmi512,
    rows: [[&[u8]; 2]; 2],
    tail: &[u8],
    x: &[f32],
    seg: usize,
    k: &mut [K; 2],
) -> [[f32; 2]; 2] {
    let wide = vbmi.wide();
    let narrow = wide.vnni();
    let zero: __m512 = cast([0f32; 16]);
    let index = &PICK_INDEX[usize::from(N == 8)];
    let row_bytes = rows[0][0].len();
    let mut acc = [zero; 2];
    let per_segment = seg / 8;
    for (s, x_segment) in x.as_chunks::<8>().0.chunks(per_segment).enumerate() {
        let first = s * per_segment;
        let mut part = [zero; 2];
        for (l, x_load) in x_segment.as_chunks::<N>().0.iter().enumerate() {
            let byte = (first + l * N) * 4;
            if byte.is_multiple_of(CACHE_LINE) {
                for i in 0..4 {
                    narrow.prefetch(four_ahead(tail, row_bytes, i, byte + PREFETCH_DISTANCE));
                }
            }
            let mut low = [cast::<_, __m512i>([0u8; 64]); 2];
            let mut high = low;
            for j in 0..2 {
                let [a, b] = rows[j];
                (low[j], high[j]) = nibbles(vbmi, load_pair::<N>(wide, &a[byte..], &b[byte..]));
            }
            for (c, x8) in x_load.iter().enumerate() {
                let x16 = wide.repeat_f32(cast(*x8));
                let pick: __m512i = cast(index[c]);
                for j in 0..2 {
                    let codes = vbmi.pick_bytes(low[j], pick, high[j]);
                    let product = wide.mul_f32(k[j].values(wide, codes), x16);
                    part[j] = wide.add_f32(part[j], product);
                }
            }
        }
        for j in 0..2 {
            acc[j] = k[j].finish(wide, s, part[j], acc[j]);
        }
    }
    let (r0, r1) = split(wide, acc[0]);
    let (r2, r3) = split(wide, acc[1]);
    [[reduce(r0), reduce(r1)], [reduce(r2), reduce(r3)]]
}

/// What [`segmented4_tile`] needs of a format with held scales: the values of codes, the
/// scales of sixteen segments loaded at a segment's start, and a segment's fold for one vector.
trait TileSegments {
    fn values(&self, wide: Vnni512, codes: __m512i) -> __m512;
    /// Loads the scales of segments `g..g + 16` where `g` is a multiple of sixteen.
    fn hold(&mut self, wide: Vnni512, g: usize);
    /// Segment `g`'s part of one vector (whose lane sums are `xsum`) folded into `acc`.
    fn fold(&self, wide: Vnni512, g: usize, xsum: &[[f32; 8]], part: __m512, acc: __m512)
    -> __m512;
}

/// Whether [`tile4`] takes this format: the 4-bit formats whose codes VBMI picks (affine with
/// BF16 scales, MXFP4) and affine 8-bit with BF16 scales.
pub(super) fn tiles(format: Format) -> bool {
    match format {
        Format::Affine {
            bits: 4,
            group,
            scale: FloatType::BF16,
        } => picks(group),
        Format::Affine {
            bits: 8,
            scale: FloatType::BF16,
            ..
        }
        | Format::Mxfp4 => true,
        _ => false,
    }
}

/// Rows `r..r + 4` against four vectors, where the CPU has VBMI, for the formats [`tiles`]
/// names: `[vector][row]`, each the bits of its `dot4_wide`; `None` for the other formats.
#[inline(always)]
pub(super) fn tile4(
    vbmi: Vbmi512,
    m: &QMatrix,
    r: usize,
    xs: [&[f32]; 4],
    xsums: [&[[f32; 8]]; 4],
) -> Option<[[f32; 4]; 4]> {
    let row_bytes = m.row_bytes();
    let row = |i: usize| &m.packed[(r + i) * row_bytes..(r + i + 1) * row_bytes];
    let rows = [[row(0), row(1)], [row(2), row(3)]];
    let tail = m.packed.get(r * row_bytes..).unwrap_or(&[]);
    let tiles = match m.format {
        Format::Affine {
            bits: 4,
            group,
            scale: FloatType::BF16,
        } if picks(group) => {
            let groups = m.cols / group;
            let held = |i: usize| AffineHeld::new(m, [r + i, r + i + 1], groups, &[]);
            let mut k = [held(0), held(2)];
            tile_loads(vbmi, rows, tail, xs, xsums, group, &mut k)
        }
        Format::Affine {
            bits: 8,
            group,
            scale: FloatType::BF16,
        } => {
            let groups = m.cols / group;
            let held = |i: usize| AffineHeld::new(m, [r + i, r + i + 1], groups, &[]);
            let mut k = [held(0), held(2)];
            bytes_tile(vbmi.wide(), rows, tail, xs, xsums, group, &mut k)
        }
        Format::Mxfp4 => {
            let groups = m.cols / 32;
            let held = |i: usize| Mxfp4Held::new(m.scales, [r + i, r + i + 1], groups);
            let mut k = [held(0), held(2)];
            tile_loads(vbmi, rows, tail, xs, xsums, 32, &mut k)
        }
        _ => return None,
    };
    Some(tiles.map(|[[a, b], [c, d]]| [a, b, c, d]))
}

/// [`segmented4_tile`] with the load size the segments allow.
#[inline(always)]
fn tile_loads<K: TileSegments>(
    vbmi: Vbmi512,
    rows: [[&[u8]; 2]; 2],
    tail: &[u8],
    xs: [&[f32]; 4],
    xsums: [&[[f32; 8]]; 4],
    seg: usize,
    k: &mut [K; 2],
) -> [[[f32; 2]; 2]; 4] {
    match seg / 8 {
        4 => segmented4_tile::<4, K>(vbmi, rows, tail, xs, xsums, seg, k),
        _ => segmented4_tile::<8, K>(vbmi, rows, tail, xs, xsums, seg, k),
    }
}

/// [`segmented4_picked`] for four vectors at once: each chunk's codes picked and looked up
/// once for the four, each vector's parts and folds in `segmented4_picked`'s order, lane for
/// lane.
#[inline(always)]
fn segmented4_tile<const N: usize, K: TileSegments>(
    vbmi: Vbmi512,
    rows: [[&[u8]; 2]; 2],
    tail: &[u8],
    xs: [&[f32]; 4],
    xsums: [&[[f32; 8]]; 4],
    seg: usize,
    k: &mut [K; 2],
) -> [[[f32; 2]; 2]; 4] {
    let wide = vbmi.wide();
    let narrow = wide.vnni();
    let zero: __m512 = cast([0f32; 16]);
    let index = &PICK_INDEX[usize::from(N == 8)];
    let row_bytes = rows[0][0].len();
    let [x0, x1, x2, x3] = xs;
    let x = [
        x0.as_chunks::<8>().0,
        x1.as_chunks::<8>().0,
        x2.as_chunks::<8>().0,
        x3.as_chunks::<8>().0,
    ];
    let mut acc = [[zero; 2]; 4];
    let per_segment = seg / 8;
    for s in 0..x[0].len() / per_segment {
        let first = s * per_segment;
        let mut part = [[zero; 2]; 4];
        for l in (0..per_segment).step_by(N) {
            let byte = (first + l) * 4;
            if byte.is_multiple_of(CACHE_LINE) {
                for i in 0..4 {
                    narrow.prefetch(four_ahead(tail, row_bytes, i, byte + PREFETCH_DISTANCE));
                }
            }
            let mut low = [cast::<_, __m512i>([0u8; 64]); 2];
            let mut high = low;
            for j in 0..2 {
                let [a, b] = rows[j];
                (low[j], high[j]) = nibbles(vbmi, load_pair::<N>(wide, &a[byte..], &b[byte..]));
            }
            for c in 0..N {
                let pick: __m512i = cast(index[c]);
                let mut w = [zero; 2];
                for j in 0..2 {
                    w[j] = k[j].values(wide, vbmi.pick_bytes(low[j], pick, high[j]));
                }
                for v in 0..4 {
                    let x16 = wide.repeat_f32(cast(x[v][first + l + c]));
                    for j in 0..2 {
                        part[v][j] = wide.add_f32(part[v][j], wide.mul_f32(w[j], x16));
                    }
                }
            }
        }
        for j in 0..2 {
            k[j].hold(wide, s);
            for v in 0..4 {
                acc[v][j] = k[j].fold(wide, s, xsums[v], part[v][j], acc[v][j]);
            }
        }
    }
    let mut out = [[[0f32; 2]; 2]; 4];
    for v in 0..4 {
        for j in 0..2 {
            let (low, high) = split(wide, acc[v][j]);
            out[v][j] = [reduce(low), reduce(high)];
        }
    }
    out
}

/// `segmented4_wide` for affine 8-bit rows and four vectors at once: each chunk of two rows
/// widened once for the four vectors, each vector's parts and folds in `segmented4_wide`'s
/// order, lane for lane.
#[inline(always)]
fn bytes_tile<K: TileSegments + PairSegments<8>>(
    wide: Vnni512,
    rows: [[&[u8]; 2]; 2],
    tail: &[u8],
    xs: [&[f32]; 4],
    xsums: [&[[f32; 8]]; 4],
    seg: usize,
    k: &mut [K; 2],
) -> [[[f32; 2]; 2]; 4] {
    const CB: usize = 8;
    let narrow = wide.vnni();
    let zero: __m512 = cast([0f32; 16]);
    let row_bytes = rows[0][0].len();
    let [[c0, c1], [c2, c3]] = rows.map(|pair| pair.map(|r| r.as_chunks::<CB>().0));
    let [x0, x1, x2, x3] = xs;
    let x = [
        x0.as_chunks::<8>().0,
        x1.as_chunks::<8>().0,
        x2.as_chunks::<8>().0,
        x3.as_chunks::<8>().0,
    ];
    let mut acc = [[zero; 2]; 4];
    let per_segment = seg / 8;
    for s in 0..x[0].len() / per_segment {
        let first = s * per_segment;
        let at = first * CB + PREFETCH_DISTANCE;
        for line in (0..per_segment * CB).step_by(CACHE_LINE) {
            for i in 0..4 {
                narrow.prefetch(four_ahead(tail, row_bytes, i, at + line));
            }
        }
        let mut part = [[zero; 2]; 4];
        for c in first..first + per_segment {
            let w = [
                k[0].decode(wide, &c0[c], &c1[c]),
                k[1].decode(wide, &c2[c], &c3[c]),
            ];
            for v in 0..4 {
                let x16 = wide.repeat_f32(cast(x[v][c]));
                for j in 0..2 {
                    part[v][j] = wide.add_f32(part[v][j], wide.mul_f32(w[j], x16));
                }
            }
        }
        for j in 0..2 {
            k[j].hold(wide, s);
            for v in 0..4 {
                acc[v][j] = k[j].fold(wide, s, xsums[v], part[v][j], acc[v][j]);
            }
        }
    }
    let mut out = [[[0f32; 2]; 2]; 4];
    for v in 0..4 {
        for j in 0..2 {
            let (low, high) = split(wide, acc[v][j]);
            out[v][j] = [reduce(low), reduce(high)];
        }
    }
    out
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
