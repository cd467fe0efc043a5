//! Affine and MXFP4 rows sixteen at a time with 512-bit registers (`x86_vnni::Vnni512`): the
//! octets of the parent module twice over, one row per 32-bit lane of a 512-bit register. Each
//! 32-byte chunk of rows `first..first + 8` and `first + 8..first + 16` is transposed as an
//! octet's is, the two halves joined into one register, and each vector's codes are broadcast
//! four bytes at a time into all sixteen rows. A `vpdpbusd` then does sixteen rows' work where
//! an octet's does eight, and so does every operation of the fold. The f32 fold is the
//! octet's (and the row path's) operations lane by lane, so each (row, vector) keeps its bits.

use pulp::bytemuck::cast;
use std::arch::x86_64::{__m256i, __m512, __m512i};
use x86_vnni::Vnni512;

use super::{
    AffineOctet, Blocks, ByteRows, GROUPS_AT_ONCE, GroupFloats, LaneScratch, Mxfp4Rows, OCTET,
    Octets, PAIR_BYTES, doubled, octet_chunk, octet_floats, octet_nibbles, octet_packed,
    rows_batch_octets, takes_octets,
};
use crate::format::{Format, QMatrix};
use crate::int8_fold::MXFP4_GROUP;
use crate::int8_vector::{BLOCK, Int8Vector};

/// Rows in one pass: two octets.
const SIXTEEN: usize = 2 * OCTET;

/// Rows `first..` against every vector of `xs` into `out[i * batch + b]`: whole sixteens of
/// rows here, the rest through the octets of the parent module (the same bits either way).
#[inline(always)]
pub(super) fn rows_batch_sixteens<K: Sixteens>(
    wide: Vnni512,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    let batch = xs.len();
    let sixteen_rows = if takes_octets(xs) {
        out.len() / batch / SIXTEEN * SIXTEEN
    } else {
        0
    };
    let (sixteens, rest) = out.split_at_mut(sixteen_rows * batch);
    if !sixteens.is_empty() {
        // Taken out of the thread's slot and put back, not borrowed in a closure: a closure
        // would not inherit the target features the kernel is compiled for.
        let mut scratch = SIXTEEN_SCRATCH.take();
        scratch.fit(batch);
        for (s, sixteen_out) in sixteens.chunks_exact_mut(SIXTEEN * batch).enumerate() {
            K::sixteen(wide, m, first + s * SIXTEEN, xs, sixteen_out, &mut scratch);
        }
        SIXTEEN_SCRATCH.set(scratch);
    }
    rows_batch_octets::<_, K>(wide.vnni(), m, first + sixteen_rows, xs, rest);
}

/// A row kernel with a sixteen-row form, each (row, vector) with the bits of its octet form.
pub(super) trait Sixteens: Octets {
    fn sixteen(
        wide: Vnni512,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut SixteenScratch,
    );
}

impl<K: SixteenRows> Sixteens for K {
    #[inline(always)]
    fn sixteen(
        wide: Vnni512,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut SixteenScratch,
    ) {
        sixteen_affine::<K>(wide, m, first, xs, out, scratch)
    }
}

impl Sixteens for Mxfp4Rows {
    #[inline(always)]
    fn sixteen(
        wide: Vnni512,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut SixteenScratch,
    ) {
        sixteen_mxfp4(wide, m, first, xs, out, scratch)
    }
}

/// An affine code width whose sixteens take its octet's chunks: the integer sums of one chunk
/// of sixteen rows against one vector.
pub(super) trait SixteenRows: AffineOctet + Octets {
    /// A chunk's transposed bytes of sixteen rows prepared for the products (for 4-bit codes,
    /// split into nibbles).
    type Wide;
    fn wide(wide: Vnni512, joined: [__m512i; OCTET]) -> Self::Wide;
    /// `None` past the vector's codes (a caller's mistake: that vector's outputs stay zero).
    fn wide_sum(
        wide: Vnni512,
        weights: &Self::Wide,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m512i>;
}

impl<const PPG: usize> SixteenRows for Blocks<PPG> {
    type Wide = ([__m512i; OCTET], [__m512i; OCTET]);

