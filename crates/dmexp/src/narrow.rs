//! Narrowing f32 to f16 / bf16 (round to nearest, ties to even) and exact widening back.
//!
//! Everything here is integer work on bit patterns; no float arithmetic decides a result.
//! Narrowed values are compared as integers: for non-negative IEEE values the order of
//! the bit patterns is the order of the numbers, which is what makes the statistics
//! (max |w|, min non-zero |w|) cheap to gather while narrowing.

use half::f16;

use crate::dtype::Dtype;

/// Values are narrowed and scanned in chunks of this many elements; a chunk with a
/// problem is rescanned one element at a time to name the index.
const CHUNK: usize = 4096;

const F32_EXP_MASK: u32 = 0x7F80_0000;
const F32_ABS_MASK: u32 = 0x7FFF_FFFF;
const HALF_ABS_MASK: u16 = 0x7FFF;

/// f32 -> bf16 bits, round to nearest, ties to even. The input must be finite (the
/// caller checks); a finite input rounds up to infinity when its bits are at least
/// `0x7F7F8000` in magnitude (about 3.3962e38, which includes `f32::MAX`).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    Bf16Format::narrow(x.to_bits()) as u16
}

/// f32 -> f16 bits, round to nearest, ties to even. Magnitudes below 2^-14 become
/// subnormals (multiples of 2^-24); at or below 2^-25 they become ±0; at or above 65520
/// they become ±infinity.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bf16 bits -> f32, exact.
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f16 bits -> f32, exact (every f16, subnormals included, is an f32).
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// What narrowing saw across every tensor of one export.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NarrowStats {
    /// Non-zero inputs that became ±0.
    pub flushed: u64,
    /// Largest |value| after narrowing (0 if every value is 0).
    pub max_abs: f32,
    /// Smallest non-zero |value| after narrowing (0 if every value is 0).
    pub min_nonzero_abs: f32,
}

/// Running statistics over stored values, kept as |stored bits|.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatsAcc {
    dtype: Dtype,
    flushed: u64,
    max_abs_bits: u32,
    /// `u32::MAX` while no non-zero value has been seen.
    min_nonzero_abs_bits: u32,
}

impl StatsAcc {
    pub(crate) fn new(dtype: Dtype) -> Self {
        StatsAcc {
            dtype,
            flushed: 0,
            max_abs_bits: 0,
            min_nonzero_abs_bits: u32::MAX,
        }
    }

    pub(crate) fn finish(&self) -> NarrowStats {
        let widen = |bits: u32| match self.dtype {
            Dtype::F32 => f32::from_bits(bits),
            Dtype::F16 => f16_bits_to_f32(bits as u16),
            Dtype::Bf16 => bf16_bits_to_f32(bits as u16),
        };
        let min = match self.min_nonzero_abs_bits {
            u32::MAX => 0.0,
            bits => widen(bits),
        };
        NarrowStats {
            flushed: self.flushed,
            max_abs: widen(self.max_abs_bits),
            min_nonzero_abs: min,
        }
    }

    /// Folds in the statistics another accumulator gathered over other values.
    pub(crate) fn absorb(&mut self, other: &StatsAcc) {
        self.flushed += other.flushed;
        self.max_abs_bits = self.max_abs_bits.max(other.max_abs_bits);
        self.min_nonzero_abs_bits = self.min_nonzero_abs_bits.min(other.min_nonzero_abs_bits);
    }

    fn merge(&mut self, chunk: ChunkStats) {
        self.flushed += u64::from(chunk.flushed);
        self.max_abs_bits = self.max_abs_bits.max(chunk.max);
        self.min_nonzero_abs_bits = self.min_nonzero_abs_bits.min(chunk.min_nonzero);
    }
}

/// Statistics of a payload gathered before its dtype is known (the lazy reader checks
/// the CRC before it parses the header): both the 16-bit and the 32-bit reading of the
/// bytes are kept, and the header's dtype picks one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UntypedStats {
    half: ChunkStats,
    full: ChunkStats,
}

impl UntypedStats {
    pub(crate) fn new() -> Self {
        let empty = ChunkStats {
            max: 0,
            min_nonzero: u32::MAX,
            flushed: 0,
        };
        UntypedStats {
            half: empty,
            full: empty,
        }
    }

    /// Folds in the next payload bytes; every call but the last must pass a multiple of 4.
    pub(crate) fn observe(&mut self, bytes: &[u8]) {
        fold_abs::<Bf16Format>(bytes, &mut self.half);
        fold_abs::<F32Format>(bytes, &mut self.full);
    }

    pub(crate) fn for_dtype(&self, dtype: Dtype) -> StatsAcc {
        let mut acc = StatsAcc::new(dtype);
        acc.merge(match dtype {
            Dtype::F32 => self.full,
            Dtype::F16 | Dtype::Bf16 => self.half,
        });
        acc
    }
}

