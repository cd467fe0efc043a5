//! The same row kernels as `row.rs`, written with explicit 8-lane AVX2 operations (pulp's safe
//! `V3` token) where the compiler's auto-vectorisation of `row.rs` fell short. Every lane
//! performs exactly the operations of `row.rs` in the same order (separate multiplies and adds,
//! no FMA), so the two give the same bits; `tests/kernels.rs` compares them on every format.

use pulp::bytemuck::cast;
use pulp::x86::V3;
use pulp::{f32x8, u32x8};

use super::format::{BlockScale, FloatType, Format, QMatrix};
use x86_f16c::F16c;
use x86_vnni::{Vbmi512, Vnni512};

mod wide_rows;

/// Whether [`rows_wide`] takes this matrix's format: those whose decoding it has.
pub(crate) fn takes_wide(m: &QMatrix) -> bool {
    wide_rows::decodes(m.format)
}

/// `Rows` with 512-bit registers: four rows at a time two to a register
/// (`wide_rows.rs`), the rest as `Rows` computes them; the same bits. With `vbmi`, 4-bit codes
/// are placed by byte picks, compiled for VBMI; without it, by shifts.
pub(crate) fn rows_wide(
    wide: Vnni512,
    vbmi: Option<Vbmi512>,
    m: &QMatrix,
    first: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
    y: &mut [f32],
) {
    match vbmi {
        Some(vbmi) => vbmi.vectorize(
            #[inline(always)]
            || wide_quads(wide, Some(vbmi), m, first, x, xsum, y),
        ),
        None => wide.vectorize(
            #[inline(always)]
            || wide_quads(wide, None, m, first, x, xsum, y),
        ),
    }
}

#[inline(always)]
fn wide_quads(
    wide: Vnni512,
    vbmi: Option<Vbmi512>,
    m: &QMatrix,
    first: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
    y: &mut [f32],
) {
    let v3 = wide.vnni().v3();
    let mut quads = y.chunks_exact_mut(4);
    for (q, out) in (&mut quads).enumerate() {
        out.copy_from_slice(&quad(wide, vbmi, m, first + 4 * q, x, xsum));
    }
    let done = y.len() / 4 * 4;
    for (i, out) in y[done..].iter_mut().enumerate() {
        *out = dot(v3, None, m, first + done + i, x, xsum);
    }
}

/// Vectors in one tile of [`rows_batch_tiled`].
pub(crate) const TILE_VECTORS: usize = 4;

/// Whether [`rows_batch_tiled`] takes this matrix's format.
pub(crate) fn takes_batch_tiled(m: &QMatrix) -> bool {
    wide_rows::tiles(m.format)
}

/// `RowsBatch` where the CPU has VBMI, for the formats [`takes_batch_tiled`] names, for the
/// first `tiled` vectors of `xs` (a multiple of [`TILE_VECTORS`]; `out` has a column for each
/// vector of `xs`): tiles of four rows by four vectors (`wide_rows::tile4`), each row and vector
/// with the bits of its `matvec`; the rows past the last quad one at a time, as `rows_wide`
/// computes them.
pub(crate) fn rows_batch_tiled(
    vbmi: Vbmi512,
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    tiled: usize,
    out: &mut [f32],
) {
    vbmi.vectorize(
        #[inline(always)]
        || batch_tiled(vbmi, m, first, xs, xsums, tiled, out),
    )
}

#[inline(always)]
fn batch_tiled(
    vbmi: Vbmi512,
    m: &QMatrix,
    first: usize,
    xs: &[&[f32]],
    xsums: &[Vec<[f32; 8]>],
    tiled: usize,
    out: &mut [f32],
) {
    let wide = vbmi.wide();
    let batch = xs.len();
    let rows = out.len() / batch;
    let quads = rows / 4 * 4;
    for r in (0..quads).step_by(4) {
        for b in (0..tiled).step_by(TILE_VECTORS) {
            let four = [xs[b], xs[b + 1], xs[b + 2], xs[b + 3]];
            let sums = [&xsums[b][..], &xsums[b + 1], &xsums[b + 2], &xsums[b + 3]];
            match wide_rows::tile4(vbmi, m, first + r, four, sums) {
                Some(tile) => {
                    for (v, column) in tile.iter().enumerate() {
                        for (i, y) in column.iter().enumerate() {
                            out[(r + i) * batch + b + v] = *y;
                        }
                    }
                }
                None => {
                    for v in b..b + 4 {
                        let mut four = [0f32; 4];
                        rows_apart(wide, vbmi, m, first + r, xs[v], &xsums[v], &mut four);
                        for (i, y) in four.iter().enumerate() {
                            out[(r + i) * batch + v] = *y;
                        }
                    }
                }
            }
        }
    }
    if quads < rows {
        let mut tail = [0f32; 4];
        let tail = &mut tail[..rows - quads];
        for b in 0..tiled {
            rows_apart(wide, vbmi, m, first + quads, xs[b], &xsums[b], tail);
            for (i, y) in tail.iter().enumerate() {
                out[(quads + i) * batch + b] = *y;
            }
        }
    }
}

/// `rows_wide` in a function of its own, so that the tiles' loop is compiled without it: the
/// rows the tiles leave, inlined beside them, slowed the tiles down.
#[inline(never)]
fn rows_apart(
    wide: Vnni512,
    vbmi: Vbmi512,
    m: &QMatrix,
    first: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
    y: &mut [f32],
) {
    rows_wide(wide, Some(vbmi), m, first, x, xsum, y)
}

/// Rows `r..r + 4` against `x` with 512-bit registers where `wide_rows` decodes the format,
/// as `Rows` computes them otherwise.
#[inline(always)]
fn quad(
    wide: Vnni512,
    vbmi: Option<Vbmi512>,
    m: &QMatrix,
    r: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
) -> [f32; 4] {
    match wide_rows::dot4_wide(wide, vbmi, m, r, x, xsum) {
        Some(four) => four,
        None => dot4(wide.vnni().v3(), None, m, r, x, xsum),
    }
}

pub(crate) struct Rows<'a, 'm> {
    pub v3: V3,
    /// F16C, where f16 matrices and FP8 matrices without NaN codes may use it: set only when the
    /// code runs inside `F16c::vectorize`, which compiles it for the instruction.
    pub f16c: Option<F16c>,
    pub m: &'a QMatrix<'m>,
    pub first: usize,
    pub x: &'a [f32],
    pub xsum: &'a [[f32; 8]],
    pub y: &'a mut [f32],
}

