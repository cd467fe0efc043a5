//! The 8-bit-activation affine 4-bit rows of `int8.rs` with AVX2 integer dot products (pulp's
//! safe `V3` token): 32 packed bytes (two 32-column blocks) split into their low and high
//! nibbles, each multiplied with the matching codes by `vpmaddubsw` (unsigned nibble times
//! signed code, pairs added: at most 2 x 15 x 127, no saturation), the two added, then
//! widened to i32 pairs by `vpmaddwd`. The integer sums are exact, so the lanes' order does
//! not matter; the f32 fold is `int8::fold`, the same operations as the portable path. Groups
//! of 64 or 128 columns run in tiles of rows by vectors: a tile splits each row's bytes into
//! nibbles once for all its vectors, and its accumulators are independent chains.

use pulp::bytemuck::cast;
use pulp::x86::V3;
use std::arch::x86_64::{__m256, __m256i};

use super::format::{FloatType, Format, QMatrix};
use super::int8::{BLOCK, Int8Vector, fold};

/// Bytes of packed 4-bit codes in one register: two blocks.
const PAIR_BYTES: usize = BLOCK;

/// The low and high nibbles of 32 packed bytes, each in its own byte.
#[inline(always)]
fn nibbles(v3: V3, packed: [u8; PAIR_BYTES]) -> (__m256i, __m256i) {
    let avx2 = v3.avx2;
    let bytes: __m256i = cast(packed);
    let low_mask: __m256i = cast([15u8; 32]);
    let low = avx2._mm256_and_si256(bytes, low_mask);
    let high = avx2._mm256_and_si256(avx2._mm256_srli_epi16::<4>(bytes), low_mask);
    (low, high)
}

/// The eight i32 partial sums of one pair of blocks from its nibbles: nibble codes times
/// activation codes.
#[inline(always)]
fn nibble_products(
    v3: V3,
    (low, high): (__m256i, __m256i),
    even: __m256i,
    odd: __m256i,
) -> __m256i {
    let avx2 = v3.avx2;
    let products = avx2._mm256_add_epi16(
        avx2._mm256_maddubs_epi16(low, even),
        avx2._mm256_maddubs_epi16(high, odd),
    );
    avx2._mm256_madd_epi16(products, cast([1i16; 16]))
}

/// The eight i32 partial sums of one pair of blocks: nibble codes times activation codes.
#[inline(always)]
fn pair_lanes(v3: V3, packed: [u8; PAIR_BYTES], even: __m256i, odd: __m256i) -> __m256i {
    nibble_products(v3, nibbles(v3, packed), even, odd)
}

#[inline(always)]
fn pair_sum(v3: V3, packed: [u8; PAIR_BYTES], even: &[i8], odd: &[i8]) -> [i32; 8] {
    let even: [i8; 32] = even.try_into().unwrap_or([0; 32]);
    let odd: [i8; 32] = odd.try_into().unwrap_or([0; 32]);
    cast(pair_lanes(v3, packed, cast(even), cast(odd)))
}

/// The 32 packed bytes of pair `p` of a row, zero-padded past the row's end.
#[inline(always)]
fn packed_pair(row: &[u8], p: usize) -> [u8; PAIR_BYTES] {
    let start = p * PAIR_BYTES;
    match row.get(start..start + PAIR_BYTES) {
        Some(bytes) => bytes.try_into().unwrap_or([0; PAIR_BYTES]),
        None => {
            let mut padded = [0u8; PAIR_BYTES];
            let tail = row.get(start..).unwrap_or(&[]);
            padded[..tail.len()].copy_from_slice(tail);
            padded
        }
    }
}

/// Row `r` for groups of 32 columns: one register of packed codes holds two groups, its low
/// four lanes the first and its high four the second (the last register of an odd count is
/// zero-padded).
#[inline(always)]
fn dot_group32(v3: V3, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
    let groups = m.cols / BLOCK;
    let row = &m.packed[r * m.cols / 2..(r + 1) * m.cols / 2];
    let mut acc = 0f32;
    for p in 0..groups.div_ceil(2) {
        let (even, odd) = x.paired[p * 2 * BLOCK..(p + 1) * 2 * BLOCK].split_at(BLOCK);
        let lanes = pair_sum(v3, packed_pair(row, p), even, odd);
        let first: i32 = lanes[..4].iter().sum();
        acc = fold(m, r * groups + 2 * p, acc, first, x, 2 * p);
        if 2 * p + 1 < groups {
            let second: i32 = lanes[4..].iter().sum();
            acc = fold(m, r * groups + 2 * p + 1, acc, second, x, 2 * p + 1);
        }
    }
    acc
}

/// Groups folded at once by [`fold_block`]: one register of per-group sums.
const GROUPS_AT_ONCE: usize = 8;