/// Max and min non-zero of |stored| over `bytes` read as format `F`.
fn fold_abs<F: Format>(bytes: &[u8], stats: &mut ChunkStats) {
    for b in bytes.chunks_exact(F::WIDTH) {
        let abs = F::read(b) & F::ABS;
        stats.max = stats.max.max(abs);
        stats.min_nonzero = stats.min_nonzero.min(if abs == 0 { u32::MAX } else { abs });
    }
}

/// Statistics of one chunk, in the integer form the inner loops vectorise.
#[derive(Debug, Clone, Copy)]
struct ChunkStats {
    max: u32,
    min_nonzero: u32,
    flushed: u32,
}

/// Why one value could not be stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ValueProblem {
    /// The input itself is NaN or infinite.
    NonFiniteInput { index: u64, value: f32 },
    /// A finite input rounded to infinity in the target dtype.
    Overflow { index: u64, value: f32 },
}

impl ValueProblem {
    /// The same problem, its index counted from `offset` values earlier.
    pub(crate) fn after(self, offset: u64) -> Self {
        match self {
            ValueProblem::NonFiniteInput { index, value } => ValueProblem::NonFiniteInput {
                index: index + offset,
                value,
            },
            ValueProblem::Overflow { index, value } => ValueProblem::Overflow {
                index: index + offset,
                value,
            },
        }
    }
}

/// One storage format, as integer operations on bit patterns. Implemented by zero-sized
/// types so that each loop is compiled (and vectorised) for one format.
trait Format {
    /// Bytes per stored value.
    const WIDTH: usize;
    /// Mask of the stored magnitude (everything but the sign).
    const ABS: u32;
    /// The smallest stored magnitude that is infinite or NaN.
    const NON_FINITE: u32;
    /// f32 bits -> stored bits (in the low `8 * WIDTH` bits).
    fn narrow(bits: u32) -> u32;
    /// Stored bits -> f32, exactly.
    fn widen(stored: u32) -> f32;
    fn write(stored: u32, out: &mut [u8]);
    fn read(bytes: &[u8]) -> u32;
}

struct F32Format;
struct F16Format;
struct Bf16Format;