impl pulp::WithSimd for Rows<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Rows {
            v3,
            f16c,
            m,
            first,
            x,
            xsum,
            y,
        } = self;
        let mut quads = y.chunks_exact_mut(4);
        for (q, out) in (&mut quads).enumerate() {
            out.copy_from_slice(&dot4(v3, f16c, m, first + 4 * q, x, xsum));
        }
        let done = y.len() / 4 * 4;
        for (i, out) in y[done..].iter_mut().enumerate() {
            *out = dot(v3, f16c, m, first + done + i, x, xsum);
        }
    }
}

const NIBBLE_SHIFTS: [u32; 8] = [0, 4, 8, 12, 16, 20, 24, 28];

#[inline(always)]
fn reduce(acc: f32x8) -> f32 {
    let a: [f32; 8] = cast(acc);
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// The eight nibbles of a word, each in the low bits of its lane, higher bits not cleared
/// (`vpermps` and the sign shift of `e2m1` read only the low four).
#[inline(always)]
fn raw_nibbles(v3: V3, chunk: &[u8; 4]) -> u32x8 {
    v3.shr_dyn_u32x8(
        v3.splat_u32x8(u32::from_le_bytes(*chunk)),
        cast(NIBBLE_SHIFTS),
    )
}

#[inline(always)]
fn nibbles(v3: V3, chunk: &[u8; 4]) -> u32x8 {
    let word = v3.splat_u32x8(u32::from_le_bytes(*chunk));
    v3.and_u32x8(
        v3.shr_dyn_u32x8(word, cast(NIBBLE_SHIFTS)),
        v3.splat_u32x8(15),
    )
}

/// Eight bytes widened to eight u32 lanes (one `vpmovzxbd`).
#[inline(always)]
fn bytes8(v3: V3, chunk: &[u8; 8]) -> u32x8 {
    let mut wide = [0u8; 16];
    wide[..8].copy_from_slice(chunk);
    v3.convert_u8x16_to_u32x8(cast(wide))
}

/// Eight little-endian u16 widened to eight u32 lanes (one `vpmovzxwd`).
#[inline(always)]
fn halves(v3: V3, chunk: &[u8; 16]) -> u32x8 {
    v3.convert_u16x8_to_u32x8(cast(*chunk))
}

/// The e2m1 magnitudes by the code's low three bits.
const E2M1_POSITIVE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

#[inline(always)]
fn to_f32(v3: V3, q: u32x8) -> f32x8 {
    v3.convert_i32x8_to_f32x8(cast(q))
}

/// One table lookup of the magnitude (`vpermps` reads the low three bits of each lane) and the
/// code's sign bit moved into the float's: the same values as `decode::e2m1` (a negated entry
/// of the table is that entry with its sign bit set, -0.0 included). A second lookup of the
/// negatives and a blend cost one more shuffle, which shares its port with the others.
#[inline(always)]
fn e2m1(v3: V3, code: u32x8) -> f32x8 {
    let index: std::arch::x86_64::__m256i = cast(code);
    let magnitude: u32x8 = cast(v3.avx2._mm256_permutevar8x32_ps(cast(E2M1_POSITIVE), index));
    let sign = v3.and_u32x8(v3.shl_const_u32x8::<28>(code), v3.splat_u32x8(0x8000_0000));
    cast(v3.xor_u32x8(magnitude, sign))
}

/// The subnormal e4m3 magnitudes (`m * 2^-9`) by the code's low three bits.
const E4M3_SUBNORMAL: [f32; 8] = [
    0.0,
    1.0 / 512.0,
    2.0 / 512.0,
    3.0 / 512.0,
    4.0 / 512.0,
    5.0 / 512.0,
    6.0 / 512.0,
    7.0 / 512.0,
];

/// e4m3 by the exponent-bias trick of `decode::e4m3`, subnormals from a table; NaN codes are not
/// selected here (`e4m3_nan` does that, for matrices that hold any).
#[inline(always)]
fn e4m3(v3: V3, byte: u32x8) -> f32x8 {
    let magnitude = v3.and_u32x8(byte, v3.splat_u32x8(0x7F));
    let normal: f32x8 = cast(v3.wrapping_add_u32x8(
        v3.shl_const_u32x8::<20>(magnitude),
        v3.splat_u32x8(120 << 23),
    ));
    let subnormal = v3
        .avx2
        ._mm256_permutevar8x32_ps(cast(E4M3_SUBNORMAL), cast(byte));
    let value = v3.select_f32x8(
        v3.cmp_lt_u32x8(magnitude, v3.splat_u32x8(8)),
        cast(subnormal),
        normal,
    );
    let sign = v3.and_u32x8(v3.shl_const_u32x8::<24>(byte), v3.splat_u32x8(0x8000_0000));
    cast(v3.or_u32x8(cast(value), sign))
}

#[inline(always)]
fn e4m3_nan(v3: V3, byte: u32x8) -> f32x8 {
    let nan = v3.cmp_eq_u32x8(
        v3.and_u32x8(byte, v3.splat_u32x8(0x7F)),
        v3.splat_u32x8(0x7F),
    );
    v3.select_f32x8(nan, v3.splat_f32x8(f32::NAN), e4m3(v3, byte))
}

#[inline(always)]
fn f16(v3: V3, bits: u32x8) -> f32x8 {
    let magnitude = v3.and_u32x8(bits, v3.splat_u32x8(0x7FFF));
    let normal: f32x8 = cast(v3.wrapping_add_u32x8(
        v3.shl_const_u32x8::<13>(magnitude),
        v3.splat_u32x8(112 << 23),
    ));
    let subnormal = v3.mul_f32x8(to_f32(v3, magnitude), v3.splat_f32x8(1.0 / 16_777_216.0));
    let mantissa = v3.shl_const_u32x8::<13>(v3.and_u32x8(magnitude, v3.splat_u32x8(0x3FF)));
    let special: f32x8 = cast(v3.or_u32x8(mantissa, v3.splat_u32x8(0x7F80_0000)));
    let value = v3.select_f32x8(
        v3.cmp_lt_u32x8(magnitude, v3.splat_u32x8(0x400)),
        subnormal,
        normal,
    );
    let value = v3.select_f32x8(
        v3.cmp_ge_u32x8(magnitude, v3.splat_u32x8(0x7C00)),
        special,
        value,
    );
    let sign = v3.shl_const_u32x8::<16>(v3.and_u32x8(bits, v3.splat_u32x8(0x8000)));
    cast(v3.or_u32x8(cast(value), sign))
}

/// One format's decoding of a chunk of 8 elements and folding of a finished segment. Methods,
/// not closures, so that they inline into the AVX2 context (a closure would be compiled apart,
/// without AVX2, and every intrinsic in it would become a call).
trait Segments<const CB: usize> {
    /// Whether the skeletons should hand `decode_pair` two chunks at a time: set where one
    /// wider operation decodes both for less than two `decode`s (the default keeps every other
    /// format's loop, and its register use, as it was).
    const PAIRS: bool = false;
    fn decode(&self, chunk: &[u8; CB]) -> f32x8;
    #[inline(always)]
    fn decode_pair(&self, pair: &[[u8; CB]; 2]) -> [f32x8; 2] {
        [self.decode(&pair[0]), self.decode(&pair[1])]
    }
    fn finish(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8;
    /// Whether `prefetch` asks for anything: the skeletons skip working out addresses for
    /// decodings that cannot prefetch.
    const PREFETCHES: bool = false;
    /// Asks for the cache line holding `bytes[0]` ahead of its use, where the decoding has a
    /// way to (a hint: no result changes).
    #[inline(always)]
    fn prefetch(&self, _bytes: &[u8]) {}
}

/// `part + d * x8` for each chunk of `chunks` with the matching `x8s`, in order: by pairs
/// where `k` decodes pairs (the same operations on the same values, so the same bits).
#[inline(always)]
fn add_products<const CB: usize, K: Segments<CB>>(
    v3: V3,
    mut part: f32x8,
    chunks: &[[u8; CB]],
    x8s: &[[f32; 8]],
    k: &K,
) -> f32x8 {
    let mut lone_from = 0;
    if K::PAIRS {
        let (pairs, x_pairs) = (chunks.as_chunks::<2>().0, x8s.as_chunks::<2>().0);
        for (pair, xp) in pairs.iter().zip(x_pairs) {
            let [d0, d1] = k.decode_pair(pair);
            part = v3.add_f32x8(part, v3.mul_f32x8(d0, cast(xp[0])));
            part = v3.add_f32x8(part, v3.mul_f32x8(d1, cast(xp[1])));
        }
        lone_from = pairs.len().min(x_pairs.len()) * 2;
    }
    for (chunk, x8) in chunks.iter().zip(x8s).skip(lone_from) {
        part = v3.add_f32x8(part, v3.mul_f32x8(k.decode(chunk), cast(*x8)));
    }
    part
}

/// The skeleton of `row::segmented`, lane for lane.
#[inline(always)]
fn segmented<const CB: usize, K: Segments<CB>>(
    v3: V3,
    row: &[u8],
    x: &[f32],
    seg: usize,
    k: &K,
) -> f32 {
    let mut acc = v3.splat_f32x8(0.0);
    let seg_bytes = seg / 8 * CB;
    for (s, (bytes, xs)) in row.chunks(seg_bytes).zip(x.chunks(seg)).enumerate() {
        let (chunks, x8s) = (bytes.as_chunks::<CB>().0, xs.as_chunks::<8>().0);
        let part = add_products(v3, v3.splat_f32x8(0.0), chunks, x8s, k);
        acc = k.finish(s, part, acc);
    }
    reduce(acc)
}

/// How far ahead of the bytes they work on `segmented4` and `segmented_across` ask for a row's
/// bytes (where the decoding prefetches). The hardware prefetcher alone left the loads of FP8
/// rows waiting on memory, read four at a time (four streams) on an AMD VM and one after another
/// on an Intel one; with these prefetches four rows at a time ran fastest on the Intel VM for
/// every prefetching format and width (docs/measurements/kernels.md). 1 and 4 KiB did as well.
const PREFETCH_DISTANCE: usize = 2048;

/// Bytes of one cache line.
const CACHE_LINE: usize = 64;

/// The bytes from offset `at` of `row` followed by `then` (what follows it in memory).
#[inline(always)]
fn bytes_from<'a>(row: &'a [u8], then: &'a [u8], at: usize) -> &'a [u8] {
    match row.get(at..) {
        Some(rest) => rest,
        None => then.get(at - row.len()..).unwrap_or(&[]),
    }
}

/// Offset `at` of row `i`'s stream in `segmented4`, in `tail` (its four rows, then the rest of
/// the matrix): past the row's end, where row `i + 4` (the same stream's next row) starts.
#[inline(always)]
fn four_ahead(tail: &[u8], row_bytes: usize, i: usize, at: usize) -> &[u8] {
    let offset = match at < row_bytes {
        true => i * row_bytes + at,
        false => (i + 4) * row_bytes + at - row_bytes,
    };
    tail.get(offset..).unwrap_or(&[])
}

/// How many segments of one row `segmented_across` keeps in flight.
const SEGMENTS_IN_FLIGHT: usize = 4;

/// `segmented` with four segments of one row in flight at once: each segment's part is its own
/// chain of additions (so the adder's latency is hidden, as four rows at once hide it), the
/// parts are folded in segment order, and each part runs `segmented`'s operations in its order,
/// so the result has its bits. A lone FP8 row (left over from the fours) goes this way: it
/// shares no chunk of `x` with another row. `then` is what follows the row in memory, where
/// the prefetches run on to as the row ends.
/// (Loops and helper functions, no closures: a closure would be compiled without AVX2.)
#[inline(always)]
fn segmented_across<const CB: usize, K: Segments<CB>>(
    v3: V3,
    row: &[u8],
    then: &[u8],
    x: &[f32],
    seg: usize,
    k: &K,
) -> f32 {
    let zero = v3.splat_f32x8(0.0);
    let per = (seg / 8).max(1);
    let (chunks, x8s) = (row.as_chunks::<CB>().0, x.as_chunks::<8>().0);
    let span = SEGMENTS_IN_FLIGHT * per;
    let spans = x8s.len().min(chunks.len()) / span;
    let mut acc = zero;
    for q in 0..spans {
        if K::PREFETCHES {
            let ahead = q * span * CB + PREFETCH_DISTANCE;
            for line in (0..span * CB).step_by(CACHE_LINE) {
                k.prefetch(bytes_from(row, then, ahead + line));
            }
        }
        let (w, xs) = (&chunks[q * span..][..span], &x8s[q * span..][..span]);
        let parts = four_parts(
            v3,
            [
                &w[..per],
                &w[per..2 * per],
                &w[2 * per..3 * per],
                &w[3 * per..],
            ],
            [
                &xs[..per],
                &xs[per..2 * per],
                &xs[2 * per..3 * per],
                &xs[3 * per..],
            ],
            [k; 4],
        );
        for (i, part) in parts.into_iter().enumerate() {
            acc = k.finish(q * SEGMENTS_IN_FLIGHT + i, part, acc);
        }
    }
    let done = (spans * span).min(chunks.len());
    let rest = chunks[done..].chunks(per).zip(x8s[done..].chunks(per));
    for (i, (w, xs)) in rest.enumerate() {
        let part = add_products(v3, zero, w, xs, k);
        acc = k.finish(spans * SEGMENTS_IN_FLIGHT + i, part, acc);
    }
    reduce(acc)
}

#[inline(always)]
fn add_product(v3: V3, part: f32x8, d: f32x8, x: &[f32; 8]) -> f32x8 {
    v3.add_f32x8(part, v3.mul_f32x8(d, cast(*x)))
}

#[inline(always)]
fn add_pair<const CB: usize, K: Segments<CB>>(
    v3: V3,
    part: f32x8,
    pair: &[[u8; CB]; 2],
    x: &[[f32; 8]; 2],
    k: &K,
) -> f32x8 {
    let [a, b] = k.decode_pair(pair);
    add_product(v3, add_product(v3, part, a, &x[0]), b, &x[1])
}

/// The parts of four segments of equal length, chunk by chunk across the four.
#[inline(always)]
fn four_parts<const CB: usize, K: Segments<CB>>(
    v3: V3,
    w: [&[[u8; CB]]; 4],
    xs: [&[[f32; 8]]; 4],
    k: [&K; 4],
) -> [f32x8; 4] {
    let zero = v3.splat_f32x8(0.0);
    let (mut p0, mut p1, mut p2, mut p3) = (zero, zero, zero, zero);
    let len = xs[0].len();
    let mut lone_from = 0;
    if K::PAIRS {
        let [w0, w1, w2, w3] = w;
        let (w0, w1, w2, w3) = (
            w0.as_chunks::<2>().0,
            w1.as_chunks::<2>().0,
            w2.as_chunks::<2>().0,
            w3.as_chunks::<2>().0,
        );
        let [x0, x1, x2, x3] = xs;
        let (x0, x1, x2, x3) = (
            x0.as_chunks::<2>().0,
            x1.as_chunks::<2>().0,
            x2.as_chunks::<2>().0,
            x3.as_chunks::<2>().0,
        );
        let pairs = len / 2;
        for c in 0..pairs {
            p0 = add_pair(v3, p0, &w0[c], &x0[c], k[0]);
            p1 = add_pair(v3, p1, &w1[c], &x1[c], k[1]);
            p2 = add_pair(v3, p2, &w2[c], &x2[c], k[2]);
            p3 = add_pair(v3, p3, &w3[c], &x3[c], k[3]);
        }
        lone_from = pairs * 2;
    }
    for c in lone_from..len {
        p0 = add_product(v3, p0, k[0].decode(&w[0][c]), &xs[0][c]);
        p1 = add_product(v3, p1, k[1].decode(&w[1][c]), &xs[1][c]);
        p2 = add_product(v3, p2, k[2].decode(&w[2][c]), &xs[2][c]);
        p3 = add_product(v3, p3, k[3].decode(&w[3][c]), &xs[3][c]);
    }
    [p0, p1, p2, p3]
}

/// `segmented` for four rows at once: four independent chains of additions (one row's adds
/// depend on each other, so a single row waits on the adder's latency), each row's operations
/// and their order exactly those of `segmented`. Where the decoding prefetches, each row's bytes
/// are asked for `PREFETCH_DISTANCE` ahead, and past its end the same stream's next row (row
/// `i + 4`, in `tail`: the four rows and what follows them).
#[inline(always)]
fn segmented4<const CB: usize, K: Segments<CB>>(
    v3: V3,
    rows: [&[u8]; 4],
    tail: &[u8],
    x: &[f32],
    seg: usize,
    k: &[K; 4],
) -> [f32; 4] {
    // Four named accumulators, not an array, so that they stay in registers.
    let zero = v3.splat_f32x8(0.0);
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    let [c0, c1, c2, c3] = rows.map(|r| r.as_chunks::<CB>().0);
    let per_segment = seg / 8;
    for (s, x_segment) in x.as_chunks::<8>().0.chunks(per_segment).enumerate() {
        let first = s * per_segment;
        let end = first + x_segment.len();
        let (w0, w1, w2, w3) = (
            &c0[first..end],
            &c1[first..end],
            &c2[first..end],
            &c3[first..end],
        );
        if K::PREFETCHES {
            let at = first * CB + PREFETCH_DISTANCE;
            for line in (0..x_segment.len() * CB).step_by(CACHE_LINE) {
                for (i, k) in k.iter().enumerate() {
                    k.prefetch(four_ahead(tail, rows[0].len(), i, at + line));
                }
            }
        }
        let (mut p0, mut p1, mut p2, mut p3) = (zero, zero, zero, zero);
        let mut lone_from = 0;
        if K::PAIRS {
            let (x_pairs, _) = x_segment.as_chunks::<2>();
            let (q0, q1, q2, q3) = (
                w0.as_chunks::<2>().0,
                w1.as_chunks::<2>().0,
                w2.as_chunks::<2>().0,
                w3.as_chunks::<2>().0,
            );
            for (c, xp) in x_pairs.iter().enumerate() {
                p0 = add_pair(v3, p0, &q0[c], xp, &k[0]);
                p1 = add_pair(v3, p1, &q1[c], xp, &k[1]);
                p2 = add_pair(v3, p2, &q2[c], xp, &k[2]);
                p3 = add_pair(v3, p3, &q3[c], xp, &k[3]);
            }
            lone_from = x_pairs.len() * 2;
        }
        for (c, x8) in x_segment.iter().enumerate().skip(lone_from) {
            let x8: f32x8 = cast(*x8);
            p0 = v3.add_f32x8(p0, v3.mul_f32x8(k[0].decode(&w0[c]), x8));
            p1 = v3.add_f32x8(p1, v3.mul_f32x8(k[1].decode(&w1[c]), x8));
            p2 = v3.add_f32x8(p2, v3.mul_f32x8(k[2].decode(&w2[c]), x8));
            p3 = v3.add_f32x8(p3, v3.mul_f32x8(k[3].decode(&w3[c]), x8));
        }
        a0 = k[0].finish(s, p0, a0);
        a1 = k[1].finish(s, p1, a1);
        a2 = k[2].finish(s, p2, a2);
        a3 = k[3].finish(s, p3, a3);
    }
    [reduce(a0), reduce(a1), reduce(a2), reduce(a3)]
}

struct Dense {
    v3: V3,
    format: FloatType,
}

impl Segments<32> for Dense {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 32]) -> f32x8 {
        cast(*chunk)
    }
    #[inline(always)]
    fn finish(&self, _: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.v3.add_f32x8(acc, part)
    }
}

