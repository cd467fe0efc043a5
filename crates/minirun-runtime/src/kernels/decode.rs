//! Branch-free decoders from stored bits to f32, written so that the compiler can vectorise
//! them (shifts, masks, selects and one exact multiply; no tables, no libm). Each is exact:
//! every stored value has an f32 that equals it, and the multiplies by powers of two only move
//! the exponent (subnormal f32 inputs are never flushed, Rust sets no FTZ/DAZ).

/// 2^126: turns an e2m1 code placed in f32's exponent/mantissa bits into its value.
const E2M1_SHIFT: f32 = f32::from_bits((127 + 126) << 23);
/// 2^120: the same for e4m3 (f32 bias 127 minus e4m3 bias 7).
const E4M3_SHIFT: f32 = f32::from_bits((127 + 120) << 23);
/// 2^112: the same for IEEE half (bias 127 minus 15).
const F16_SHIFT: f32 = f32::from_bits((127 + 112) << 23);

/// OCP MX e2m1 (FP4): sign, 2 exponent bits (bias 1), 1 mantissa bit; values
/// 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0).
#[inline(always)]
pub fn e2m1(code: u32) -> f32 {
    let bits = ((code & 8) << 28) | ((code & 7) << 22);
    f32::from_bits(bits) * E2M1_SHIFT
}

/// OCP FP8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111
/// is NaN (so 0x7F and 0xFF); the largest finite magnitude is 448.
#[inline(always)]
pub fn e4m3(byte: u32) -> f32 {
    let magnitude = byte & 0x7F;
    let value = f32::from_bits(((byte & 0x80) << 24) | (magnitude << 20)) * E4M3_SHIFT;
    if magnitude == 0x7F { f32::NAN } else { value }
}

/// OCP MX e8m0 scale: 2^(byte - 127); 0xFF is NaN; 0 is 2^-127 (an f32 subnormal).
#[inline(always)]
pub fn e8m0(byte: u32) -> f32 {
    let normal = f32::from_bits(byte << 23);
    let value = if byte == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        normal
    };
    if byte == 0xFF { f32::NAN } else { value }
}

/// bfloat16: the top half of an f32.
#[inline(always)]
pub fn bf16(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// IEEE binary16, subnormals, infinities and NaN payloads included.
#[inline(always)]
pub fn f16(bits: u32) -> f32 {
    let sign = (bits & 0x8000) << 16;
    let magnitude = bits & 0x7FFF;
    let finite = f32::from_bits(magnitude << 13) * F16_SHIFT;
    let special = f32::from_bits(0x7F80_0000 | ((magnitude & 0x3FF) << 13));
    let value = if magnitude >= 0x7C00 { special } else { finite };
    f32::from_bits(value.to_bits() | sign)
}