impl Format for F32Format {
    const WIDTH: usize = 4;
    const ABS: u32 = F32_ABS_MASK;
    const NON_FINITE: u32 = F32_EXP_MASK;
    fn narrow(bits: u32) -> u32 {
        bits
    }
    fn widen(stored: u32) -> f32 {
        f32::from_bits(stored)
    }
    fn write(stored: u32, out: &mut [u8]) {
        out.copy_from_slice(&stored.to_le_bytes());
    }
    fn read(b: &[u8]) -> u32 {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Format for F16Format {
    const WIDTH: usize = 2;
    const ABS: u32 = HALF_ABS_MASK as u32;
    const NON_FINITE: u32 = 0x7C00;
    fn narrow(bits: u32) -> u32 {
        u32::from(f32_to_f16_bits(f32::from_bits(bits)))
    }
    fn widen(stored: u32) -> f32 {
        f16_bits_to_f32(stored as u16)
    }
    fn write(stored: u32, out: &mut [u8]) {
        out.copy_from_slice(&(stored as u16).to_le_bytes());
    }
    fn read(b: &[u8]) -> u32 {
        u32::from(u16::from_le_bytes([b[0], b[1]]))
    }
}

impl Format for Bf16Format {
    const WIDTH: usize = 2;
    const ABS: u32 = HALF_ABS_MASK as u32;
    const NON_FINITE: u32 = 0x7F80;
    fn narrow(bits: u32) -> u32 {
        // Adding 0x7FFF plus the lowest kept bit carries into the kept bits exactly when
        // the dropped half is above the midpoint, or at it with an odd kept part.
        let lowest_kept_bit = (bits >> 16) & 1;
        bits.wrapping_add(0x7FFF + lowest_kept_bit) >> 16
    }
    fn widen(stored: u32) -> f32 {
        f32::from_bits(stored << 16)
    }
    fn write(stored: u32, out: &mut [u8]) {
        out.copy_from_slice(&(stored as u16).to_le_bytes());
    }
    fn read(b: &[u8]) -> u32 {
        u32::from(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// Calls `$body` with `$F` bound to the format type of `$dtype`.
macro_rules! with_format {
    ($dtype:expr, $F:ident => $body:expr) => {
        match $dtype {
            Dtype::F32 => {
                type $F = F32Format;
                $body
            }
            Dtype::F16 => {
                type $F = F16Format;
                $body
            }
            Dtype::Bf16 => {
                type $F = Bf16Format;
                $body
            }
        }
    };
}

/// Pass one of encoding: checks that every value of one tensor can be stored in `dtype`
/// and folds the stored values into `acc`, without writing anything.
pub(crate) fn scan(dtype: Dtype, values: &[f32], acc: &mut StatsAcc) -> Result<(), ValueProblem> {
    with_format!(dtype, F => vectorized(|| scan_with::<F>(values, acc)))
}

/// Runs `op` compiled for the widest vector instructions this CPU has (pulp's runtime
/// dispatch; the baseline x86-64 target has no 32-bit integer min and max). The loops here are
/// integer work on bit patterns, so every variant computes the same bytes and statistics.
fn vectorized<R>(op: impl FnOnce() -> R) -> R {
    struct Op<F>(F);
    impl<R, F: FnOnce() -> R> pulp::WithSimd for Op<F> {
        type Output = R;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> R {
            (self.0)()
        }
    }
    pulp::Arch::new().dispatch(Op(op))
}

#[inline(always)]
fn scan_with<F: Format>(values: &[f32], acc: &mut StatsAcc) -> Result<(), ValueProblem> {
    for (chunk_index, chunk) in values.chunks(CHUNK).enumerate() {
        let mut stats = ChunkStats {
            max: 0,
            min_nonzero: u32::MAX,
            flushed: 0,
        };
        let mut bad = false;
        for &x in chunk {
            let bits = x.to_bits();
            let abs = F::narrow(bits) & F::ABS;
            stats.max = stats.max.max(abs);
            stats.min_nonzero = stats.min_nonzero.min(if abs == 0 { u32::MAX } else { abs });
            stats.flushed += u32::from((abs == 0) & (bits & F32_ABS_MASK != 0));
            bad |= (bits & F32_EXP_MASK == F32_EXP_MASK) | (abs >= F::NON_FINITE);
        }
        if bad {
            return Err(first_problem::<F>(chunk, chunk_index * CHUNK));
        }
        acc.merge(stats);
    }
    Ok(())
}

/// Rescans a chunk known to hold a problem and names the first one.
fn first_problem<F: Format>(chunk: &[f32], base: usize) -> ValueProblem {
    let problem = chunk.iter().enumerate().find_map(|(offset, &value)| {
        let index = (base + offset) as u64;
        if !value.is_finite() {
            Some(ValueProblem::NonFiniteInput { index, value })
        } else if F::narrow(value.to_bits()) & F::ABS >= F::NON_FINITE {
            Some(ValueProblem::Overflow { index, value })
        } else {
            None
        }
    });
    // The scan flagged this chunk with the same two tests, so one of them holds.
    problem.unwrap_or(ValueProblem::Overflow {
        index: base as u64,
        value: f32::NAN,
    })
}

/// Pass two of encoding: narrows `values` into `out` (exactly `values.len()` x width
/// bytes). The values must have passed [`scan`].
pub(crate) fn narrow_to(dtype: Dtype, values: &[f32], out: &mut [u8]) {
    with_format!(dtype, F => vectorized(|| narrow_with::<F>(values, out)))
}

#[inline(always)]
fn narrow_with<F: Format>(values: &[f32], out: &mut [u8]) {
    for (&x, o) in values.iter().zip(out.chunks_exact_mut(F::WIDTH)) {
        F::write(F::narrow(x.to_bits()), o);
    }
}

/// Widens stored bytes of `dtype` into `out` (exactly one f32 per stored value) and
/// folds the stored values into `acc`.
pub(crate) fn widen_to(dtype: Dtype, bytes: &[u8], out: &mut [f32], acc: &mut StatsAcc) {
    with_format!(dtype, F => vectorized(|| widen_with::<F>(bytes, out, acc)))
}

#[inline(always)]
fn widen_with<F: Format>(bytes: &[u8], out: &mut [f32], acc: &mut StatsAcc) {
    for (chunk, out) in bytes.chunks(CHUNK * F::WIDTH).zip(out.chunks_mut(CHUNK)) {
        let mut stats = ChunkStats {
            max: 0,
            min_nonzero: u32::MAX,
            flushed: 0,
        };
        for (o, b) in out.iter_mut().zip(chunk.chunks_exact(F::WIDTH)) {
            let stored = F::read(b);
            let abs = stored & F::ABS;
            stats.max = stats.max.max(abs);
            stats.min_nonzero = stats.min_nonzero.min(if abs == 0 { u32::MAX } else { abs });
            *o = F::widen(stored);
        }
        acc.merge(stats);
    }
}

/// Widens stored bytes of `dtype` to a new f32 vector (lazy single-tensor reads).
pub(crate) fn widen(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / dtype.size() as usize];
    widen_to(dtype, bytes, &mut out, &mut StatsAcc::new(dtype));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_found_in_a_piece_is_placed_after_the_values_before_it() {
        let nan = ValueProblem::NonFiniteInput {
            index: 3,
            value: f32::NAN,
        };
        match nan.after(10) {
            ValueProblem::NonFiniteInput { index, value } => {
                assert_eq!(index, 13);
                assert!(value.is_nan());
            }
            other => panic!("{other:?}"),
        }
        let overflow = ValueProblem::Overflow {
            index: 3,
            value: 1e6,
        };
        assert!(matches!(
            overflow.after(10),
            ValueProblem::Overflow { index: 13, value } if value == 1e6
        ));
    }
}
