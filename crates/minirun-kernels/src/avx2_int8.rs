//! The 8-bit-activation affine 4-bit, affine 8-bit and MXFP4 rows of `int8.rs` with AVX2
//! integer dot products (pulp's safe `V3` token). Affine 4-bit: 32 packed bytes (two 32-column
//! blocks) split into their low and high nibbles, each multiplied with the matching codes by
//! `vpmaddubsw` (unsigned nibble times signed code, pairs added: at most 2 x 15 x 127, no
//! saturation), the two added, then
//! widened to i32 pairs by `vpmaddwd`. The integer sums are exact, so the lanes' order does
//! not matter; the f32 fold is `int8_fold::fold`, the same operations as the portable path. With
//! AVX-512 VNNI (`x86_vnni::Vnni`), `vpdpbusd` replaces the two widening steps: the same
//! integer sums, so the same bits.
//!
//! A batch of two or more vectors (prefill) takes rows eight at a time instead (`octet_affine`):
//! each 64-column chunk of the eight rows is transposed once so that one 32-bit lane holds one
//! row, and each vector's codes are broadcast four bytes at a time into all eight rows. A
//! group's integer sum then lands in its row's lane with no horizontal reduction, and the f32
//! fold is the same operations lane by lane, so each (row, vector) keeps the bits of the row
//! path. The transpose is paid once per batch: a lone vector stays on the row path, where it
//! is the faster of the two. With 512-bit VNNI (`x86_vnni::Vnni512`), affine and MXFP4
//! batches take sixteen rows at a time instead (`sixteen_rows.rs`): two octets' transposed
//! chunks joined, one row per lane of a 512-bit register.
//!
//! Affine 8-bit rows (`dot_bytes`) multiply 32 stored bytes at a time with the codes of the
//! same columns (`vpdpbusd`; on AVX2 as two nibbles, since `vpmaddubsw` of a whole byte could
//! saturate). Their batches take octets too (`octet_affine`): each 32-byte chunk of eight rows
//! transposed, each vector's codes broadcast four at a time, in the loop the 4-bit octets run.
//! MXFP4 rows (`dot_mxfp4`) look each nibble up as twice its e2m1 value
//! (`vpshufb`), then multiply its magnitude by the activation code carrying its sign
//! (`vpabsb`, `vpsignb`), so the same unsigned-by-signed products apply: at most 2 x 12 x 127
//! a pair. MXFP4 batches take octets too (`octet_mxfp4`), with the activation codes on the
//! unsigned side instead.

use pulp::bytemuck::cast;
use pulp::x86::V3;
use std::arch::x86_64::{__m256, __m256i};

use super::format::{FloatType, Format, QMatrix};
use super::int8_fold::{E2M1_DOUBLED, MXFP4_GROUP, combine, fold, mxfp4_half_scale};
use super::int8_vector::{BLOCK, Int8Vector};
use x86_vnni::{Vnni, Vnni512};

mod sixteen_rows;

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

/// How a row adds one pair of blocks' products to its lanes: AVX2's `vpmaddubsw` and
/// `vpmaddwd`, or VNNI's `vpdpbusd` once per nibble half. Both sums are exact integers, so both
/// give the same group totals (in different lanes) and the same bits.
trait PairProducts: Copy {
    fn v3(self) -> V3;
    /// A hint to fetch `bytes` into cache ahead of use (no effect on any result).
    fn prefetch(self, bytes: &[u8]);
    fn add_pair(
        self,
        acc: __m256i,
        halves: (__m256i, __m256i),
        even: __m256i,
        odd: __m256i,
    ) -> __m256i;
    /// `acc` plus the products of 32 unsigned bytes with 32 signed codes, the four products
    /// of bytes `4i..4i + 4` added into lane `i`, exactly.
    fn add_bytes(self, acc: __m256i, bytes: __m256i, codes: __m256i) -> __m256i;
}

impl PairProducts for V3 {
    #[inline(always)]
    fn v3(self) -> V3 {
        self
    }

    /// pulp's token offers no prefetch: the AVX2 path (machines without VNNI) goes without.
    #[inline(always)]
    fn prefetch(self, _: &[u8]) {}

    #[inline(always)]
    fn add_pair(
        self,
        acc: __m256i,
        halves: (__m256i, __m256i),
        even: __m256i,
        odd: __m256i,
    ) -> __m256i {
        self.avx2
            ._mm256_add_epi32(acc, nibble_products(self, halves, even, odd))
    }

    /// `vpmaddubsw` of a whole byte against a signed code can saturate (2 x 255 x 127 >
    /// 32767), so each byte is taken as its two nibbles, `low + 16 * high`, whose products
    /// cannot.
    #[inline(always)]
    fn add_bytes(self, acc: __m256i, bytes: __m256i, codes: __m256i) -> __m256i {
        let avx2 = self.avx2;
        let (low, high) = nibbles(self, cast(bytes));
        let low = avx2._mm256_madd_epi16(avx2._mm256_maddubs_epi16(low, codes), cast([1i16; 16]));
        let high =
            avx2._mm256_madd_epi16(avx2._mm256_maddubs_epi16(high, codes), cast([16i16; 16]));
        avx2._mm256_add_epi32(acc, avx2._mm256_add_epi32(low, high))
    }
}

impl PairProducts for Vnni {
    #[inline(always)]
    fn v3(self) -> V3 {
        Vnni::v3(self)
    }

    #[inline(always)]
    fn prefetch(self, bytes: &[u8]) {
        Vnni::prefetch(self, bytes)
    }

    #[inline(always)]
    fn add_pair(
        self,
        acc: __m256i,
        (low, high): (__m256i, __m256i),
        even: __m256i,
        odd: __m256i,
    ) -> __m256i {
        self.dpbusd(self.dpbusd(acc, low, even), high, odd)
    }