    #[inline(always)]
    fn wide(wide: Vnni512, joined: [__m512i; OCTET]) -> Self::Wide {
        let low_mask = wide.splat_i32(0x0F0F_0F0F);
        let (mut low, mut high) = (joined, joined);
        // Loops, not closures: a closure would not inherit the target features.
        for i in 0..OCTET {
            low[i] = wide.and(joined[i], low_mask);
            high[i] = wide.and(wide.shift_right_4(joined[i]), low_mask);
        }
        (low, high)
    }

    #[inline(always)]
    fn wide_sum(
        wide: Vnni512,
        (low, high): &Self::Wide,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m512i> {
        let codes = x.paired.as_chunks::<BLOCK>().0;
        let (even, odd) = (codes.get(2 * chunk)?, codes.get(2 * chunk + 1)?);
        let even: [i32; OCTET] = cast(*even);
        let odd: [i32; OCTET] = cast(*odd);
        let mut sums = [cast([0i32; SIXTEEN]); 4];
        for i in 0..OCTET {
            let e = wide.splat_i32(even[i]);
            let o = wide.splat_i32(odd[i]);
            sums[i % 4] = wide.dpbusd(wide.dpbusd(sums[i % 4], low[i], e), high[i], o);
        }
        Some(tree_sum(wide, sums))
    }
}

impl<const RPG: usize> SixteenRows for ByteRows<RPG> {
    type Wide = [__m512i; OCTET];

    #[inline(always)]
    fn wide(_: Vnni512, joined: [__m512i; OCTET]) -> Self::Wide {
        joined
    }

