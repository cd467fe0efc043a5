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
/// caller checks); a finite input may round up to infinity (only above 3.3895e38).
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let lsb_of_result = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7FFF + lsb_of_result);
    (rounded >> 16) as u16
}

/// f32 -> f16 bits, round to nearest, ties to even; results below 2^-24 in magnitude
/// round to a subnormal or to ±0, results at or above 65520 become ±infinity.
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

/// Running statistics over stored bit patterns of one dtype, as |bits|.
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

    fn widen(&self, abs_bits: u32) -> f32 {
        match self.dtype {
            Dtype::F32 => f32::from_bits(abs_bits),
            Dtype::F16 => f16_bits_to_f32(abs_bits as u16),
            Dtype::Bf16 => bf16_bits_to_f32(abs_bits as u16),
        }
    }

    pub(crate) fn finish(&self) -> NarrowStats {
        let min = match self.min_nonzero_abs_bits {
            u32::MAX => 0.0,
            bits => self.widen(bits),
        };
        NarrowStats {
            flushed: self.flushed,
            max_abs: self.widen(self.max_abs_bits),
            min_nonzero_abs: min,
        }
    }

    /// Folds stored 16-bit patterns (little-endian byte pairs) into the statistics.
    pub(crate) fn observe_half_bytes(&mut self, bytes: &[u8]) {
        let (mut max, mut min) = (self.max_abs_bits as u16, u16::MAX);
        for pair in bytes.chunks_exact(2) {
            let abs = u16::from_le_bytes([pair[0], pair[1]]) & HALF_ABS_MASK;
            max = max.max(abs);
            min = min.min(if abs == 0 { u16::MAX } else { abs });
        }
        self.merge(u32::from(max), u32::from(min), u16::MAX.into());
    }

    /// Folds stored f32 patterns (little-endian) into the statistics.
    pub(crate) fn observe_f32_bytes(&mut self, bytes: &[u8]) {
        let (mut max, mut min) = (self.max_abs_bits, u32::MAX);
        for quad in bytes.chunks_exact(4) {
            let abs = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]) & F32_ABS_MASK;
            max = max.max(abs);
            min = min.min(if abs == 0 { u32::MAX } else { abs });
        }
        self.merge(max, min, u32::MAX);
    }

    fn merge(&mut self, max: u32, min: u32, none: u32) {
        self.max_abs_bits = self.max_abs_bits.max(max);
        if min != none {
            self.min_nonzero_abs_bits = self.min_nonzero_abs_bits.min(min);
        }
    }
}

/// Why one value could not be stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ValueProblem {
    /// The input itself is NaN or infinite.
    NonFiniteInput { index: u64, value: f32 },
    /// A finite input rounded to infinity in the target dtype.
    Overflow { index: u64, value: f32 },
}

/// Narrows `values` to `dtype`, appending little-endian bytes to `out` and folding the
/// stored values into `acc`. On a problem, `out` may hold part of the tensor.
pub(crate) fn narrow_into(
    dtype: Dtype,
    values: &[f32],
    out: &mut Vec<u8>,
    sink: &mut Sink,
) -> Result<(), ValueProblem> {
    let start = out.len();
    out.resize(start + values.len() * dtype.size() as usize, 0);
    let dest = &mut out[start..];
    match dtype {
        Dtype::F32 => narrow_chunks(values, dest, 4, sink, store_f32),
        Dtype::F16 => narrow_chunks(values, dest, 2, sink, |x, o| {
            store_half(x, o, f32_to_f16_bits, 0x7C00)
        }),
        Dtype::Bf16 => narrow_chunks(values, dest, 2, sink, |x, o| {
            store_half(x, o, f32_to_bf16_bits, 0x7F80)
        }),
    }
}

/// Where narrowed chunks go while they are still in cache: the statistics and the
/// payload checksum.
pub(crate) struct Sink {
    pub(crate) stats: StatsAcc,
    pub(crate) crc: crc32fast::Hasher,
}

/// What storing one value produced, for the statistics.
#[derive(Clone, Copy)]
struct Stored {
    abs_bits: u32,
    /// The input was non-zero and the stored value is ±0.
    flushed: bool,
    /// The input was non-finite or the stored value is.
    problem: bool,
}