    #[inline(always)]
    fn add_bytes(self, acc: __m256i, bytes: __m256i, codes: __m256i) -> __m256i {
        self.dpbusd(acc, bytes, codes)
    }
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
    let mut acc = [0f32; 8];
    for p in 0..groups.div_ceil(2) {
        let (even, odd) = x.paired[p * 2 * BLOCK..(p + 1) * 2 * BLOCK].split_at(BLOCK);
        let lanes = pair_sum(v3, packed_pair(row, p), even, odd);
        let first: i32 = lanes[..4].iter().sum();
        fold(m, r * groups + 2 * p, &mut acc, first, x, 2 * p);
        if 2 * p + 1 < groups {
            let second: i32 = lanes[4..].iter().sum();
            fold(m, r * groups + 2 * p + 1, &mut acc, second, x, 2 * p + 1);
        }
    }
    combine(acc)
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

/// Groups `first..first + 8` of row `r` added to its eight accumulators `acc` (group
/// `first + j` to lane `j`, as `int8_fold::fold` does it): their integer sums `lanes` gathered into
/// one register, so that the fold runs on eight lanes.
#[inline(always)]
fn fold_block(
    v3: V3,
    m: &QMatrix,
    r: usize,
    x: &Int8Vector,
    first: usize,
    lanes: [__m256i; GROUPS_AT_ONCE],
    acc: __m256,
) -> __m256 {
    let Format::Affine { scale, .. } = m.format else {
        return cast([f32::NAN; 8]);
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
    avx._mm256_add_ps(acc, terms)
}

/// How far ahead of its reads a row asks for packed bytes: the rows of a band are read in
/// order, and the hardware prefetcher alone left the loads waiting on memory.
const ROW_PREFETCH_AHEAD: usize = 2048;

/// Asks for the `len` bytes of `packed` that start `ROW_PREFETCH_AHEAD` past `from`, a cache
/// line at a time (a hint: no result changes).
#[inline(always)]
fn prefetch_ahead<E: PairProducts>(engine: E, packed: &[u8], from: usize, len: usize) {
    let ahead = from + ROW_PREFETCH_AHEAD;
    for line in 0..len / CACHE_LINE {
        engine.prefetch(packed.get(ahead + line * CACHE_LINE..).unwrap_or(&[]));
    }
}

/// Row `r` against `x` for groups of `2 * BLOCK * PPG` columns (64 or 128): eight groups at a
/// time, each pair of packed bytes split into nibbles and multiplied into its group's lanes,
/// then `fold_block`; the last `groups % 8` one at a time through `int8_fold::fold`.
#[inline(always)]
// Constant indices into slices of known length: the loops unroll without bounds checks.
#[allow(clippy::needless_range_loop)]
fn dot_blocks<E: PairProducts, const PPG: usize>(
    engine: E,
    m: &QMatrix,
    r: usize,
    x: &Int8Vector,
) -> f32 {
    let v3 = engine.v3();
    let zero: __m256i = cast([0i32; 8]);
    let groups = m.cols / (2 * BLOCK * PPG);
    let row_bytes = m.cols / 2;
    let row = m.packed[r * row_bytes..(r + 1) * row_bytes]
        .as_chunks::<PAIR_BYTES>()
        .0;
    let codes = x.paired.as_chunks::<BLOCK>().0;
    let blocks = groups / GROUPS_AT_ONCE;
    let block_pairs = GROUPS_AT_ONCE * PPG;
    let mut acc: __m256 = cast([0f32; 8]);
    let row_start = r * row_bytes;
    for block in 0..blocks {
        let start = block * block_pairs;
        prefetch_ahead(
            engine,
            m.packed,
            row_start + start * PAIR_BYTES,
            block_pairs * PAIR_BYTES,
        );
        // Slices of known length, so that the constant indices below need no checks.
        let row_pairs = &row[start..start + block_pairs];
        let x_blocks = &codes[2 * start..2 * (start + block_pairs)];
        let mut lanes = [zero; GROUPS_AT_ONCE];
        for j in 0..GROUPS_AT_ONCE {
            for q in 0..PPG {
                let p = j * PPG + q;
                let (even, odd) = (x_blocks[2 * p], x_blocks[2 * p + 1]);
                let halves = nibbles(v3, row_pairs[p]);
                lanes[j] = engine.add_pair(lanes[j], halves, cast(even), cast(odd));
            }
        }
        acc = fold_block(v3, m, r, x, block * GROUPS_AT_ONCE, lanes, acc);
    }
    let mut acc: [f32; 8] = cast(acc);
    for g in blocks * GROUPS_AT_ONCE..groups {
        let lanes: [i32; 8] = cast(group_lanes(v3, row, codes, g, PPG));
        fold(m, r * groups + g, &mut acc, lanes.iter().sum(), x, g);
    }
    combine(acc)
}

/// Rows `first..` against every vector of `xs`: whole octets of rows through the kernel's
/// octet function, the rest one row at a time, one vector at a time over the band's rows (which
/// stay in cache between vectors).
#[inline(always)]
fn rows_batch_octets<E: PairProducts, K: Octets>(
    engine: E,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    let batch = xs.len();
    let octet_rows_total = if takes_octets(xs) {
        out.len() / batch / OCTET * OCTET
    } else {
        0
    };
    let (octets, rest) = out.split_at_mut(octet_rows_total * batch);
    if !octets.is_empty() {
        // Taken out of the thread's slot and put back, not borrowed in a closure: a closure
        // would not inherit the target features the kernel is compiled for.
        let mut scratch = OCTET_SCRATCH.take();
        scratch.fit(batch);
        for (o, octet_out) in octets.chunks_exact_mut(OCTET * batch).enumerate() {
            K::octet(engine, m, first + o * OCTET, xs, octet_out, &mut scratch);
        }
        OCTET_SCRATCH.set(scratch);
    }
    let first = first + octet_rows_total;
    for (b, x) in xs.iter().enumerate() {
        for (i, row_out) in rest.chunks_exact_mut(batch).enumerate() {
            row_out[b] = K::dot(engine, m, first + i, x);
        }
    }
}

/// A row kernel with an octet form: eight rows at a time against a batch, each (row, vector)
/// with the row function's bits.
trait Octets: RowDot {
    fn octet<E: PairProducts>(
        engine: E,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut OctetScratch,
    );
}

/// Affine 4-bit for groups of `64 * PPG` columns: [`octet_affine`] and [`dot_blocks`].
struct Blocks<const PPG: usize>;

impl<const PPG: usize> RowDot for Blocks<PPG> {
    #[inline(always)]
    fn dot<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
        dot_blocks::<E, PPG>(engine, m, r, x)
    }
}

/// Affine 4-bit: a 32-byte chunk is 64 columns, split into its nibbles once for the batch and
/// multiplied with each vector's paired codes.
impl<const PPG: usize> AffineOctet for Blocks<PPG> {
    const CHUNKS_PER_GROUP: usize = PPG;
    const BITS: usize = 4;
    type Weights = ([__m256i; OCTET], [__m256i; OCTET]);