impl Segments<16> for Dense {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 16]) -> f32x8 {
        let v3 = self.v3;
        match self.format {
            FloatType::F16 => f16(v3, halves(v3, chunk)),
            _ => cast(v3.shl_const_u32x8::<16>(halves(v3, chunk))),
        }
    }
    #[inline(always)]
    fn finish(&self, _: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.v3.add_f32x8(acc, part)
    }
}

/// f16 through F16C's `vcvtph2ps`: the same values as [`f16`] for every code but a NaN, whose
/// quiet bit it sets. The first operation on the value (the multiply by `x`) sets that bit
/// anyway, so every result keeps its bits.
struct DenseF16c {
    f16c: F16c,
}

impl Segments<16> for DenseF16c {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 16]) -> f32x8 {
        cast(self.f16c.widen(cast(*chunk)))
    }
    #[inline(always)]
    fn finish(&self, _: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.f16c.v3().add_f32x8(acc, part)
    }
}

struct Affine<'a, 'm> {
    v3: V3,
    /// Only to prefetch with, where the machine has it.
    f16c: Option<F16c>,
    m: &'a QMatrix<'m>,
    scale: FloatType,
    first_group: usize,
    xsum: &'a [[f32; 8]],
}

impl Affine<'_, '_> {
    #[inline(always)]
    fn fold(&self, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        let v3 = self.v3;
        let s = v3.splat_f32x8(self.scale.read(self.m.scales, self.first_group + g));
        let b = v3.splat_f32x8(self.scale.read(self.m.biases, self.first_group + g));
        let term = v3.add_f32x8(v3.mul_f32x8(s, part), v3.mul_f32x8(b, cast(self.xsum[g])));
        v3.add_f32x8(acc, term)
    }
}