/// Eight groups' i32 lane vectors summed to one register of eight group totals, in group order
/// (two levels of `vphaddd`, then the 128-bit halves added).
#[inline(always)]
fn group_totals(v3: V3, v: [__m256i; GROUPS_AT_ONCE]) -> __m256i {
    let avx2 = v3.avx2;
    let p01 = avx2._mm256_hadd_epi32(v[0], v[1]);
    let p23 = avx2._mm256_hadd_epi32(v[2], v[3]);
    let p45 = avx2._mm256_hadd_epi32(v[4], v[5]);
    let p67 = avx2._mm256_hadd_epi32(v[6], v[7]);
    let low = avx2._mm256_hadd_epi32(p01, p23);
    let high = avx2._mm256_hadd_epi32(p45, p67);
    // low = [g0..g3 first halves | g0..g3 second halves], high the same for g4..g7.
    avx2._mm256_add_epi32(
        avx2._mm256_permute2x128_si256::<0x20>(low, high),
        avx2._mm256_permute2x128_si256::<0x31>(low, high),
    )
}

/// Eight consecutive stored scales (or biases) from `index`, as f32: the values
/// `FloatType::read` gives.
#[inline(always)]
fn eight_floats(v3: V3, scale: FloatType, bytes: &[u8], index: usize) -> __m256 {
    match scale {
        FloatType::BF16 => {
            let Some(Ok(raw)) = bytes
                .get(2 * index..2 * index + 16)
                .map(<[u8; 16]>::try_from)
            else {
                return cast([f32::NAN; 8]);
            };
            let wide = v3.avx2._mm256_cvtepu16_epi32(cast(raw));
            cast(v3.avx2._mm256_slli_epi32::<16>(wide))
        }
        _ => {
            let mut values = [0f32; 8];
            for (k, v) in values.iter_mut().enumerate() {
                *v = scale.read(bytes, index + k);
            }
            cast(values)
        }
    }
}

/// Group `g`'s eight i32 lanes of a row.
#[inline(always)]
fn group_lanes(
    v3: V3,
    row: &[[u8; PAIR_BYTES]],
    codes: &[[i8; BLOCK]],
    g: usize,
    pairs_per_group: usize,
) -> __m256i {
    let mut lanes: __m256i = cast([0i32; 8]);
    for p in g * pairs_per_group..(g + 1) * pairs_per_group {
        let pair = pair_lanes(v3, row[p], cast(codes[2 * p]), cast(codes[2 * p + 1]));
        lanes = v3.avx2._mm256_add_epi32(lanes, pair);
    }
    lanes
}

/// Eight f32 from `first` (NaN past the end, which the callers never reach).
#[inline(always)]
fn eight_at(values: &[f32], first: usize) -> __m256 {
    match values.get(first..first + GROUPS_AT_ONCE) {
        Some(v) => cast(<[f32; 8]>::try_from(v).unwrap_or([f32::NAN; 8])),
        None => cast([f32::NAN; 8]),
    }
}

/// Groups `first..first + 8` of row `r` folded into `acc`: their integer sums `lanes` gathered
/// into one register so that the fold's multiplies run on eight lanes; the additions into the
/// row's accumulator stay one at a time in group order, as `int8::fold` does them.
#[inline(always)]
fn fold_block(
    v3: V3,
    m: &QMatrix,
    r: usize,
    x: &Int8Vector,
    first: usize,
    lanes: [__m256i; GROUPS_AT_ONCE],
    mut acc: f32,
) -> f32 {
    let Format::Affine { scale, .. } = m.format else {
        return f32::NAN;
    };
    let avx = v3.avx;
    let index = r * (m.cols / x.group()) + first;
    let i = avx._mm256_cvtepi32_ps(group_totals(v3, lanes));
    let s = eight_floats(v3, scale, m.scales, index);
    let b = eight_floats(v3, scale, m.biases, index);
    let step = eight_at(&x.steps, first);
    let sum = eight_at(&x.sums, first);
    let terms = avx._mm256_add_ps(
        avx._mm256_mul_ps(avx._mm256_mul_ps(s, step), i),
        avx._mm256_mul_ps(b, sum),
    );
    let terms: [f32; 8] = cast(terms);
    for t in terms {
        acc += t;
    }
    acc
}