    #[inline(always)]
    fn weights<E: PairProducts>(
        engine: E,
        next_octet: &[u8],
        rows: &[&[[u8; PAIR_BYTES]]; OCTET],
        chunk: usize,
    ) -> Self::Weights {
        octet_nibbles(engine, next_octet, rows, chunk)
    }

    #[inline(always)]
    fn chunk_sum<E: PairProducts>(
        engine: E,
        weights: &Self::Weights,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m256i> {
        let codes = x.paired.as_chunks::<BLOCK>().0;
        let (even, odd) = (codes.get(2 * chunk)?, codes.get(2 * chunk + 1)?);
        Some(octet_chunk_sum(engine, weights, *even, *odd))
    }
}

impl Octets for Mxfp4Rows {
    #[inline(always)]
    fn octet<E: PairProducts>(
        engine: E,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut OctetScratch,
    ) {
        octet_mxfp4(engine, m, first, xs, out, scratch)
    }
}

/// Rows computed together by an octet function: one 32-bit lane each.
const OCTET: usize = 8;

/// The smallest batch that goes through an octet function: its transpose is paid once per octet
/// and chunk, however many vectors share it.
const OCTET_MIN_BATCH: usize = 2;

/// Whether rows against `xs` go through octets (or sixteens): a batch, whose transposes the
/// vectors share, or rows too short for a row's eight-group blocks, whose groups the row path
/// would fold one at a time.
#[inline(always)]
fn takes_octets(xs: &[&Int8Vector]) -> bool {
    let short = |x: &&Int8Vector| x.len() / x.group() < GROUPS_AT_ONCE;
    xs.len() >= OCTET_MIN_BATCH || xs.first().is_some_and(short)
}

/// Bytes of one cache line.
const CACHE_LINE: usize = 64;

/// Lines of the next octet prefetched per 32-byte chunk of this one: eight rows' chunks are
/// `8 x 32` bytes.
const PREFETCH_LINES: usize = OCTET * PAIR_BYTES / CACHE_LINE;

/// The per-vector state of rows computed together, one row per lane of registers `F` (f32)
/// and `I` (i32): the eight f32 accumulators of step 2 and, for groups of more than one chunk,
/// the group's integer sum so far; at least one entry per vector of the batch.
struct LaneScratch<F, I> {
    acc: Vec<[F; 8]>,
    partial: Vec<I>,
}

impl<F, I> Default for LaneScratch<F, I> {
    fn default() -> Self {
        LaneScratch {
            acc: Vec::new(),
            partial: Vec::new(),
        }
    }
}

impl<F: pulp::bytemuck::Zeroable + Copy, I: pulp::bytemuck::Zeroable + Copy> LaneScratch<F, I> {
    /// Room for `batch` vectors. Every entry is written before it is read, so old contents
    /// may stay.
    fn fit(&mut self, batch: usize) {
        if self.acc.len() < batch {
            self.acc.resize(batch, [F::zeroed(); 8]);
            self.partial.resize(batch, I::zeroed());
        }
    }
}

/// An octet's scratch: eight lanes.
type OctetScratch = LaneScratch<__m256, __m256i>;

thread_local! {
    /// Each thread's scratch, kept between products: allocating it for each band of rows cost
    /// a measurable share of a 2-thread prefill in the allocator.
    static OCTET_SCRATCH: std::cell::RefCell<OctetScratch> = std::cell::RefCell::default();
}

/// The 8 x 8 transpose of 32-bit lanes: lane `r` of output `i` is lane `i` of input `r`.
#[inline(always)]
fn transpose_lanes(v3: V3, r: [__m256i; OCTET]) -> [__m256i; OCTET] {
    let a = v3.avx2;
    let t0 = a._mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = a._mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = a._mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = a._mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = a._mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = a._mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = a._mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = a._mm256_unpackhi_epi32(r[6], r[7]);
    // u_i: lane i of rows 0..4 in the low half, lane i + 4 in the high half (rows 4..8 for
    // u_{i+4}).
    let u0 = a._mm256_unpacklo_epi64(t0, t2);
    let u1 = a._mm256_unpackhi_epi64(t0, t2);
    let u2 = a._mm256_unpacklo_epi64(t1, t3);
    let u3 = a._mm256_unpackhi_epi64(t1, t3);
    let u4 = a._mm256_unpacklo_epi64(t4, t6);
    let u5 = a._mm256_unpackhi_epi64(t4, t6);
    let u6 = a._mm256_unpacklo_epi64(t5, t7);
    let u7 = a._mm256_unpackhi_epi64(t5, t7);
    [
        a._mm256_permute2x128_si256::<0x20>(u0, u4),
        a._mm256_permute2x128_si256::<0x20>(u1, u5),
        a._mm256_permute2x128_si256::<0x20>(u2, u6),
        a._mm256_permute2x128_si256::<0x20>(u3, u7),
        a._mm256_permute2x128_si256::<0x31>(u0, u4),
        a._mm256_permute2x128_si256::<0x31>(u1, u5),
        a._mm256_permute2x128_si256::<0x31>(u2, u6),
        a._mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// The 32-byte chunk `chunk` of eight rows, transposed: lane `r` of element `i` holds row
/// `r`'s bytes `4i..4i + 4` of the chunk (zero past a row's end).
#[inline(always)]
fn octet_chunk<E: PairProducts>(
    engine: E,
    next_octet: &[u8],
    rows: &[&[[u8; PAIR_BYTES]]; OCTET],
    chunk: usize,
) -> [__m256i; OCTET] {
    let zero: __m256i = cast([0i32; 8]);
    let mut packed = [zero; OCTET];
    for r in 0..OCTET {
        packed[r] = cast(rows[r].get(chunk).copied().unwrap_or([0; PAIR_BYTES]));
    }
    // Eight rows read side by side are eight interleaved streams, which the hardware
    // prefetcher follows poorly: the next octet's rows (contiguous) are asked for in order
    // instead, as many lines per chunk as it takes to cover them by the end of this octet.
    for line in 0..PREFETCH_LINES {
        let at = (chunk * PREFETCH_LINES + line) * CACHE_LINE;
        engine.prefetch(next_octet.get(at..).unwrap_or(&[]));
    }
    transpose_lanes(engine.v3(), packed)
}

/// The nibbles of one 64-column chunk of eight rows, transposed: lane `r` of `low[i]` holds
/// row `r`'s codes for columns `8i, 8i + 2, 8i + 4, 8i + 6` of the chunk (the even codes'
/// 32-bit lane `i` of `Int8Vector::paired`), `high[i]` the odd columns after each.
#[inline(always)]
fn octet_nibbles<E: PairProducts>(
    engine: E,
    next_octet: &[u8],
    rows: &[&[[u8; PAIR_BYTES]]; OCTET],
    chunk: usize,
) -> ([__m256i; OCTET], [__m256i; OCTET]) {
    let v3 = engine.v3();
    let zero: __m256i = cast([0i32; 8]);
    let lanes = octet_chunk(engine, next_octet, rows, chunk);
    let mut low = [zero; OCTET];
    let mut high = [zero; OCTET];
    for i in 0..OCTET {
        (low[i], high[i]) = nibbles(v3, cast(lanes[i]));
    }
    (low, high)
}

/// One chunk's integer sums for the octet's eight rows (lane `r` for row `r`) against one
/// vector's codes: each 32-bit lane of the codes broadcast and multiplied into every row at
/// once, in four independent sums added at the end (exact, so any order gives the same).
#[inline(always)]
fn octet_chunk_sum<E: PairProducts>(
    engine: E,
    (low, high): &([__m256i; OCTET], [__m256i; OCTET]),
    even: [i8; BLOCK],
    odd: [i8; BLOCK],
) -> __m256i {
    let v3 = engine.v3();
    let even: [i32; 8] = cast(even);
    let odd: [i32; 8] = cast(odd);
    let zero: __m256i = cast([0i32; 8]);
    let mut sums = [zero; 4];
    for i in 0..OCTET {
        let e = v3.avx._mm256_set1_epi32(even[i]);
        let o = v3.avx._mm256_set1_epi32(odd[i]);
        sums[i % 4] = engine.add_pair(sums[i % 4], (low[i], high[i]), e, o);
    }
    let a = v3.avx2;
    a._mm256_add_epi32(
        a._mm256_add_epi32(sums[0], sums[1]),
        a._mm256_add_epi32(sums[2], sums[3]),
    )
}

/// What the per-group values `octet_floats` reads are: stored floats (affine scales and
/// biases), or e8m0 bytes taken as half their value (MXFP4's `h_g`).
#[derive(Clone, Copy)]
enum GroupFloats {
    Float(FloatType),
    HalfE8m0,
}

/// Groups `first_group..first_group + 8` of the stored scales (or biases) of rows
/// `first..first + 8`, as f32: element `j` holds group `first_group + j`, lane `r` row
/// `first + r`. Each row's eight values are read as one register, then transposed. Where a
/// row has fewer than eight groups left, the register runs on into the next row's values,
/// which land in elements past the row's last group, which nobody reads; only at the end of
/// `bytes` are they read one at a time (one value at a time into a register that is then read
/// whole would wait on each store, which made short rows crawl).
#[inline(always)]
fn octet_floats(
    v3: V3,
    scale: GroupFloats,
    bytes: &[u8],
    first: usize,
    groups: usize,
    first_group: usize,
) -> [__m256; GROUPS_AT_ONCE] {
    let zero: __m256i = cast([0i32; 8]);
    let mut by_row = [zero; OCTET];
    for (r, row) in by_row.iter_mut().enumerate() {
        let index = (first + r) * groups + first_group;
        let stored = match scale {
            GroupFloats::Float(t) => bytes.len() / t.size(),
            GroupFloats::HalfE8m0 => bytes.len(),
        };
        *row = if index + GROUPS_AT_ONCE <= stored {
            match scale {
                GroupFloats::Float(t) => cast(eight_floats(v3, t, bytes, index)),
                GroupFloats::HalfE8m0 => cast(eight_half_scales(v3, bytes, index)),
            }
        } else {
            let mut values = [0f32; GROUPS_AT_ONCE];
            for (j, v) in values.iter_mut().enumerate().take(groups - first_group) {
                *v = match scale {
                    GroupFloats::Float(t) => t.read(bytes, index + j),
                    GroupFloats::HalfE8m0 => bytes
                        .get(index + j)
                        .map_or(f32::NAN, |&e| mxfp4_half_scale(e)),
                };
            }
            cast(values)
        };
    }
    cast(transpose_lanes(v3, by_row))
}

/// The packed bytes of rows `first..first + 8` in 32-byte chunks (empty past the matrix's end)
/// and everything after them, which the octet prefetches as it goes.
#[inline(always)]
fn octet_packed<'a>(
    m: &QMatrix<'a>,
    first: usize,
    row_bytes: usize,
) -> ([&'a [[u8; PAIR_BYTES]]; OCTET], &'a [u8]) {
    let empty: &[[u8; PAIR_BYTES]] = &[];
    let mut rows = [empty; OCTET];
    for (r, row) in rows.iter_mut().enumerate() {
        let start = (first + r) * row_bytes;
        *row = m
            .packed
            .get(start..start + row_bytes)
            .map_or(empty, |bytes| bytes.as_chunks::<PAIR_BYTES>().0);
    }
    let next_octet = m.packed.get((first + OCTET) * row_bytes..).unwrap_or(&[]);
    (rows, next_octet)
}

/// Step 3 lane by lane for every vector's accumulators (lane `r` for row `r`), into
/// `out[r * batch + v]`.
#[inline(always)]
fn store_octet(v3: V3, accs: &[[__m256; 8]], out: &mut [f32]) {
    let avx = v3.avx;
    let batch = accs.len();
    for (v, a) in accs.iter().enumerate() {
        // No closure: it would not inherit the target features.
        let even = avx._mm256_add_ps(avx._mm256_add_ps(a[0], a[4]), avx._mm256_add_ps(a[2], a[6]));
        let odd = avx._mm256_add_ps(avx._mm256_add_ps(a[1], a[5]), avx._mm256_add_ps(a[3], a[7]));
        let y: [f32; OCTET] = cast(avx._mm256_add_ps(even, odd));
        for (r, &value) in y.iter().enumerate() {
            out[r * batch + v] = value;
        }
    }
}

/// Every affine width's octets are [`octet_affine`].
impl<K: AffineOctet + RowDot> Octets for K {
    #[inline(always)]
    fn octet<E: PairProducts>(
        engine: E,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
        scratch: &mut OctetScratch,
    ) {
        octet_affine::<E, Self>(engine, m, first, xs, out, scratch)
    }
}

/// What an octet of affine rows needs from its code width: how many 32-byte chunks of a row one
/// group spans, a chunk's weights prepared once for the whole batch, and one vector's exact
/// integer sums for the chunk (lane `r` for row `r`).
trait AffineOctet {
    /// 32-byte chunks of stored codes per group.
    const CHUNKS_PER_GROUP: usize;
    /// Bits per stored code.
    const BITS: usize;
    type Weights;
    fn weights<E: PairProducts>(
        engine: E,
        next_octet: &[u8],
        rows: &[&[[u8; PAIR_BYTES]]; OCTET],
        chunk: usize,
    ) -> Self::Weights;
    /// `None` past the vector's codes (a caller's mistake: that vector's outputs stay zero).
    fn chunk_sum<E: PairProducts>(
        engine: E,
        weights: &Self::Weights,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m256i>;
}

/// Affine rows `first..first + 8` against every vector of `xs`, into `out[r * batch + b]`: the
/// module's arithmetic with one row per lane. Each 32-byte chunk of the eight rows is prepared
/// once for the whole batch (`K::weights`: transposed, and for 4-bit codes split into nibbles),
/// so that a group's integer sum lands in its row's lane without a horizontal reduction; step 2
/// is [`octet_affine_fold`], the same f32 operations per lane as [`fold_block`] and
/// `int8_fold::fold` do per row, so each (row, vector) has the bits of [`dot_blocks`] or
/// [`dot_bytes`].
#[inline(always)]
fn octet_affine<E: PairProducts, K: AffineOctet>(
    engine: E,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
    scratch: &mut OctetScratch,
) {
    let v3 = engine.v3();
    let Format::Affine { scale, .. } = m.format else {
        out.fill(f32::NAN);
        return;
    };
    let per_group = K::CHUNKS_PER_GROUP;
    let groups = m.cols * K::BITS / (8 * PAIR_BYTES * per_group);
    let (rows, next_octet) = octet_packed(m, first, m.cols * K::BITS / 8);
    let batch = xs.len();
    let (accs, partials) = (&mut scratch.acc[..batch], &mut scratch.partial[..batch]);
    for acc in accs.iter_mut() {
        *acc = [cast([0f32; 8]); 8];
    }
    let mut scales = [cast([0f32; 8]); GROUPS_AT_ONCE];
    let mut biases = scales;
    for g in 0..groups {
        if g % GROUPS_AT_ONCE == 0 {
            scales = octet_floats(v3, GroupFloats::Float(scale), m.scales, first, groups, g);
            biases = octet_floats(v3, GroupFloats::Float(scale), m.biases, first, groups, g);
        }
        let (s, b) = (scales[g % 8], biases[g % 8]);
        for c in 0..per_group {
            let chunk = g * per_group + c;
            let weights = K::weights(engine, next_octet, &rows, chunk);
            for (v, x) in xs.iter().enumerate() {
                let Some(mut sum) = K::chunk_sum(engine, &weights, x, chunk) else {
                    continue;
                };
                if c > 0 {
                    sum = v3.avx2._mm256_add_epi32(partials[v], sum);
                }
                if c + 1 < per_group {
                    partials[v] = sum;
                    continue;
                }
                let acc = &mut accs[v][g % 8];
                *acc = octet_affine_fold(v3, (s, b), x, g, sum, *acc);
            }
        }
    }
    store_octet(v3, accs, out);
}

/// Step 2 of the affine fold for group `g` of eight rows at once (lane `r` for row `r`): the
/// same f32 operations as `int8_fold::fold`, so each lane keeps its row's bits.
#[inline(always)]
fn octet_affine_fold(
    v3: V3,
    (s, b): (__m256, __m256),
    x: &Int8Vector,
    g: usize,
    sum: __m256i,
    acc: __m256,
) -> __m256 {
    let avx = v3.avx;
    let step = avx._mm256_set1_ps(x.steps.get(g).copied().unwrap_or(f32::NAN));
    let total = avx._mm256_set1_ps(x.sums.get(g).copied().unwrap_or(f32::NAN));
    let terms = avx._mm256_add_ps(
        avx._mm256_mul_ps(avx._mm256_mul_ps(s, step), avx._mm256_cvtepi32_ps(sum)),
        avx._mm256_mul_ps(b, total),
    );
    avx._mm256_add_ps(acc, terms)
}

/// One 32-column chunk's integer sums for an octet of affine 8-bit rows (lane `r` for row
/// `r`) against one vector's codes: each four codes broadcast and multiplied into every row's
/// four bytes at once, in four independent sums added at the end (exact, so any order gives
/// the same).
#[inline(always)]
fn octet_bytes_sum<E: PairProducts>(
    engine: E,
    weights: &[__m256i; OCTET],
    codes: [i8; BLOCK],
) -> __m256i {
    let v3 = engine.v3();
    let codes: [i32; 8] = cast(codes);
    let zero: __m256i = cast([0i32; 8]);
    let mut sums = [zero; 4];
    for i in 0..OCTET {
        let c = v3.avx._mm256_set1_epi32(codes[i]);
        sums[i % 4] = engine.add_bytes(sums[i % 4], weights[i], c);
    }
    let a = v3.avx2;
    a._mm256_add_epi32(
        a._mm256_add_epi32(sums[0], sums[1]),
        a._mm256_add_epi32(sums[2], sums[3]),
    )
}

/// Affine 8-bit row `r` against `x` for groups of `32 * RPG` columns: each register of 32
/// stored bytes multiplied with the 32 codes of the same columns into its group's lanes, eight
/// groups at a time gathered and folded by `fold_block`; the last `groups % 8` one at a time
/// through `int8_fold::fold`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn dot_bytes<E: PairProducts, const RPG: usize>(
    engine: E,
    m: &QMatrix,
    r: usize,
    x: &Int8Vector,
) -> f32 {
    let v3 = engine.v3();
    let zero: __m256i = cast([0i32; 8]);
    let groups = m.cols / (BLOCK * RPG);
    let row_start = r * m.cols;
    let row = m.packed[row_start..row_start + m.cols]
        .as_chunks::<BLOCK>()
        .0;
    let codes = x.codes.as_chunks::<BLOCK>().0;
    let blocks = groups / GROUPS_AT_ONCE;
    let block_registers = GROUPS_AT_ONCE * RPG;
    let mut acc: __m256 = cast([0f32; 8]);
    for block in 0..blocks {
        let start = block * block_registers;
        prefetch_ahead(
            engine,
            m.packed,
            row_start + start * BLOCK,
            block_registers * BLOCK,
        );
        let row_registers = &row[start..start + block_registers];
        let x_registers = &codes[start..start + block_registers];
        let mut lanes = [zero; GROUPS_AT_ONCE];
        for j in 0..GROUPS_AT_ONCE {
            for q in 0..RPG {
                let k = j * RPG + q;
                lanes[j] = engine.add_bytes(lanes[j], cast(row_registers[k]), cast(x_registers[k]));
            }
        }
        acc = fold_block(v3, m, r, x, block * GROUPS_AT_ONCE, lanes, acc);
    }
    let mut acc: [f32; 8] = cast(acc);
    for g in blocks * GROUPS_AT_ONCE..groups {
        let mut lanes = zero;
        for k in g * RPG..(g + 1) * RPG {
            lanes = engine.add_bytes(lanes, cast(row[k]), cast(codes[k]));
        }
        let lanes: [i32; 8] = cast(lanes);
        fold(m, r * groups + g, &mut acc, lanes.iter().sum(), x, g);
    }
    combine(acc)
}

/// [`E2M1_DOUBLED`] in both 128-bit lanes, as `vpshufb` looks it up.
const E2M1_DOUBLED_LANES: [i8; 32] = {
    let mut table = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        table[i] = E2M1_DOUBLED[i % 16];
        i += 1;
    }
    table
};

/// Each byte of `codes` (a 4-bit code) as twice its e2m1 value, a signed byte.
#[inline(always)]
fn doubled(v3: V3, codes: __m256i) -> __m256i {
    v3.avx2._mm256_shuffle_epi8(cast(E2M1_DOUBLED_LANES), codes)
}

/// The nibbles of 32 packed MXFP4 bytes as twice their e2m1 values (signed bytes, low nibbles
/// then high).
#[inline(always)]
fn doubled_e2m1(v3: V3, packed: [u8; PAIR_BYTES]) -> (__m256i, __m256i) {
    let (low, high) = nibbles(v3, packed);
    (doubled(v3, low), doubled(v3, high))
}

/// One pair of MXFP4 blocks' signed products added to `acc`: each weight's magnitude times the
/// activation code with the weight's sign, through the engine's unsigned-by-signed products.
#[inline(always)]
fn add_signed_pair<E: PairProducts>(
    engine: E,
    acc: __m256i,
    (low, high): (__m256i, __m256i),
    even: __m256i,
    odd: __m256i,
) -> __m256i {
    let avx2 = engine.v3().avx2;
    engine.add_pair(
        acc,
        (avx2._mm256_abs_epi8(low), avx2._mm256_abs_epi8(high)),
        avx2._mm256_sign_epi8(even, low),
        avx2._mm256_sign_epi8(odd, high),
    )
}

/// `int8_fold::mxfp4_half_scale` of eight scale bytes from `first` (zero-padded past the end, which
/// the callers never reach): `2^(e - 127)` built from the exponent bits, halved, with the two
/// codes that formula misses, 0 (`2^-128` once halved) and 0xFF (NaN), put in by compare.
#[inline(always)]
fn eight_half_scales(v3: V3, scales: &[u8], first: usize) -> __m256 {
    let (avx, avx2) = (v3.avx, v3.avx2);
    let mut bytes = [0u8; 16];
    if let Some(eight) = scales.get(first..first + GROUPS_AT_ONCE) {
        bytes[..GROUPS_AT_ONCE].copy_from_slice(eight);
    }
    let codes = avx2._mm256_cvtepu8_epi32(cast(bytes));
    let power = avx._mm256_castsi256_ps(avx2._mm256_slli_epi32::<23>(codes));
    let half = avx._mm256_mul_ps(power, cast([0.5f32; 8]));
    // Compares written out, not in a closure: a closure would not inherit the target features.
    let zero_code = avx._mm256_castsi256_ps(avx2._mm256_cmpeq_epi32(codes, cast([0i32; 8])));
    let nan_code = avx._mm256_castsi256_ps(avx2._mm256_cmpeq_epi32(codes, cast([0xFFi32; 8])));
    // 2^-128, a subnormal: bit 21.
    let half = avx._mm256_blendv_ps(half, cast([f32::from_bits(1 << 21); 8]), zero_code);
    avx._mm256_blendv_ps(half, cast([f32::NAN; 8]), nan_code)
}

/// Groups of 32 folded at once by [`dot_mxfp4`]: four pairs of blocks.
const MXFP4_PAIRS_AT_ONCE: usize = GROUPS_AT_ONCE / 2;

/// MXFP4 row `r` against `x`: eight groups at a time (four registers of packed codes, each
/// holding two groups in its low and high four lanes), their sums gathered in group order and
/// folded on eight lanes; the last `groups % 8` one at a time through `int8_fold::fold`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn dot_mxfp4<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
    let v3 = engine.v3();
    let (avx, avx2) = (v3.avx, v3.avx2);
    let zero: __m256i = cast([0i32; 8]);
    let groups = m.cols / MXFP4_GROUP;
    let row_bytes = m.cols / 2;
    let row_start = r * row_bytes;
    let row = &m.packed[row_start..row_start + row_bytes];
    let pairs = row.as_chunks::<PAIR_BYTES>().0;
    let codes = x.paired.as_chunks::<BLOCK>().0;
    let scales = &m.scales[r * groups..(r + 1) * groups];
    let blocks = groups / GROUPS_AT_ONCE;
    // hadd of hadds leaves groups [0, 2, 4, 6, 1, 3, 5, 7]; this puts them back in order.
    let in_order: __m256i = cast([0i32, 4, 1, 5, 2, 6, 3, 7]);
    let mut acc: __m256 = cast([0f32; 8]);
    for block in 0..blocks {
        let start = block * MXFP4_PAIRS_AT_ONCE;
        prefetch_ahead(
            engine,
            m.packed,
            row_start + start * PAIR_BYTES,
            MXFP4_PAIRS_AT_ONCE * PAIR_BYTES,
        );
        let row_pairs = &pairs[start..start + MXFP4_PAIRS_AT_ONCE];
        let x_blocks = &codes[2 * start..2 * (start + MXFP4_PAIRS_AT_ONCE)];
        let mut lanes = [zero; MXFP4_PAIRS_AT_ONCE];
        for p in 0..MXFP4_PAIRS_AT_ONCE {
            let weights = doubled_e2m1(v3, row_pairs[p]);
            let (even, odd) = (cast(x_blocks[2 * p]), cast(x_blocks[2 * p + 1]));
            lanes[p] = add_signed_pair(engine, zero, weights, even, odd);
        }
        let totals = avx2._mm256_hadd_epi32(
            avx2._mm256_hadd_epi32(lanes[0], lanes[1]),
            avx2._mm256_hadd_epi32(lanes[2], lanes[3]),
        );
        let i = avx._mm256_cvtepi32_ps(avx2._mm256_permutevar8x32_epi32(totals, in_order));
        let first = block * GROUPS_AT_ONCE;
        let h = eight_half_scales(v3, scales, first);
        let step = eight_at(&x.steps, first);
        acc = avx._mm256_add_ps(acc, avx._mm256_mul_ps(avx._mm256_mul_ps(h, step), i));
    }
    let mut acc: [f32; 8] = cast(acc);
    for g in blocks * GROUPS_AT_ONCE..groups {
        let p = g / 2;
        let weights = doubled_e2m1(v3, packed_pair(row, p));
        let (even, odd) = (codes[2 * p], codes[2 * p + 1]);
        let lanes: [i32; 8] = cast(add_signed_pair(
            engine,
            zero,
            weights,
            cast(even),
            cast(odd),
        ));
        let half = if g % 2 == 0 { &lanes[..4] } else { &lanes[4..] };
        fold(m, r * groups + g, &mut acc, half.iter().sum(), x, g);
    }
    combine(acc)
}

/// MXFP4 rows `first..first + 8` against every vector of `xs` (an even number of groups per
/// row), into `out[r * batch + b]`. Each 64-column chunk of the eight rows is transposed and
/// looked up as twice its e2m1 values once for the batch. The weights are signed, so here the
/// activation codes take the unsigned side of the byte products, offset by 128 (`q + 128`, a
/// flip of the top bit), and the offset's share, 128 times each group's weight sum, is taken
/// off: the same exact `i_g` as [`dot_mxfp4`], and the same f32 fold lane by lane.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn octet_mxfp4<E: PairProducts>(
    engine: E,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
    scratch: &mut OctetScratch,
) {
    let v3 = engine.v3();
    let (avx, avx2) = (v3.avx, v3.avx2);
    let zero: __m256i = cast([0i32; 8]);
    let groups = m.cols / MXFP4_GROUP;
    let row_bytes = m.cols / 2;
    let (rows, next_octet) = octet_packed(m, first, row_bytes);
    let batch = xs.len();
    let accs = &mut scratch.acc[..batch];
    for acc in accs.iter_mut() {
        *acc = [cast([0f32; 8]); 8];
    }
    let offset: __m256i = cast([128u8; 32]);
    const FLIP: i32 = 0x8080_8080u32 as i32;
    let mut halves = [cast([0f32; 8]); GROUPS_AT_ONCE];
    for pair in 0..groups / 2 {
        let g = 2 * pair;
        if g % GROUPS_AT_ONCE == 0 {
            halves = octet_floats(v3, GroupFloats::HalfE8m0, m.scales, first, groups, g);
        }
        let (low, high) = octet_nibbles(engine, next_octet, &rows, pair);
        let mut weights = ([zero; OCTET], [zero; OCTET]);
        for i in 0..OCTET {
            weights.0[i] = doubled(v3, low[i]);
            weights.1[i] = doubled(v3, high[i]);
        }
        // Lanes 0-3 of the codes are the pair's first group, 4-7 its second.
        let mut offsets = [zero; 2];
        for i in 0..OCTET {
            let (w_even, w_odd) = (weights.0[i], weights.1[i]);
            offsets[i / 4] = engine.add_pair(offsets[i / 4], (offset, offset), w_even, w_odd);
        }
        for (v, x) in xs.iter().enumerate() {
            let codes = x.paired.as_chunks::<BLOCK>().0;
            let (Some(&even), Some(&odd)) = (codes.get(2 * pair), codes.get(2 * pair + 1)) else {
                continue;
            };
            let even: [i32; 8] = cast(even);
            let odd: [i32; 8] = cast(odd);
            // Two independent sums per group, added at the end (exact, so the order is free):
            // one chain of eight byte products would wait on each one's latency.
            let mut sums = [zero; 4];
            for i in 0..OCTET {
                let e = avx._mm256_set1_epi32(even[i] ^ FLIP);
                let o = avx._mm256_set1_epi32(odd[i] ^ FLIP);
                let (w_even, w_odd) = (weights.0[i], weights.1[i]);
                let at = i / 4 * 2 + i % 2;
                sums[at] = engine.add_pair(sums[at], (e, o), w_even, w_odd);
            }
            for half in 0..2 {
                let group = g + half;
                let sum = avx2._mm256_add_epi32(sums[2 * half], sums[2 * half + 1]);
                let i = avx2._mm256_sub_epi32(sum, offsets[half]);
                let step = avx._mm256_set1_ps(x.steps.get(group).copied().unwrap_or(f32::NAN));
                let terms = avx._mm256_mul_ps(
                    avx._mm256_mul_ps(halves[group % 8], step),
                    avx._mm256_cvtepi32_ps(i),
                );
                let acc = &mut accs[v][group % 8];
                *acc = avx._mm256_add_ps(*acc, terms);
            }
        }
    }
    store_octet(v3, accs, out);
}

/// Rows `first..` against every vector of `xs`, into `out[i * batch + b]`: each (row, vector)
/// runs the one row function, so each vector gets its own product's bits (a lone product is a
/// batch of one).
pub(crate) fn rows_batch(v3: V3, m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
    struct RowsBatch<'a, 'm> {
        v3: V3,
        m: &'a QMatrix<'m>,
        first: usize,
        xs: &'a [&'a Int8Vector],
        out: &'a mut [f32],
    }
    impl pulp::WithSimd for RowsBatch<'_, '_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            by_format(OctetRunner(self.v3), self.m, self.first, self.xs, self.out);
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

/// `rows_batch` with 512-bit VNNI: affine and MXFP4 batches sixteen rows at a time
/// (`sixteen_rows.rs`), everything else as `rows_batch_vnni` (the same bits).
pub(crate) fn rows_batch_vnni512(
    wide: Vnni512,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    wide.vectorize(
        #[inline(always)]
        || by_format(SixteenRunner(wide), m, first, xs, out),
    );
}

/// `rows_batch` with VNNI's byte dot products (the same bits).
pub(crate) fn rows_batch_vnni(
    vnni: Vnni,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    vnni.vectorize(
        #[inline(always)]
        || by_format(OctetRunner(vnni), m, first, xs, out),
    );
}

/// How rows against a batch run for a row kernel `K`: batched (octets or sixteens of rows)
/// for the kernels that have a batched form, one row at a time for the others.
trait BatchRunner: Copy {
    fn batched<K: sixteen_rows::Sixteens>(
        self,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
    );
    fn each_row<K: RowDot>(self, m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]);
}

