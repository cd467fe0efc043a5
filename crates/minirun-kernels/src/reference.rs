//! Scalar reference implementations: every element decoded by its textbook definition (table
//! lookups, `powi`, the `half` crate) and every product summed in f64. Slow on purpose and
//! written independently of `decode.rs` and `row.rs`, so that property tests compare two
//! implementations, not one with itself.

use super::format::{BlockScale, FloatType, Format, QMatrix};

/// The e2m1 magnitudes by code (OCP MX v1.0, table 5).
const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

pub fn e2m1(code: u8) -> f64 {
    let magnitude = E2M1[usize::from(code & 7)];
    if code & 8 != 0 { -magnitude } else { magnitude }
}

pub fn e4m3(byte: u8) -> f64 {
    let exponent = i32::from((byte >> 3) & 15);
    let mantissa = f64::from(byte & 7);
    if exponent == 15 && mantissa == 7.0 {
        return f64::NAN;
    }
    let magnitude = if exponent == 0 {
        mantissa / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + mantissa / 8.0) * 2f64.powi(exponent - 7)
    };
    if byte & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

pub fn e8m0(byte: u8) -> f64 {
    if byte == 0xFF {
        f64::NAN
    } else {
        2f64.powi(i32::from(byte) - 127)
    }
}

pub fn float(t: FloatType, bytes: &[u8], index: usize) -> f64 {
    match t {
        FloatType::F32 => f64::from(f32::from_le_bytes(
            bytes[4 * index..4 * index + 4].try_into().unwrap_or([0; 4]),
        )),
        FloatType::F16 => {
            half::f16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f64()
        }
        FloatType::BF16 => {
            half::bf16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f64()
        }
    }
}

fn block_scale(scale: BlockScale, bytes: &[u8], index: usize) -> f64 {
    match scale {
        BlockScale::E8m0 => e8m0(bytes[index]),
        BlockScale::Float(t) => float(t, bytes, index),
    }
}

fn nibble(bytes: &[u8], k: usize) -> u8 {
    (bytes[k / 2] >> (4 * (k % 2))) & 15
}

/// Element `(r, k)` of the matrix as (value, magnitude bound of its terms): affine's value is
/// `s*q + b`, and its bound `|s*q| + |b|` is what rounding error scales with.
pub fn element(m: &QMatrix, r: usize, k: usize) -> (f64, f64) {
    let cell = r * m.cols + k;
    match m.format {
        Format::Dense(t) => {
            let v = float(t, m.packed, cell);
            (v, v.abs())
        }
        Format::Affine { bits, group, scale } => {
            let q = if bits == 4 {
                nibble(m.packed, cell)
            } else {
                m.packed[cell]
            };
            let g = r * (m.cols / group) + k / group;
            let s = float(scale, m.scales, g);
            let b = float(scale, m.biases, g);
            let sq = s * f64::from(q);
            (sq + b, sq.abs() + b.abs())
        }
        Format::Mxfp4 => {
            let v = e2m1(nibble(m.packed, cell)) * e8m0(m.scales[r * (m.cols / 32) + k / 32]);
            (v, v.abs())
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let b = (r / block_rows) * m.cols.div_ceil(block_cols) + k / block_cols;
            let v = e4m3(m.packed[cell]) * block_scale(scale, m.scales, b);
            (v, v.abs())
        }
    }
}

/// `W x` in f64, with `sum |term|` per row (the scale of an f32 summation's rounding error).
pub fn matvec(m: &QMatrix, x: &[f32]) -> Vec<(f64, f64)> {
    (0..m.rows)
        .map(|r| {
            (0..m.cols).fold((0.0, 0.0), |(sum, size), k| {
                let (w, bound) = element(m, r, k);
                let xk = f64::from(x[k]);
                (sum + w * xk, size + bound * xk.abs())
            })
        })
        .collect()
}