impl Segments<4> for Affine<'_, '_> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 4]) -> f32x8 {
        to_f32(self.v3, nibbles(self.v3, chunk))
    }
    #[inline(always)]
    fn finish(&self, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.fold(g, part, acc)
    }
    const PREFETCHES: bool = true;
    #[inline(always)]
    fn prefetch(&self, bytes: &[u8]) {
        if let Some(f16c) = self.f16c {
            f16c.prefetch(bytes)
        }
    }
}

impl Segments<8> for Affine<'_, '_> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 8]) -> f32x8 {
        to_f32(self.v3, bytes8(self.v3, chunk))
    }
    #[inline(always)]
    fn finish(&self, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.fold(g, part, acc)
    }
    const PREFETCHES: bool = true;
    #[inline(always)]
    fn prefetch(&self, bytes: &[u8]) {
        if let Some(f16c) = self.f16c {
            f16c.prefetch(bytes)
        }
    }
}

/// MXFP4 (CB 4) and FP8 (CB 8): a power-of-two or float scale per segment.
struct Scaled<'a> {
    v3: V3,
    scales: &'a [u8],
    scale: BlockScale,
    first: usize,
}

impl Scaled<'_> {
    #[inline(always)]
    fn fold(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        let v3 = self.v3;
        let s = match self.scale {
            BlockScale::E8m0 => super::decode::e8m0(u32::from(self.scales[self.first + segment])),
            BlockScale::Float(t) => t.read(self.scales, self.first + segment),
        };
        v3.add_f32x8(acc, v3.mul_f32x8(v3.splat_f32x8(s), part))
    }
}