/// Octets of rows in 256-bit registers, with engine `E` (AVX2 or VNNI).
#[derive(Clone, Copy)]
struct OctetRunner<E>(E);

impl<E: PairProducts> BatchRunner for OctetRunner<E> {
    #[inline(always)]
    fn batched<K: sixteen_rows::Sixteens>(
        self,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
    ) {
        rows_batch_octets::<E, K>(self.0, m, first, xs, out)
    }

    #[inline(always)]
    fn each_row<K: RowDot>(self, m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
        each_row::<E, K>(self.0, m, first, xs, out)
    }
}

/// Sixteens of rows in 512-bit registers.
#[derive(Clone, Copy)]
struct SixteenRunner(Vnni512);

impl BatchRunner for SixteenRunner {
    #[inline(always)]
    fn batched<K: sixteen_rows::Sixteens>(
        self,
        m: &QMatrix,
        first: usize,
        xs: &[&Int8Vector],
        out: &mut [f32],
    ) {
        sixteen_rows::rows_batch_sixteens::<K>(self.0, m, first, xs, out)
    }

    #[inline(always)]
    fn each_row<K: RowDot>(self, m: &QMatrix, first: usize, xs: &[&Int8Vector], out: &mut [f32]) {
        each_row::<Vnni, K>(self.0.vnni(), m, first, xs, out)
    }
}