fn store_f32(x: f32, out: &mut [u8]) -> Stored {
    let bits = x.to_bits();
    out.copy_from_slice(&bits.to_le_bytes());
    Stored {
        abs_bits: bits & F32_ABS_MASK,
        flushed: false,
        problem: bits & F32_EXP_MASK == F32_EXP_MASK,
    }
}

fn store_half(x: f32, out: &mut [u8], narrow: impl Fn(f32) -> u16, exp_mask: u16) -> Stored {
    let bits = x.to_bits();
    let stored = narrow(x);
    out.copy_from_slice(&stored.to_le_bytes());
    let abs = stored & HALF_ABS_MASK;
    Stored {
        abs_bits: u32::from(abs),
        flushed: abs == 0 && bits & F32_ABS_MASK != 0,
        problem: bits & F32_EXP_MASK == F32_EXP_MASK || abs & exp_mask == exp_mask,
    }
}

fn narrow_chunks(
    values: &[f32],
    dest: &mut [u8],
    width: usize,
    sink: &mut Sink,
    store: impl Fn(f32, &mut [u8]) -> Stored,
) -> Result<(), ValueProblem> {
    for (chunk_index, (chunk, out)) in values
        .chunks(CHUNK)
        .zip(dest.chunks_mut(CHUNK * width))
        .enumerate()
    {
        let (mut max, mut min, mut flushed, mut problem) = (0u32, u32::MAX, 0u64, false);
        for (&x, o) in chunk.iter().zip(out.chunks_exact_mut(width)) {
            let s = store(x, o);
            max = max.max(s.abs_bits);
            min = min.min(if s.abs_bits == 0 { u32::MAX } else { s.abs_bits });
            flushed += u64::from(s.flushed);
            problem |= s.problem;
        }
        if problem {
            return Err(first_problem(chunk, chunk_index * CHUNK, width, &store));
        }
        sink.stats.flushed += flushed;
        sink.stats.merge(max, min, u32::MAX);
        sink.crc.update(out);
    }
    Ok(())
}

/// Rescans a chunk known to hold a problem and names the first one.
fn first_problem(
    chunk: &[f32],
    base: usize,
    width: usize,
    store: &impl Fn(f32, &mut [u8]) -> Stored,
) -> ValueProblem {
    let mut scratch = [0u8; 4];
    for (offset, &value) in chunk.iter().enumerate() {
        let index = (base + offset) as u64;
        if !value.is_finite() {
            return ValueProblem::NonFiniteInput { index, value };
        }
        if store(value, &mut scratch[..width]).problem {
            return ValueProblem::Overflow { index, value };
        }
    }
    unreachable!("a chunk flagged with a problem holds a non-finite input or an overflow")
}

/// Widens stored bytes of `dtype` to f32, appending to `out`, and folds them into `acc`.
pub(crate) fn widen_into(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>, acc: &mut StatsAcc) {
    for chunk in bytes.chunks(CHUNK * dtype.size() as usize) {
        match dtype {
            Dtype::F32 => {
                acc.observe_f32_bytes(chunk);
                out.extend(
                    chunk
                        .chunks_exact(4)
                        .map(|q| f32::from_le_bytes([q[0], q[1], q[2], q[3]])),
                );
            }
            Dtype::Bf16 => {
                acc.observe_half_bytes(chunk);
                out.extend(
                    chunk
                        .chunks_exact(2)
                        .map(|p| bf16_bits_to_f32(u16::from_le_bytes([p[0], p[1]]))),
                );
            }
            Dtype::F16 => {
                acc.observe_half_bytes(chunk);
                out.extend(
                    chunk
                        .chunks_exact(2)
                        .map(|p| f16_bits_to_f32(u16::from_le_bytes([p[0], p[1]]))),
                );
            }
        }
    }
}

/// Widens stored bytes of `dtype` to f32 without statistics (lazy single-tensor reads).
pub(crate) fn widen(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / dtype.size() as usize);
    let mut acc = StatsAcc::new(dtype);
    widen_into(dtype, bytes, &mut out, &mut acc);
    out
}