impl Segments<4> for Scaled<'_> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 4]) -> f32x8 {
        e2m1(self.v3, raw_nibbles(self.v3, chunk))
    }
    #[inline(always)]
    fn finish(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.fold(segment, part, acc)
    }
}

/// FP8 blocks without NaN codes through F16C: an e4m3 byte's bits, placed in an f16's sign,
/// exponent and top mantissa bits, are its value times 2^-8 (the biases differ by 8, and
/// subnormals line up too), so a sign-extending widen, a shift by 7 and a mask (the sign's
/// copy out of the exponent's top bit) give the f16, `vcvtph2ps` the f32, and an exact multiply
/// by 256 the value `e4m3` gives: five instructions where the integer decoding takes ten.
/// `PRESCALED`: the kernel is handed `x` times 256 instead (`fp8_x_times_256`), and the
/// multiply is left out: `(v / 256) * (256 x)` is the same real number as `v * x` (both
/// scalings are exact), so it rounds to the same bits.
struct Fp8F16c<'a, const PRESCALED: bool = false>(F16c, Scaled<'a>);

impl<const PRESCALED: bool> Fp8F16c<'_, PRESCALED> {
    #[inline(always)]
    fn times_256(&self, quarter: f32x8) -> f32x8 {
        if PRESCALED {
            quarter
        } else {
            self.0
                .v3()
                .mul_f32x8(quarter, self.0.v3().splat_f32x8(256.0))
        }
    }
}

impl<const PRESCALED: bool> Segments<8> for Fp8F16c<'_, PRESCALED> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 8]) -> f32x8 {
        let v3 = self.0.v3();
        let mut wide = [0u8; 16];
        wide[..8].copy_from_slice(chunk);
        let words = v3.sse4_1._mm_cvtepi8_epi16(cast(wide));
        let halves = v3
            .sse2
            ._mm_and_si128(v3.sse2._mm_slli_epi16::<7>(words), cast([0xBFFFu16; 8]));
        self.times_256(cast(self.0.widen(halves)))
    }
    const PAIRS: bool = true;
    /// Sixteen bytes in one step: one 256-bit sign-extension, shift and mask, then a widen of
    /// each half (the steps of `decode`, on the same lanes).
    #[inline(always)]
    fn decode_pair(&self, pair: &[[u8; 8]; 2]) -> [f32x8; 2] {
        let v3 = self.0.v3();
        let bytes: [u8; 16] = cast(*pair);
        let words = v3.avx2._mm256_cvtepi8_epi16(cast(bytes));
        let halves = v3
            .avx2
            ._mm256_and_si256(v3.avx2._mm256_slli_epi16::<7>(words), cast([0xBFFFu16; 16]));
        let low = v3.avx._mm256_castsi256_si128(halves);
        let high = v3.avx2._mm256_extracti128_si256::<1>(halves);
        [
            self.times_256(cast(self.0.widen(low))),
            self.times_256(cast(self.0.widen(high))),
        ]
    }
    #[inline(always)]
    fn finish(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.1.fold(segment, part, acc)
    }
    const PREFETCHES: bool = true;
    #[inline(always)]
    fn prefetch(&self, bytes: &[u8]) {
        self.0.prefetch(bytes)
    }
}

/// A decoding that also prefetches through the F16C token: MXFP4's `Scaled`, which holds no
/// token (FP8's F16C decoding holds its own).
struct Prefetching<K>(K, F16c);

impl<const CB: usize, K: Segments<CB>> Segments<CB> for Prefetching<K> {
    const PAIRS: bool = K::PAIRS;
    #[inline(always)]
    fn decode(&self, chunk: &[u8; CB]) -> f32x8 {
        self.0.decode(chunk)
    }
    #[inline(always)]
    fn decode_pair(&self, pair: &[[u8; CB]; 2]) -> [f32x8; 2] {
        self.0.decode_pair(pair)
    }
    #[inline(always)]
    fn finish(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.0.finish(segment, part, acc)
    }
    const PREFETCHES: bool = true;
    #[inline(always)]
    fn prefetch(&self, bytes: &[u8]) {
        self.1.prefetch(bytes)
    }
}