/// The row kernel of `m`'s format and the batch's group, run by `runner`.
#[inline(always)]
fn by_format<R: BatchRunner>(
    runner: R,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    let group = xs.first().map_or(0, |x| x.group());
    match (m.format, group) {
        // The batched forms read whole 64-column chunks: an odd group count stays on the row
        // path.
        (Format::Mxfp4, _) if (m.cols / MXFP4_GROUP).is_multiple_of(2) => {
            runner.batched::<Mxfp4Rows>(m, first, xs, out)
        }
        (Format::Mxfp4, _) => runner.each_row::<Mxfp4Rows>(m, first, xs, out),
        // Registers of 32 bytes per group, as a constant of the row code.
        (Format::Affine { bits: 8, .. }, 32) => runner.batched::<ByteRows<1>>(m, first, xs, out),
        (Format::Affine { bits: 8, .. }, 64) => runner.batched::<ByteRows<2>>(m, first, xs, out),
        (Format::Affine { bits: 8, .. }, _) => runner.batched::<ByteRows<4>>(m, first, xs, out),
        // Pairs of 32-column blocks per group, likewise.
        (_, 64) => runner.batched::<Blocks<1>>(m, first, xs, out),
        (_, 128) => runner.batched::<Blocks<2>>(m, first, xs, out),
        _ => runner.each_row::<Group32Rows>(m, first, xs, out),
    }
}

