//! What a stored matrix is: its encoding, its shape, and the byte slices that hold it.

use crate::KernelError;

/// A float type a dense matrix, a scale or a bias is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatType {
    F32,
    F16,
    BF16,
}

impl FloatType {
    pub fn size(self) -> usize {
        match self {
            FloatType::F32 => 4,
            FloatType::F16 | FloatType::BF16 => 2,
        }
    }

    /// The value at element `index` of `bytes` (little-endian).
    #[inline(always)]
    pub fn read(self, bytes: &[u8], index: usize) -> f32 {
        match self {
            FloatType::F32 => {
                let at = index * 4;
                f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
            }
            FloatType::F16 => super::decode::f16(read_u16(bytes, index)),
            FloatType::BF16 => super::decode::bf16(read_u16(bytes, index)),
        }
    }
}

#[inline(always)]
fn read_u16(bytes: &[u8], index: usize) -> u32 {
    u32::from(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]))
}

/// How the scale of an FP8 block is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockScale {
    /// One byte, 2^(byte - 127) (DeepSeek V4, OCP MX).
    E8m0,
    /// A float (DeepSeek V3's `weight_scale_inv` is F32).
    Float(FloatType),
}

impl BlockScale {
    fn size(self) -> usize {
        match self {
            BlockScale::E8m0 => 1,
            BlockScale::Float(t) => t.size(),
        }
    }

    #[inline(always)]
    pub(crate) fn read(self, bytes: &[u8], index: usize) -> f32 {
        match self {
            BlockScale::E8m0 => super::decode::e8m0(u32::from(bytes[index])),
            BlockScale::Float(t) => t.read(bytes, index),
        }
    }
}

/// The encoding of a matrix's stored bytes. Every encoding is row-major over `[rows, cols]`
/// (`cols` is the reduction length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Plain floats.
    Dense(FloatType),
    /// MLX affine: `w = scale * q + bias` per group of `group` columns, `q` unsigned `bits`
    /// wide, element 0 in the lowest bits of each little-endian u32.
    Affine {
        bits: u32,
        group: usize,
        scale: FloatType,
    },
    /// OCP MXFP4 as MLX and gpt-oss store it: e2m1 codes (low nibble first) and one e8m0
    /// scale per 32 columns.
    Mxfp4,
    /// FP8 e4m3 with one scale per `block_rows x block_cols` block (the last block row and
    /// column may be partial).
    Fp8Block {
        block_rows: usize,
        block_cols: usize,
        scale: BlockScale,
    },
}

/// How a matrix's rows lie in its three byte streams: each stream holds its rows one after
/// another, the packed elements `packed` bytes a row, the scales and biases `scales` and
/// `biases` bytes for each band of `band_rows` rows (one row, but an FP8 block's rows share
/// their scales). A run of whole bands is a matrix of its own, its rows computing the bits they
/// compute in the whole matrix: what lets a table be read by rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowBytes {
    pub packed: usize,
    pub scales: usize,
    pub biases: usize,
    pub band_rows: usize,
}

impl Format {
    /// The bytes of a row (and of a band of rows' scales and biases) of a matrix `cols` wide in
    /// this format.
    pub fn row_bytes(self, cols: usize) -> RowBytes {
        let one = |packed, scales, biases| RowBytes {
            packed,
            scales,
            biases,
            band_rows: 1,
        };
        match self {
            Format::Dense(t) => one(cols * t.size(), 0, 0),
            Format::Affine { bits, group, scale } => {
                let groups = cols / group * scale.size();
                one(cols * bits as usize / 8, groups, groups)
            }
            Format::Mxfp4 => one(cols / 2, cols / 32, 0),
            Format::Fp8Block {
                block_rows,
                block_cols,
                scale,
            } => RowBytes {
                packed: cols,
                scales: cols.div_ceil(block_cols) * scale.size(),
                biases: 0,
                band_rows: block_rows.max(1),
            },
        }
    }
}

/// A matrix as stored: borrowed bytes, checked once against the shape.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    // Private: `new` checks them against each other once, and the kernels rely on that.
    pub(crate) format: Format,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) packed: &'a [u8],
    pub(crate) scales: &'a [u8],
    pub(crate) biases: &'a [u8],
    /// Whether an FP8 matrix holds any NaN code (found once, by `new`): the kernels skip the
    /// per-element NaN selection when it holds none, which changes no result.
    pub(crate) fp8_nan_codes: bool,
    /// The arithmetic of the products (`super::Activations`).
    pub(crate) activations: super::Activations,
}