    #[inline(always)]
    fn wide_sum(
        wide: Vnni512,
        weights: &Self::Wide,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m512i> {
        let codes: [i32; OCTET] = cast(*x.codes.as_chunks::<BLOCK>().0.get(chunk)?);
        let mut sums = [cast([0i32; SIXTEEN]); 4];
        for i in 0..OCTET {
            let c = wide.splat_i32(codes[i]);
            sums[i % 4] = wide.dpbusd(sums[i % 4], weights[i], c);
        }
        Some(tree_sum(wide, sums))
    }
}

/// Four exact integer sums added (any order gives the same).
#[inline(always)]
fn tree_sum(wide: Vnni512, s: [__m512i; 4]) -> __m512i {
    wide.add_i32(wide.add_i32(s[0], s[1]), wide.add_i32(s[2], s[3]))
}

/// Two octets' registers as one: `low` in lanes 0..8, `high` in lanes 8..16.
#[inline(always)]
fn join<T: pulp::bytemuck::Pod, W: pulp::bytemuck::Pod>(wide: Vnni512, low: T, high: T) -> W {
    let low: __m256i = cast(low);
    let high: __m256i = cast(high);
    cast(wide.join(low, high))
}

/// Sixteen rows' scratch: sixteen lanes.
pub(super) type SixteenScratch = LaneScratch<__m512, __m512i>;

thread_local! {
    static SIXTEEN_SCRATCH: std::cell::RefCell<SixteenScratch> = std::cell::RefCell::default();
}

/// Affine rows `first..first + 16` against every vector of `xs`, into `out[r * batch + b]`:
/// `octet_affine`'s steps with sixteen lanes.
#[inline(always)]
fn sixteen_affine<K: SixteenRows>(
    wide: Vnni512,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
    scratch: &mut SixteenScratch,
) {
    let narrow = wide.vnni();
    let v3 = narrow.v3();
    let Format::Affine { scale, .. } = m.format else {
        out.fill(f32::NAN);
        return;
    };
    let per_group = K::CHUNKS_PER_GROUP;
    let row_bytes = m.cols * K::BITS / 8;
    let groups = m.cols * K::BITS / (8 * PAIR_BYTES * per_group);
    let (low_rows, _) = octet_packed(m, first, row_bytes);
    let (high_rows, next) = octet_packed(m, first + OCTET, row_bytes);
    // Each half prefetches its share of the next sixteen rows.
    let next_high = next.get(OCTET * row_bytes..).unwrap_or(&[]);
    let batch = xs.len();
    let (accs, partials) = (&mut scratch.acc[..batch], &mut scratch.partial[..batch]);
    for acc in accs.iter_mut() {
        *acc = [cast([0f32; 16]); 8];
    }
    let mut scales = [cast([0f32; 16]); GROUPS_AT_ONCE];
    let mut biases = scales;
    for g in 0..groups {
        if g % GROUPS_AT_ONCE == 0 {
            let float = GroupFloats::Float(scale);
            scales = sixteen_floats(wide, v3, float, m.scales, first, (groups, g));
            biases = sixteen_floats(wide, v3, float, m.biases, first, (groups, g));
        }
        let (s, b): (__m512, __m512) = (scales[g % 8], biases[g % 8]);
        for c in 0..per_group {
            let chunk = g * per_group + c;
            let low = octet_chunk(narrow, next, &low_rows, chunk);
            let high = octet_chunk(narrow, next_high, &high_rows, chunk);
            let mut joined = [cast([0i32; SIXTEEN]); OCTET];
            for i in 0..OCTET {
                joined[i] = join(wide, low[i], high[i]);
            }
            let weights = K::wide(wide, joined);
            for (v, x) in xs.iter().enumerate() {
                let Some(mut sum) = K::wide_sum(wide, &weights, x, chunk) else {
                    continue;
                };
                if c > 0 {
                    sum = wide.add_i32(partials[v], sum);
                }
                if c + 1 < per_group {
                    partials[v] = sum;
                    continue;
                }
                let step = wide.splat_f32(x.steps.get(g).copied().unwrap_or(f32::NAN));
                let total = wide.splat_f32(x.sums.get(g).copied().unwrap_or(f32::NAN));
                let terms = wide.add_f32(
                    wide.mul_f32(wide.mul_f32(s, step), wide.i32_to_f32(sum)),
                    wide.mul_f32(b, total),
                );
                let acc = &mut accs[v][g % 8];
                *acc = wide.add_f32(*acc, terms);
            }
        }
    }
    store_sixteen(wide, accs, out);
}

/// `octet_floats` of rows `first..first + 16` (element `j` group `first_group + j`, lane `r`
/// row `first + r`).
#[inline(always)]
fn sixteen_floats(
    wide: Vnni512,
    v3: pulp::x86::V3,
    float: GroupFloats,
    bytes: &[u8],
    first: usize,
    (groups, first_group): (usize, usize),
) -> [__m512; GROUPS_AT_ONCE] {
    let low = octet_floats(v3, float, bytes, first, groups, first_group);
    let high = octet_floats(v3, float, bytes, first + OCTET, groups, first_group);
    let mut out = [cast([0f32; SIXTEEN]); GROUPS_AT_ONCE];
    for j in 0..GROUPS_AT_ONCE {
        out[j] = join(wide, low[j], high[j]);
    }
    out
}

/// Step 3 lane by lane for every vector's accumulators (lane `r` for row `r`), into
/// `out[r * batch + v]`.
#[inline(always)]
fn store_sixteen(wide: Vnni512, accs: &[[__m512; 8]], out: &mut [f32]) {
    let batch = accs.len();
    for (v, a) in accs.iter().enumerate() {
        let w = wide;
        let even = w.add_f32(w.add_f32(a[0], a[4]), w.add_f32(a[2], a[6]));
        let odd = w.add_f32(w.add_f32(a[1], a[5]), w.add_f32(a[3], a[7]));
        let y: [f32; SIXTEEN] = cast(w.add_f32(even, odd));
        for (r, &value) in y.iter().enumerate() {
            out[r * batch + v] = value;
        }
    }
}

/// MXFP4 rows `first..first + 16` against every vector of `xs` (an even number of groups per
/// row), into `out[r * batch + b]`: `octet_mxfp4`'s steps with sixteen lanes. The weights,
/// twice their e2m1 values, are signed, so the activation codes take the unsigned side offset
/// by 128 and the offset's share is taken off each group's sum: the same exact `i_g`.
#[inline(always)]
fn sixteen_mxfp4(
    wide: Vnni512,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
    scratch: &mut SixteenScratch,
) {
    let narrow = wide.vnni();
    let v3 = narrow.v3();
    let zero: __m512i = cast([0i32; SIXTEEN]);
    let groups = m.cols / MXFP4_GROUP;
    let row_bytes = m.cols / 2;
    let (low_rows, _) = octet_packed(m, first, row_bytes);
    let (high_rows, next) = octet_packed(m, first + OCTET, row_bytes);
    let next_high = next.get(OCTET * row_bytes..).unwrap_or(&[]);
    let batch = xs.len();
    let accs = &mut scratch.acc[..batch];
    for acc in accs.iter_mut() {
        *acc = [cast([0f32; SIXTEEN]); 8];
    }
    let offset = wide.splat_i32(0x8080_8080u32 as i32);
    const FLIP: i32 = 0x8080_8080u32 as i32;
    let mut halves = [cast([0f32; SIXTEEN]); GROUPS_AT_ONCE];
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        if g % GROUPS_AT_ONCE == 0 {
            let float = GroupFloats::HalfE8m0;
            halves = sixteen_floats(wide, v3, float, m.scales, first, (groups, g));
        }
        let (low_even, low_odd) = octet_nibbles(narrow, next, &low_rows, pair);
        let (high_even, high_odd) = octet_nibbles(narrow, next_high, &high_rows, pair);
        let mut weights = ([zero; OCTET], [zero; OCTET]);
        for i in 0..OCTET {
            weights.0[i] = wide.join(doubled(v3, low_even[i]), doubled(v3, high_even[i]));
            weights.1[i] = wide.join(doubled(v3, low_odd[i]), doubled(v3, high_odd[i]));
        }
        // Lanes 0-3 of the codes are the pair's first group, 4-7 its second.
        let mut offsets = [zero; 2];
        for i in 0..OCTET {
            let with_even = wide.dpbusd(offsets[i / 4], offset, weights.0[i]);
            offsets[i / 4] = wide.dpbusd(with_even, offset, weights.1[i]);
        }
        for (v, x) in xs.iter().enumerate() {
            let codes = x.paired.as_chunks::<BLOCK>().0;
            let (Some(&even), Some(&odd)) = (codes.get(2 * pair), codes.get(2 * pair + 1)) else {
                continue;
            };
            let even: [i32; OCTET] = cast(even);
            let odd: [i32; OCTET] = cast(odd);
            let mut sums = [zero; 4];
            for i in 0..OCTET {
                let e = wide.splat_i32(even[i] ^ FLIP);
                let o = wide.splat_i32(odd[i] ^ FLIP);
                let at = i / 4 * 2 + i % 2;
                let with_even = wide.dpbusd(sums[at], e, weights.0[i]);
                sums[at] = wide.dpbusd(with_even, o, weights.1[i]);
            }
            for half in 0..2 {
                let group = g + half;
                let sum = wide.add_i32(sums[2 * half], sums[2 * half + 1]);
                let i = wide.sub_i32(sum, offsets[half]);
                let step = wide.splat_f32(x.steps.get(group).copied().unwrap_or(f32::NAN));
                let terms = wide.mul_f32(wide.mul_f32(halves[group % 8], step), wide.i32_to_f32(i));
                let acc = &mut accs[v][group % 8];
                *acc = wide.add_f32(*acc, terms);
            }
        }
    }
    store_sixteen(wide, accs, out);
}