/// One row function of this module as a type, so that one loop over rows and vectors serves
/// them all and still inlines into the code compiled for the machine's instructions (through a
/// closure or a function pointer it would not).
trait RowDot {
    fn dot<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32;
}

/// [`dot_mxfp4`].
struct Mxfp4Rows;

impl RowDot for Mxfp4Rows {
    #[inline(always)]
    fn dot<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
        dot_mxfp4(engine, m, r, x)
    }
}

/// Affine 8-bit for groups of `32 * RPG` columns: [`octet_affine`] and [`dot_bytes`].
struct ByteRows<const RPG: usize>;

impl<const RPG: usize> RowDot for ByteRows<RPG> {
    #[inline(always)]
    fn dot<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
        dot_bytes::<E, RPG>(engine, m, r, x)
    }
}

/// Affine 8-bit: a 32-byte chunk is 32 columns, transposed once for the batch and multiplied
/// with each vector's codes four at a time.
impl<const RPG: usize> AffineOctet for ByteRows<RPG> {
    const CHUNKS_PER_GROUP: usize = RPG;
    const BITS: usize = 8;
    type Weights = [__m256i; OCTET];

    #[inline(always)]
    fn weights<E: PairProducts>(
        engine: E,
        next_octet: &[u8],
        rows: &[&[[u8; PAIR_BYTES]]; OCTET],
        chunk: usize,
    ) -> Self::Weights {
        octet_chunk(engine, next_octet, rows, chunk)
    }