impl<'a> QMatrix<'a> {
    /// Checks that the slices hold exactly a `rows x cols` matrix in `format` (and, for FP8,
    /// reads the elements once for NaN codes: build a matrix once, use it many times).
    pub fn new(
        format: Format,
        rows: usize,
        cols: usize,
        packed: &'a [u8],
        scales: &'a [u8],
        biases: &'a [u8],
    ) -> Result<QMatrix<'a>, KernelError> {
        let m = QMatrix {
            format,
            rows,
            cols,
            packed,
            scales,
            biases,
            fp8_nan_codes: false,
            activations: super::Activations::F32,
        };
        m.check()?;
        let fp8_nan_codes =
            matches!(format, Format::Fp8Block { .. }) && packed.iter().any(|&b| b & 0x7F == 0x7F);
        Ok(QMatrix { fp8_nan_codes, ..m })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The same matrix, its products in `activations` (where the format has that arithmetic:
    /// [`super::Activations`]).
    pub fn with_activations(self, activations: super::Activations) -> QMatrix<'a> {
        QMatrix {
            activations,
            ..self
        }
    }

    /// The arithmetic its products use: 8-bit activations only for affine 4- and 8-bit and
    /// MXFP4 matrices asked to, f32 otherwise.
    pub fn activations(&self) -> super::Activations {
        match (self.activations, self.format) {
            (super::Activations::Int8, Format::Affine { bits: 4 | 8, .. } | Format::Mxfp4) => {
                super::Activations::Int8
            }
            _ => super::Activations::F32,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn packed(&self) -> &'a [u8] {
        self.packed
    }

    pub fn scales(&self) -> &'a [u8] {
        self.scales
    }

    pub fn biases(&self) -> &'a [u8] {
        self.biases
    }

    /// Bytes of weights (packed, scales and biases) one full pass over the matrix reads.
    pub fn stored_bytes(&self) -> usize {
        self.packed.len() + self.scales.len() + self.biases.len()
    }

    /// Packed bytes per row.
    pub(crate) fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.cols).packed
    }

    fn check(&self) -> Result<(), KernelError> {
        let shape = |what: &str| KernelError::Shape {
            rows: self.rows,
            cols: self.cols,
            what: what.to_string(),
        };
        if self.rows == 0 || self.cols == 0 {
            return Err(shape("an empty matrix"));
        }
        if !self.cols.is_multiple_of(8) {
            return Err(shape("a reduction length that is not a multiple of 8"));
        }
        // Every byte count below is at most 4 bytes per cell, so this one check keeps them all
        // from overflowing.
        let cells = self
            .rows
            .checked_mul(self.cols)
            .filter(|c| c.checked_mul(4).is_some())
            .ok_or_else(|| shape("a size that overflows"))?;
        let (packed, scales, biases) = match self.format {
            Format::Dense(t) => (cells * t.size(), 0, 0),
            Format::Affine { bits, group, scale } => {
                if bits != 4 && bits != 8 {
                    return Err(shape(&format!(
                        "affine {bits}-bit (4 and 8 are implemented)"
                    )));
                }
                if !matches!(group, 32 | 64 | 128) {
                    return Err(shape(&format!(
                        "affine group {group} (32, 64 and 128 are implemented)"
                    )));
                }
                if !self.cols.is_multiple_of(group) {
                    return Err(shape(&format!(
                        "columns that are not a multiple of the group {group}"
                    )));
                }
                let groups = self.rows * (self.cols / group) * scale.size();
                (cells * bits as usize / 8, groups, groups)
            }
            Format::Mxfp4 => {
                if !self.cols.is_multiple_of(32) {
                    return Err(shape("MXFP4 columns that are not a multiple of 32"));
                }
                (cells / 2, self.rows * self.cols / 32, 0)
            }
            Format::Fp8Block {
                block_rows,
                block_cols,
                scale,
            } => {
                if block_rows == 0 || block_cols == 0 || !block_cols.is_multiple_of(8) {
                    return Err(shape(&format!(
                        "FP8 blocks of {block_rows} x {block_cols} (the width must be a non-zero multiple of 8)"
                    )));
                }
                let grid = self.rows.div_ceil(block_rows) * self.cols.div_ceil(block_cols);
                (cells, grid * scale.size(), 0)
            }
        };
        for (what, expected, actual) in [
            ("packed", packed, self.packed.len()),
            ("scales", scales, self.scales.len()),
            ("biases", biases, self.biases.len()),
        ] {
            if expected != actual {
                return Err(KernelError::Bytes {
                    what,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }
}