/// FP8 blocks; `NAN` selects NaN codes element by element (only matrices that hold any).
struct Fp8<'a, const NAN: bool>(Scaled<'a>);

impl<const NAN: bool> Segments<8> for Fp8<'_, NAN> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 8]) -> f32x8 {
        let bytes = bytes8(self.0.v3, chunk);
        if NAN {
            e4m3_nan(self.0.v3, bytes)
        } else {
            e4m3(self.0.v3, bytes)
        }
    }
    #[inline(always)]
    fn finish(&self, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.0.fold(segment, part, acc)
    }
}

/// An FP8 row through `segmented_across` in the decoding its matrix allows; `then` is what
/// follows the row in memory (prefetched as the row ends), `x256` is `x` times 256 where the
/// caller could make it (else empty).
#[inline(always)]
// The row, its matrix and both forms of the input: bundling them would only rename them.
#[allow(clippy::too_many_arguments)]
fn fp8_across(
    v3: V3,
    f16c: Option<F16c>,
    m: &QMatrix,
    row: &[u8],
    then: &[u8],
    x: &[f32],
    x256: &[[f32; 8]],
    block_cols: usize,
    scaled: Scaled,
) -> f32 {
    if m.fp8_nan_codes {
        segmented_across::<8, _>(v3, row, then, x, block_cols, &Fp8::<true>(scaled))
    } else if let (Some(f16c), false) = (f16c, x256.is_empty()) {
        let k = Fp8F16c::<true>(f16c, scaled);
        segmented_across::<8, _>(v3, row, then, x256.as_flattened(), block_cols, &k)
    } else if let Some(f16c) = f16c {
        let k = Fp8F16c::<false>(f16c, scaled);
        segmented_across::<8, _>(v3, row, then, x, block_cols, &k)
    } else {
        segmented_across::<8, _>(v3, row, then, x, block_cols, &Fp8::<false>(scaled))
    }
}

/// Four dense rows (F32, F16 or BF16): `segmented4` with the whole row as its one segment, as
/// `row.rs` sums a dense row, so the same operations in the same order and the same bits; where
/// `k` prefetches, each row's stream asks for its bytes `PREFETCH_DISTANCE` ahead, a cache line
/// at a time, through the row. A dense row is one segment, so `segmented4`'s prefetches (all of
/// a segment's lines before it starts) would ask for a whole row at once, most of it long
/// before it is read. Four BF16 streams read by the hardware prefetcher alone waited on memory:
/// 60% of a gpt-oss-shaped decode with 8-bit activations, its head and attention, stalled on
/// these loads on a 2-vCPU AMD EPYC VM.
#[inline(always)]
fn dense4<const CB: usize, K: Segments<CB>>(
    v3: V3,
    rows: [&[u8]; 4],
    tail: &[u8],
    x: &[f32],
    k: &K,
) -> [f32; 4] {
    let zero = v3.splat_f32x8(0.0);
    let (mut p0, mut p1, mut p2, mut p3) = (zero, zero, zero, zero);
    let [w0, w1, w2, w3] = rows.map(|r| r.as_chunks::<CB>().0);
    let row_bytes = rows[0].len();
    let chunks_per_line = (CACHE_LINE / CB).max(1);
    for (c, x8) in x.as_chunks::<8>().0.iter().enumerate() {
        if K::PREFETCHES && c % chunks_per_line == 0 {
            let at = c * CB + PREFETCH_DISTANCE;
            for i in 0..4 {
                k.prefetch(four_ahead(tail, row_bytes, i, at));
            }
        }
        let x8: f32x8 = cast(*x8);
        p0 = v3.add_f32x8(p0, v3.mul_f32x8(k.decode(&w0[c]), x8));
        p1 = v3.add_f32x8(p1, v3.mul_f32x8(k.decode(&w1[c]), x8));
        p2 = v3.add_f32x8(p2, v3.mul_f32x8(k.decode(&w2[c]), x8));
        p3 = v3.add_f32x8(p3, v3.mul_f32x8(k.decode(&w3[c]), x8));
    }
    [
        reduce(k.finish(0, p0, zero)),
        reduce(k.finish(0, p1, zero)),
        reduce(k.finish(0, p2, zero)),
        reduce(k.finish(0, p3, zero)),
    ]
}

