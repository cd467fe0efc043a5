//! One output row: the dot product of a stored row with `x`, in the order `kernels/mod.rs`
//! documents. Everything here is `#[inline(always)]` so that it compiles inside the SIMD
//! dispatch of `kernels::run_rows` with the wider instruction set enabled.

use super::decode;
use super::format::{Format, QMatrix};

/// Lane-wise sums of `x` over each affine group (`xsum[g][j]` = the sum over the group's
/// 8-element chunks, ascending, of lane `j`). Computed once per input vector.
pub(crate) fn lane_sums(x: &[f32], group: usize) -> Vec<[f32; 8]> {
    x.chunks_exact(group)
        .map(|g| {
            let mut sum = [0f32; 8];
            for chunk in g.as_chunks::<8>().0 {
                for j in 0..8 {
                    sum[j] += chunk[j];
                }
            }
            sum
        })
        .collect()
}

/// The fixed final reduction of the 8 lanes.
#[inline(always)]
fn reduce(acc: [f32; 8]) -> f32 {
    let h = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// Shared skeleton: segments of `seg` columns; in each, lane `j` accumulates
/// `w[8c + j] * x[8c + j]` over the segment's chunks `c` ascending; `finish` folds the segment
/// into the row's accumulators.
#[inline(always)]
fn segmented<const CB: usize>(
    row: &[u8],
    x: &[f32],
    seg: usize,
    decode: impl Fn(&[u8; CB]) -> [f32; 8],
    mut finish: impl FnMut(usize, &[f32; 8], &mut [f32; 8]),
) -> f32 {
    let mut acc = [0f32; 8];
    let seg_bytes = seg / 8 * CB;
    for (s, (bytes, xs)) in row.chunks(seg_bytes).zip(x.chunks(seg)).enumerate() {
        let mut part = [0f32; 8];
        for (chunk, x8) in bytes.as_chunks::<CB>().0.iter().zip(xs.as_chunks::<8>().0) {
            let w = decode(chunk);
            for j in 0..8 {
                part[j] += w[j] * x8[j];
            }
        }
        finish(s, &part, &mut acc);
    }
    reduce(acc)
}

#[inline(always)]
fn nibbles(chunk: &[u8; 4], value: impl Fn(u32) -> f32) -> [f32; 8] {
    let word = u32::from_le_bytes(*chunk);
    std::array::from_fn(|j| value((word >> (4 * j)) & 15))
}

#[inline(always)]
fn bytes8(chunk: &[u8; 8], value: impl Fn(u32) -> f32) -> [f32; 8] {
    std::array::from_fn(|j| value(u32::from(chunk[j])))
}

#[inline(always)]
fn halves(chunk: &[u8; 16], value: impl Fn(u32) -> f32) -> [f32; 8] {
    std::array::from_fn(|j| {
        value(u32::from(u16::from_le_bytes([
            chunk[2 * j],
            chunk[2 * j + 1],
        ])))
    })
}

/// Row `r` of `m` dotted with `x`. `xsum` is `lane_sums(x, group)` for affine matrices and
/// empty otherwise.
#[inline(always)]
pub(crate) fn dot(m: &QMatrix, r: usize, x: &[f32], xsum: &[[f32; 8]]) -> f32 {
    let row_bytes = m.row_bytes();
    let row = &m.packed[r * row_bytes..(r + 1) * row_bytes];
    let plain = |_: usize, part: &[f32; 8], acc: &mut [f32; 8]| {
        for j in 0..8 {
            acc[j] += part[j];
        }
    };
    match m.format {
        Format::Dense(super::FloatType::F32) => segmented::<32>(
            row,
            x,
            m.cols,
            |c| {
                std::array::from_fn(|j| {
                    f32::from_le_bytes([c[4 * j], c[4 * j + 1], c[4 * j + 2], c[4 * j + 3]])
                })
            },
            plain,
        ),
        Format::Dense(super::FloatType::BF16) => {
            segmented::<16>(row, x, m.cols, |c| halves(c, decode::bf16), plain)
        }
        Format::Dense(super::FloatType::F16) => {
            segmented::<16>(row, x, m.cols, |c| halves(c, decode::f16), plain)
        }
        Format::Affine { bits, group, scale } => {
            let groups = m.cols / group;
            let affine = |g: usize, part: &[f32; 8], acc: &mut [f32; 8]| {
                let s = scale.read(m.scales, r * groups + g);
                let b = scale.read(m.biases, r * groups + g);
                for j in 0..8 {
                    acc[j] += s * part[j] + b * xsum[g][j];
                }
            };
            if bits == 4 {
                segmented::<4>(row, x, group, |c| nibbles(c, |q| q as f32), affine)
            } else {
                segmented::<8>(row, x, group, |c| bytes8(c, |q| q as f32), affine)
            }
        }
        Format::Mxfp4 => {
            let groups = m.cols / 32;
            segmented::<4>(
                row,
                x,
                32,
                |c| nibbles(c, decode::e2m1),
                |g, part, acc| {
                    let s = decode::e8m0(u32::from(m.scales[r * groups + g]));
                    for j in 0..8 {
                        acc[j] += s * part[j];
                    }
                },
            )
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let grid_cols = m.cols.div_ceil(block_cols);
            let base = (r / block_rows) * grid_cols;
            segmented::<8>(
                row,
                x,
                block_cols,
                |c| bytes8(c, decode::e4m3),
                |b, part, acc| {
                    let s = scale.read(m.scales, base + b);
                    for j in 0..8 {
                        acc[j] += s * part[j];
                    }
                },
            )
        }
    }
}

/// Row `r` of `m` as f32 values: `scale * q + bias` (affine), `e2m1 * scale` (MXFP4),
/// `e4m3 * scale` (FP8), the value itself (dense); each one f32 operation, one rounding.
pub(crate) fn dequantize_row(m: &QMatrix, r: usize, out: &mut [f32]) {
    let row_bytes = m.row_bytes();
    let row = &m.packed[r * row_bytes..(r + 1) * row_bytes];
    match m.format {
        Format::Dense(t) => {
            for (k, o) in out.iter_mut().enumerate() {
                *o = t.read(row, k);
            }
        }
        Format::Affine { bits, group, scale } => {
            let groups = m.cols / group;
            for (k, o) in out.iter_mut().enumerate() {
                let q = if bits == 4 {
                    (row[k / 2] >> (4 * (k % 2))) & 15
                } else {
                    row[k]
                };
                let s = scale.read(m.scales, r * groups + k / group);
                let b = scale.read(m.biases, r * groups + k / group);
                *o = s * f32::from(q) + b;
            }
        }
        Format::Mxfp4 => {
            let groups = m.cols / 32;
            for (k, o) in out.iter_mut().enumerate() {
                let code = (row[k / 2] >> (4 * (k % 2))) & 15;
                *o = decode::e2m1(u32::from(code))
                    * decode::e8m0(u32::from(m.scales[r * groups + k / 32]));
            }
        }
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let base = (r / block_rows) * m.cols.div_ceil(block_cols);
            for (k, o) in out.iter_mut().enumerate() {
                *o = decode::e4m3(u32::from(row[k])) * scale.read(m.scales, base + k / block_cols);
            }
        }
    }
}