/// Rows `first..first + R` against the `V` vectors of `xs` for groups of 64 or 128 columns:
/// each pair of packed bytes is split into nibbles once per row, each pair of activation codes
/// loaded once per vector, and the tile's `R x V` accumulators are independent chains. Every
/// (row, vector) gets the group sums and the fold of its own product, so a tile's shape never
/// changes a bit.
#[inline(always)]
fn tile<const R: usize, const V: usize>(
    v3: V3,
    m: &QMatrix,
    first: usize,
    xs: &[Int8Vector],
) -> [[f32; V]; R] {
    let zero: __m256i = cast([0i32; 8]);
    let group = xs[0].group();
    let groups = m.cols / group;
    let row_bytes = m.cols / 2;
    let rows: [&[[u8; PAIR_BYTES]]; R] = std::array::from_fn(|i| {
        let r = first + i;
        m.packed[r * row_bytes..(r + 1) * row_bytes]
            .as_chunks::<PAIR_BYTES>()
            .0
    });
    let codes: [&[[i8; BLOCK]]; V] = std::array::from_fn(|v| xs[v].paired.as_chunks::<BLOCK>().0);
    let pairs_per_group = group / (2 * BLOCK);
    let blocks = groups / GROUPS_AT_ONCE;
    let mut acc = [[0f32; V]; R];
    for block in 0..blocks {
        let first_group = block * GROUPS_AT_ONCE;
        let mut lanes = [[[zero; GROUPS_AT_ONCE]; V]; R];
        for j in 0..GROUPS_AT_ONCE {
            let g = first_group + j;
            for p in g * pairs_per_group..(g + 1) * pairs_per_group {
                for (row, row_lanes) in rows.iter().zip(&mut lanes) {
                    let halves = nibbles(v3, row[p]);
                    for (x, lane) in codes.iter().zip(row_lanes.iter_mut()) {
                        let pair = nibble_products(v3, halves, cast(x[2 * p]), cast(x[2 * p + 1]));
                        lane[j] = v3.avx2._mm256_add_epi32(lane[j], pair);
                    }
                }
            }
        }
        for (i, (row_acc, row_lanes)) in acc.iter_mut().zip(&lanes).enumerate() {
            for (v, (a, lane)) in row_acc.iter_mut().zip(row_lanes).enumerate() {
                *a = fold_block(v3, m, first + i, &xs[v], first_group, *lane, *a);
            }
        }
    }
    for g in blocks * GROUPS_AT_ONCE..groups {
        for (i, (row_acc, row)) in acc.iter_mut().zip(&rows).enumerate() {
            for (v, (a, x)) in row_acc.iter_mut().zip(&codes).enumerate() {
                let lanes: [i32; 8] = cast(group_lanes(v3, row, x, g, pairs_per_group));
                *a = fold(
                    m,
                    (first + i) * groups + g,
                    *a,
                    lanes.iter().sum(),
                    &xs[v],
                    g,
                );
            }
        }
    }
    acc
}

/// Rows `first..` (as many as `out` holds) against `xs`, in tiles of `R` rows by the `V`
/// vectors of `xs` (then single rows), into `out[i * batch + offset + v]`.
#[inline(always)]
fn tiles<const R: usize, const V: usize>(
    v3: V3,
    m: &QMatrix,
    first: usize,
    xs: &[Int8Vector],
    batch: usize,
    offset: usize,
    out: &mut [f32],
) {
    let rows = out.len() / batch;
    let mut put = |i: usize, values: &[f32]| {
        out[i * batch + offset..i * batch + offset + values.len()].copy_from_slice(values);
    };
    let whole = rows / R * R;
    for i in (0..whole).step_by(R) {
        for (k, values) in tile::<R, V>(v3, m, first + i, xs).iter().enumerate() {
            put(i + k, values);
        }
    }
    for i in whole..rows {
        put(i, &tile::<1, V>(v3, m, first + i, xs)[0]);
    }
}

/// Rows `first..` against every vector of `xs` for groups of 64 or 128 columns: four vectors at
/// a time in tiles of two rows, the last `batch % 4` vectors each alone, row by row (a lone
/// vector in tiles of four rows decoded about a tenth slower on one thread: four streams of
/// memory instead of one).
#[inline(always)]
fn rows_batch_tiled(v3: V3, m: &QMatrix, first: usize, xs: &[Int8Vector], out: &mut [f32]) {
    let batch = xs.len();
    let fours = batch / 4 * 4;
    for offset in (0..fours).step_by(4) {
        tiles::<2, 4>(v3, m, first, &xs[offset..offset + 4], batch, offset, out);
    }
    for offset in fours..batch {
        tiles::<1, 1>(v3, m, first, &xs[offset..offset + 1], batch, offset, out);
    }
}

/// Rows `first..` against every vector of `xs`, into `out[i * batch + b]`: each row is read from
/// memory once for the batch, in tiles of rows and vectors for groups of 64 or 128 (row by row
/// for groups of 32). Each (row, vector) gets its own product's bits whatever the tile (a lone
/// product is a batch of one).
pub(crate) fn rows_batch(v3: V3, m: &QMatrix, first: usize, xs: &[Int8Vector], out: &mut [f32]) {
    struct RowsBatch<'a, 'm> {
        v3: V3,
        m: &'a QMatrix<'m>,
        first: usize,
        xs: &'a [Int8Vector],
        out: &'a mut [f32],
    }
    impl pulp::WithSimd for RowsBatch<'_, '_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let RowsBatch {
                v3,
                m,
                first,
                xs,
                out,
            } = self;
            if xs.first().is_some_and(|x| x.group() != BLOCK) {
                return rows_batch_tiled(v3, m, first, xs, out);
            }
            for (i, row_out) in out.chunks_exact_mut(xs.len()).enumerate() {
                for (o, x) in row_out.iter_mut().zip(xs) {
                    *o = dot_group32(v3, m, first + i, x);
                }
            }
        }
    }
    pulp::Simd::vectorize(
        v3,
        RowsBatch {
            v3,
            m,
            first,
            xs,
            out,
        },
    );
}