#[inline(always)]
fn dot4(
    v3: V3,
    f16c: Option<F16c>,
    m: &QMatrix,
    r: usize,
    x: &[f32],
    xsum: &[[f32; 8]],
) -> [f32; 4] {
    let row_bytes = m.row_bytes();
    let rows: [&[u8]; 4] =
        std::array::from_fn(|i| &m.packed[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
    // The four rows and what follows them, for the prefetches of `segmented4`.
    let tail = m.packed.get(r * row_bytes..).unwrap_or(&[]);
    match m.format {
        Format::Dense(FloatType::F32) => {
            let k = Dense {
                v3,
                format: FloatType::F32,
            };
            match f16c {
                Some(f16c) => dense4::<32, _>(v3, rows, tail, x, &Prefetching(k, f16c)),
                None => dense4::<32, _>(v3, rows, tail, x, &k),
            }
        }
        Format::Dense(format) => match (format, f16c) {
            (FloatType::F16, Some(f16c)) => {
                dense4::<16, _>(v3, rows, tail, x, &Prefetching(DenseF16c { f16c }, f16c))
            }
            (_, Some(f16c)) => {
                dense4::<16, _>(v3, rows, tail, x, &Prefetching(Dense { v3, format }, f16c))
            }
            (_, None) => dense4::<16, _>(v3, rows, tail, x, &Dense { v3, format }),
        },
        Format::Affine { bits, group, scale } => {
            let groups = m.cols / group;
            let k: [Affine; 4] = std::array::from_fn(|i| Affine {
                v3,
                f16c,
                m,
                scale,
                first_group: (r + i) * groups,
                xsum,
            });
            if bits == 4 {
                segmented4::<4, _>(v3, rows, tail, x, group, &k)
            } else {
                segmented4::<8, _>(v3, rows, tail, x, group, &k)
            }
        }
        Format::Mxfp4 => {
            let k: [Scaled; 4] = std::array::from_fn(|i| Scaled {
                v3,
                scales: m.scales,
                scale: BlockScale::E8m0,
                first: (r + i) * (m.cols / 32),
            });
            match f16c {
                Some(f16c) => {
                    let k = k.map(|k| Prefetching(k, f16c));
                    segmented4::<4, _>(v3, rows, tail, x, 32, &k)
                }
                None => segmented4::<4, _>(v3, rows, tail, x, 32, &k),
            }
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let grid = m.cols.div_ceil(block_cols);
            let scaled = |i: usize| Scaled {
                v3,
                scales: m.scales,
                scale,
                first: ((r + i) / block_rows) * grid,
            };
            if m.fp8_nan_codes {
                let k: [Fp8<true>; 4] = std::array::from_fn(|i| Fp8(scaled(i)));
                segmented4::<8, _>(v3, rows, tail, x, block_cols, &k)
            } else if let (Some(f16c), false) = (f16c, xsum.is_empty()) {
                let k: [Fp8F16c<true>; 4] = std::array::from_fn(|i| Fp8F16c(f16c, scaled(i)));
                segmented4::<8, _>(v3, rows, tail, xsum.as_flattened(), block_cols, &k)
            } else if let Some(f16c) = f16c {
                let k: [Fp8F16c; 4] = std::array::from_fn(|i| Fp8F16c(f16c, scaled(i)));
                segmented4::<8, _>(v3, rows, tail, x, block_cols, &k)
            } else {
                let k: [Fp8<false>; 4] = std::array::from_fn(|i| Fp8(scaled(i)));
                segmented4::<8, _>(v3, rows, tail, x, block_cols, &k)
            }
        }
    }
}

#[inline(always)]
fn dot(v3: V3, f16c: Option<F16c>, m: &QMatrix, r: usize, x: &[f32], xsum: &[[f32; 8]]) -> f32 {
    let row_bytes = m.row_bytes();
    let row = &m.packed[r * row_bytes..(r + 1) * row_bytes];
    match m.format {
        Format::Dense(FloatType::F32) => segmented::<32, _>(
            v3,
            row,
            x,
            m.cols,
            &Dense {
                v3,
                format: FloatType::F32,
            },
        ),
        Format::Dense(format) => match (format, f16c) {
            (FloatType::F16, Some(f16c)) => {
                segmented::<16, _>(v3, row, x, m.cols, &DenseF16c { f16c })
            }
            _ => segmented::<16, _>(v3, row, x, m.cols, &Dense { v3, format }),
        },
        Format::Affine { bits, group, scale } => {
            let k = Affine {
                v3,
                f16c,
                m,
                scale,
                first_group: r * (m.cols / group),
                xsum,
            };
            if bits == 4 {
                segmented::<4, _>(v3, row, x, group, &k)
            } else {
                segmented::<8, _>(v3, row, x, group, &k)
            }
        }
        Format::Mxfp4 => {
            let k = Scaled {
                v3,
                scales: m.scales,
                scale: BlockScale::E8m0,
                first: r * (m.cols / 32),
            };
            segmented::<4, _>(v3, row, x, 32, &k)
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let first = (r / block_rows) * m.cols.div_ceil(block_cols);
            let scaled = Scaled {
                v3,
                scales: m.scales,
                scale,
                first,
            };
            // A lone row reuses no chunk of `x` whatever its width: four segments in flight.
            let then = m.packed.get((r + 1) * row_bytes..).unwrap_or(&[]);
            fp8_across(v3, f16c, m, row, then, x, xsum, block_cols, scaled)
        }
    }
}

/// A format's decoding of a chunk and, for vector `vector` of a batch, the folding of a finished
/// segment (only affine folding differs between vectors: it reads the vector's lane sums).
trait BatchSegments<const CB: usize> {
    fn decode(&self, chunk: &[u8; CB]) -> f32x8;
    fn finish(&self, vector: usize, segment: usize, part: f32x8, acc: f32x8) -> f32x8;
}

/// A format whose folding is the same for every vector.
struct Same<K>(K);

impl<const CB: usize, K: Segments<CB>> BatchSegments<CB> for Same<K> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; CB]) -> f32x8 {
        self.0.decode(chunk)
    }
    #[inline(always)]
    fn finish(&self, _: usize, segment: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.0.finish(segment, part, acc)
    }
}

/// Affine folding with each vector's own lane sums.
struct AffineBatch<'a, 'm> {
    v3: V3,
    m: &'a QMatrix<'m>,
    scale: FloatType,
    first_group: usize,
    xsums: &'a [Vec<[f32; 8]>],
}

impl AffineBatch<'_, '_> {
    #[inline(always)]
    fn fold(&self, vector: usize, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        let v3 = self.v3;
        let s = v3.splat_f32x8(self.scale.read(self.m.scales, self.first_group + g));
        let b = v3.splat_f32x8(self.scale.read(self.m.biases, self.first_group + g));
        let term = v3.add_f32x8(
            v3.mul_f32x8(s, part),
            v3.mul_f32x8(b, cast(self.xsums[vector][g])),
        );
        v3.add_f32x8(acc, term)
    }
}

impl BatchSegments<4> for AffineBatch<'_, '_> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 4]) -> f32x8 {
        to_f32(self.v3, nibbles(self.v3, chunk))
    }
    #[inline(always)]
    fn finish(&self, vector: usize, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.fold(vector, g, part, acc)
    }
}

impl BatchSegments<8> for AffineBatch<'_, '_> {
    #[inline(always)]
    fn decode(&self, chunk: &[u8; 8]) -> f32x8 {
        to_f32(self.v3, bytes8(self.v3, chunk))
    }
    #[inline(always)]
    fn finish(&self, vector: usize, g: usize, part: f32x8, acc: f32x8) -> f32x8 {
        self.fold(vector, g, part, acc)
    }
}

/// Rows of `m` against a batch of vectors: `out[i * batch + b]` is row `first + i` dotted with
/// `xs[b]`. Tiles of two rows by four vectors: each chunk of a row is decoded once for four
/// vectors and each chunk of a vector loaded once for two rows; every (row, vector) runs exactly
/// the operations of `segmented`, in its order, so each output has the bits `dot` gives it.
/// A row left over from the tiles goes through `dot`, a vector left over through `dot4` (four
/// rows at a time), which run the same operations.
pub(crate) struct RowsBatch<'a, 'm> {
    pub v3: V3,
    /// As for [`Rows`].
    pub f16c: Option<F16c>,
    pub m: &'a QMatrix<'m>,
    pub first: usize,
    pub xs: &'a [&'a [f32]],
    pub xsums: &'a [Vec<[f32; 8]>],
    pub out: &'a mut [f32],
}