    #[inline(always)]
    fn chunk_sum<E: PairProducts>(
        engine: E,
        weights: &Self::Weights,
        x: &Int8Vector,
        chunk: usize,
    ) -> Option<__m256i> {
        let codes = x.codes.as_chunks::<BLOCK>().0.get(chunk)?;
        Some(octet_bytes_sum(engine, weights, *codes))
    }
}

/// [`dot_group32`] (affine 4-bit, groups of 32).
struct Group32Rows;

impl RowDot for Group32Rows {
    #[inline(always)]
    fn dot<E: PairProducts>(engine: E, m: &QMatrix, r: usize, x: &Int8Vector) -> f32 {
        dot_group32(engine.v3(), m, r, x)
    }
}

/// Rows `first..` against every vector of `xs` into `out[i * batch + b]`, row by row, so that
/// a row stays in cache for all the vectors.
#[inline(always)]
fn each_row<E: PairProducts, K: RowDot>(
    engine: E,
    m: &QMatrix,
    first: usize,
    xs: &[&Int8Vector],
    out: &mut [f32],
) {
    for (i, row_out) in out.chunks_exact_mut(xs.len()).enumerate() {
        for (o, x) in row_out.iter_mut().zip(xs) {
            *o = K::dot(engine, m, first + i, x);
        }
    }
}
