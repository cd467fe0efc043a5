//! Branch-free decoders from stored bits to f32, written so that the compiler vectorises them:
//! integer shifts and adds, selects, and signed integer-to-float conversions. No intermediate
//! is ever an f32 subnormal (x86 cores take a slow microcode path on those) and no table or
//! libm call is used. Each decoder is exact: every stored value has an f32 equal to it.
//!
//! The trick for normal values: a code's exponent and mantissa bits, shifted into f32's
//! position, plus the difference of the exponent biases added to the exponent field, *is* the
//! f32 of the value. Subnormal codes (exponent field 0) are an integer times a power of two.

/// OCP MX e2m1 (FP4): sign, 2 exponent bits (bias 1), 1 mantissa bit; values
/// 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0).
#[inline(always)]
pub fn e2m1(code: u32) -> f32 {
    let magnitude = code & 7;
    let normal = f32::from_bits((magnitude << 22) + (126 << 23));
    let subnormal = (magnitude as i32) as f32 * 0.5;
    let value = if magnitude < 2 { subnormal } else { normal };
    f32::from_bits(value.to_bits() | ((code & 8) << 28))
}

/// OCP FP8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111
/// is NaN (so 0x7F and 0xFF); the largest finite magnitude is 448.
#[inline(always)]
pub fn e4m3(byte: u32) -> f32 {
    let magnitude = byte & 0x7F;
    let normal = f32::from_bits((magnitude << 20) + (120 << 23));
    let subnormal = (magnitude as i32) as f32 * (1.0 / 512.0);
    let value = if magnitude < 8 { subnormal } else { normal };
    let value = f32::from_bits(value.to_bits() | ((byte & 0x80) << 24));
    if magnitude == 0x7F { f32::NAN } else { value }
}

/// OCP MX e8m0 scale: 2^(byte - 127); 0xFF is NaN; 0 is 2^-127 (the one subnormal result,
/// read once per group, never in an inner loop).
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
    let magnitude = (bits & 0x7FFF) as i32;
    let normal = f32::from_bits(((magnitude << 13) + (112 << 23)) as u32);
    let subnormal = magnitude as f32 * (1.0 / 16_777_216.0);
    let special = f32::from_bits(0x7F80_0000 | (((magnitude & 0x3FF) << 13) as u32));
    let value = if magnitude < 0x400 {
        subnormal
    } else if magnitude >= 0x7C00 {
        special
    } else {
        normal
    };
    f32::from_bits(value.to_bits() | ((bits & 0x8000) << 16))
}