impl pulp::WithSimd for RowsBatch<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let RowsBatch {
            v3,
            f16c,
            m,
            first,
            xs,
            xsums,
            out,
        } = self;
        let batch = xs.len();
        let rows = out.len() / batch;
        let tiled_rows = rows / 2 * 2;
        let tiled_vectors = batch / 4 * 4;
        for r in (0..tiled_rows).step_by(2) {
            for b in (0..tiled_vectors).step_by(4) {
                let four = [xs[b], xs[b + 1], xs[b + 2], xs[b + 3]];
                let tile = dot_tile(v3, f16c, m, first + r, four, &xsums[b..b + 4]);
                for (i, row) in tile.iter().enumerate() {
                    out[(r + i) * batch + b..(r + i) * batch + b + 4].copy_from_slice(row);
                }
            }
        }
        for r in tiled_rows..rows {
            for b in 0..tiled_vectors {
                out[r * batch + b] = dot(v3, f16c, m, first + r, xs[b], &xsums[b]);
            }
        }
        // Vectors left over from the tiles: four rows at a time, as `Rows` does.
        for b in tiled_vectors..batch {
            let quads = rows / 4 * 4;
            for r in (0..quads).step_by(4) {
                let four = dot4(v3, f16c, m, first + r, xs[b], &xsums[b]);
                for (i, v) in four.iter().enumerate() {
                    out[(r + i) * batch + b] = *v;
                }
            }
            for r in quads..rows {
                out[r * batch + b] = dot(v3, f16c, m, first + r, xs[b], &xsums[b]);
            }
        }
    }
}

/// `segmented` for two rows and four vectors at once (eight independent chains of additions);
/// `k[i].finish(j, ..)` folds row `i`'s segment for vector `j`.
#[inline(always)]
fn segmented_tile<const CB: usize, K: BatchSegments<CB>>(
    v3: V3,
    rows: [&[u8]; 2],
    xs: [&[f32]; 4],
    seg: usize,
    k: &[K; 2],
) -> [[f32; 4]; 2] {
    let zero = v3.splat_f32x8(0.0);
    let (c0, c1) = (rows[0].as_chunks::<CB>().0, rows[1].as_chunks::<CB>().0);
    let x = xs.map(|x| x.as_chunks::<8>().0);
    let per_segment = seg / 8;
    let mut acc = [[zero; 4]; 2];
    let mut from = 0;
    let mut s = 0;
    while from < c0.len() {
        let to = (from + per_segment).min(c0.len());
        let (mut p00, mut p01, mut p02, mut p03) = (zero, zero, zero, zero);
        let (mut p10, mut p11, mut p12, mut p13) = (zero, zero, zero, zero);
        for c in from..to {
            let w0 = k[0].decode(&c0[c]);
            let w1 = k[1].decode(&c1[c]);
            let (x0, x1, x2, x3): (f32x8, f32x8, f32x8, f32x8) =
                (cast(x[0][c]), cast(x[1][c]), cast(x[2][c]), cast(x[3][c]));
            p00 = v3.add_f32x8(p00, v3.mul_f32x8(w0, x0));
            p01 = v3.add_f32x8(p01, v3.mul_f32x8(w0, x1));
            p02 = v3.add_f32x8(p02, v3.mul_f32x8(w0, x2));
            p03 = v3.add_f32x8(p03, v3.mul_f32x8(w0, x3));
            p10 = v3.add_f32x8(p10, v3.mul_f32x8(w1, x0));
            p11 = v3.add_f32x8(p11, v3.mul_f32x8(w1, x1));
            p12 = v3.add_f32x8(p12, v3.mul_f32x8(w1, x2));
            p13 = v3.add_f32x8(p13, v3.mul_f32x8(w1, x3));
        }
        let parts = [[p00, p01, p02, p03], [p10, p11, p12, p13]];
        for i in 0..2 {
            for j in 0..4 {
                acc[i][j] = k[i].finish(j, s, parts[i][j], acc[i][j]);
            }
        }
        from = to;
        s += 1;
    }
    acc.map(|row| row.map(reduce))
}

#[inline(always)]
fn dot_tile(
    v3: V3,
    f16c: Option<F16c>,
    m: &QMatrix,
    r: usize,
    xs: [&[f32]; 4],
    xsums: &[Vec<[f32; 8]>],
) -> [[f32; 4]; 2] {
    let row_bytes = m.row_bytes();
    let rows: [&[u8]; 2] =
        std::array::from_fn(|i| &m.packed[(r + i) * row_bytes..(r + i + 1) * row_bytes]);
    match m.format {
        Format::Dense(FloatType::F32) => {
            let k = [(); 2].map(|_| {
                Same(Dense {
                    v3,
                    format: FloatType::F32,
                })
            });
            segmented_tile::<32, _>(v3, rows, xs, m.cols, &k)
        }
        Format::Dense(format) => match (format, f16c) {
            (FloatType::F16, Some(f16c)) => {
                let k = [(); 2].map(|_| Same(DenseF16c { f16c }));
                segmented_tile::<16, _>(v3, rows, xs, m.cols, &k)
            }
            _ => {
                let k = [(); 2].map(|_| Same(Dense { v3, format }));
                segmented_tile::<16, _>(v3, rows, xs, m.cols, &k)
            }
        },
        Format::Affine { bits, group, scale } => {
            let k: [AffineBatch; 2] = std::array::from_fn(|i| AffineBatch {
                v3,
                m,
                scale,
                first_group: (r + i) * (m.cols / group),
                xsums,
            });
            if bits == 4 {
                segmented_tile::<4, _>(v3, rows, xs, group, &k)
            } else {
                segmented_tile::<8, _>(v3, rows, xs, group, &k)
            }
        }
        Format::Mxfp4 => {
            let k: [Same<Scaled>; 2] = std::array::from_fn(|i| {
                Same(Scaled {
                    v3,
                    scales: m.scales,
                    scale: BlockScale::E8m0,
                    first: (r + i) * (m.cols / 32),
                })
            });
            segmented_tile::<4, _>(v3, rows, xs, 32, &k)
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let scaled = |i: usize| Scaled {
                v3,
                scales: m.scales,
                scale,
                first: ((r + i) / block_rows) * m.cols.div_ceil(block_cols),
            };
            if m.fp8_nan_codes {
                let k: [Same<Fp8<true>>; 2] = std::array::from_fn(|i| Same(Fp8(scaled(i))));
                segmented_tile::<8, _>(v3, rows, xs, block_cols, &k)
            } else if let Some(f16c) = f16c {
                let k: [Same<Fp8F16c>; 2] =
                    std::array::from_fn(|i| Same(Fp8F16c::<false>(f16c, scaled(i))));
                segmented_tile::<8, _>(v3, rows, xs, block_cols, &k)
            } else {
                let k: [Same<Fp8<false>>; 2] = std::array::from_fn(|i| Same(Fp8(scaled(i))));
                segmented_tile::<8, _>(v3, rows, xs, block_cols, &k)
            }
        }
    }
}
