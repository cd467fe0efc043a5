//! A container's geometry, the rules it must satisfy, and every size derived from it.
//!
//! All arithmetic is checked: a geometry whose sizes overflow a u64 is unsupported, never
//! wrapped into something small that looks valid.

use serde::Serialize;

use super::codes::{ContentKind, Flags, QuantMode, ScaleDtype};
use super::{ALIGNMENT, HEADER_BYTES, MXFP4_GROUP};

/// What one tile holds: `rows` output rows of a matrix with `cols` inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Geometry {
    pub mode: QuantMode,
    /// Output rows per tile (tiling runs along output rows only).
    pub rows: u32,
    /// The full reduction length: a tile never splits it.
    pub cols: u32,
    /// Elements per scale group along a row.
    pub group_size: u32,
    /// Bits per packed element: 4 or 8.
    pub bits: u32,
    pub scale_dtype: ScaleDtype,
    /// Matrix rows one scale covers: 1, or the block height of a 2-D scale grid.
    pub scale_block_rows: u32,
    pub tile_count: u32,
}

/// Why a geometry cannot be served. The rules are checked in the order the variants are
/// listed; `Overflow` can arise at any derivation, so it may come before `Unaligned`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("rows ({rows}) and cols ({cols}) must both be positive")]
    Empty { rows: u32, cols: u32 },
    #[error("a container needs at least one tile")]
    NoTiles,
    #[error("{bits} bits per element: only 4 and 8 are supported")]
    Bits { bits: u32 },
    #[error("group size {group} is not a positive power of two")]
    Group { group: u32 },
    #[error("{mode} requires {requirement}")]
    Mode {
        mode: QuantMode,
        requirement: &'static str,
    },
    #[error("{rows} rows are not a multiple of the {block_rows} rows each scale covers")]
    BlockRows { rows: u32, block_rows: u32 },
    #[error("{cols} cols are not a multiple of the group size {group}")]
    ColsGroup { cols: u32, group: u32 },
    #[error("{cols} cols of {bits}-bit elements do not fill whole 32-bit words")]
    ColsPacking { cols: u32, bits: u32 },
    #[error(
        "the {region} sub-region holds {bytes} bytes, not a multiple of 16384: {mode} sub-regions are \
         never padded, so this geometry cannot be aligned (choose rows x cols that fill whole 16 KiB pages)"
    )]
    Unaligned {
        mode: QuantMode,
        region: &'static str,
        bytes: u64,
    },
    #[error("the sizes of this geometry overflow a 64-bit integer")]
    Overflow,
}

/// Every size derived from a [`Geometry`]; all offsets are relative to a tile's start
/// except `first_tile_offset` and `total_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub packed_bytes: u64,
    pub scale_bytes: u64,
    pub bias_bytes: u64,
    pub packed_region: u64,
    pub scale_region: u64,
    pub bias_region: u64,
    pub scale_offset: u64,
    /// 0 when there are no biases.
    pub bias_offset: u64,
    pub tile_stride: u64,
    pub first_tile_offset: u64,
    pub total_bytes: u64,
}

fn align_up(bytes: u64) -> Option<u64> {
    bytes.checked_next_multiple_of(ALIGNMENT)
}

impl Geometry {
    /// Checks every rule in order and derives the layout.
    pub fn layout(&self) -> Result<Layout, GeometryError> {
        self.check_rules()?;
        let overflow = || GeometryError::Overflow;
        let (rows, cols) = (u64::from(self.rows), u64::from(self.cols));
        let groups_per_row = cols / u64::from(self.group_size);
        let scale_grid_rows = rows / u64::from(self.scale_block_rows);
        let packed_bytes = rows
            .checked_mul(cols)
            .and_then(|v| v.checked_mul(u64::from(self.bits)))
            .ok_or_else(overflow)?
            / 8;
        let scale_bytes = scale_grid_rows
            .checked_mul(groups_per_row)
            .and_then(|v| v.checked_mul(self.scale_dtype.size()))
            .ok_or_else(overflow)?;
        let bias_bytes = if self.mode == QuantMode::Affine {
            scale_bytes
        } else {
            0
        };
        self.check_alignment(packed_bytes, scale_bytes, bias_bytes)?;
        let packed_region = align_up(packed_bytes).ok_or_else(overflow)?;
        let scale_region = align_up(scale_bytes).ok_or_else(overflow)?;
        let bias_region = align_up(bias_bytes).ok_or_else(overflow)?;
        let tile_stride = packed_region
            .checked_add(scale_region)
            .and_then(|v| v.checked_add(bias_region))
            .ok_or_else(overflow)?;
        let total_bytes = tile_stride
            .checked_mul(u64::from(self.tile_count))
            .and_then(|v| v.checked_add(HEADER_BYTES))
            .ok_or_else(overflow)?;
        Ok(Layout {
            packed_bytes,
            scale_bytes,
            bias_bytes,
            packed_region,
            scale_region,
            bias_region,
            scale_offset: packed_region,
            bias_offset: if bias_bytes > 0 {
                packed_region + scale_region
            } else {
                0
            },
            tile_stride,
            first_tile_offset: HEADER_BYTES,
            total_bytes,
        })
    }

    fn check_rules(&self) -> Result<(), GeometryError> {
        if self.rows == 0 || self.cols == 0 {
            return Err(GeometryError::Empty {
                rows: self.rows,
                cols: self.cols,
            });
        }
        if self.tile_count == 0 {
            return Err(GeometryError::NoTiles);
        }
        if self.bits != 4 && self.bits != 8 {
            return Err(GeometryError::Bits { bits: self.bits });
        }
        if !self.group_size.is_power_of_two() {
            return Err(GeometryError::Group {
                group: self.group_size,
            });
        }
        self.check_mode()?;
        if !self.rows.is_multiple_of(self.scale_block_rows) {
            return Err(GeometryError::BlockRows {
                rows: self.rows,
                block_rows: self.scale_block_rows,
            });
        }
        if !self.cols.is_multiple_of(self.group_size) {
            return Err(GeometryError::ColsGroup {
                cols: self.cols,
                group: self.group_size,
            });
        }
        if !self.cols.is_multiple_of(32 / self.bits) {
            return Err(GeometryError::ColsPacking {
                cols: self.cols,
                bits: self.bits,
            });
        }
        Ok(())
    }

    /// The requirements each mode places on group, bits, scale type and block rows.
    fn check_mode(&self) -> Result<(), GeometryError> {
        let mode = self.mode;
        let fail = |requirement| Err(GeometryError::Mode { mode, requirement });
        match mode {
            QuantMode::Mxfp4 if self.group_size != MXFP4_GROUP => {
                fail("group size 32 (fixed by OCP MX)")
            }
            QuantMode::Mxfp4 if self.bits != 4 => fail("4-bit elements"),
            QuantMode::Mxfp4 if self.scale_dtype != ScaleDtype::E8m0 => fail("uint8-e8m0 scales"),
            QuantMode::Affine if self.scale_dtype == ScaleDtype::E8m0 => {
                fail("float scales and biases (float16, bfloat16 or float32), not e8m0")
            }
            QuantMode::Fp8E4m3Block if self.bits != 8 => fail("8-bit elements"),
            QuantMode::Fp8E4m3Block if self.scale_dtype != ScaleDtype::E8m0 => {
                fail("uint8-e8m0 block scales")
            }
            QuantMode::Fp8E4m3Block if self.scale_block_rows <= 1 => {
                fail("a 2-D scale grid: more than one row per scale")
            }
            QuantMode::Mxfp4 | QuantMode::Affine if self.scale_block_rows != 1 => {
                fail("one scale per row and group (scale_block_rows = 1)")
            }
            _ => Ok(()),
        }
    }

    /// mxfp4 and affine sub-regions are never padded: each payload must fill whole
    /// 16 KiB pages. Only the 2-D block mode pads (its scale grid is tiny).
    fn check_alignment(&self, packed: u64, scales: u64, biases: u64) -> Result<(), GeometryError> {
        if self.mode == QuantMode::Fp8E4m3Block {
            return Ok(());
        }
        for (region, bytes) in [("packed", packed), ("scale", scales), ("bias", biases)] {
            if !bytes.is_multiple_of(ALIGNMENT) {
                return Err(GeometryError::Unaligned {
                    mode: self.mode,
                    region,
                    bytes,
                });
            }
        }
        Ok(())
    }

    /// The flags a container of this geometry must carry.
    pub fn derived_flags(&self, with_digests: bool) -> Flags {
        let mut bits = 0;
        if self.mode == QuantMode::Affine {
            bits |= Flags::BIASES;
        }
        if with_digests {
            bits |= Flags::TILE_DIGESTS;
        }
        if self.scale_block_rows > 1 {
            bits |= Flags::BLOCK_SCALES_2D;
        }
        if self.mode == QuantMode::Fp8E4m3Block {
            bits |= Flags::PADDED_SUBREGIONS;
        }
        Flags(bits)
    }

    /// The lowest format version that can express this geometry (one [`Geometry::layout`]
    /// accepts) with this content. FP8, the one mode with a 2-D scale grid, needs version 3.
    /// Version 1 stores no mode, kind, flags or scale type: it reads as synthetic MXFP4
    /// without flags, so checkpoint-derived content or any flag (affine always has biases)
    /// needs version 2.
    pub fn lowest_version(&self, kind: ContentKind, with_digests: bool) -> u32 {
        if self.mode == QuantMode::Fp8E4m3Block {
            3
        } else if kind == ContentKind::CheckpointDerived || self.derived_flags(with_digests).0 != 0
        {
            2
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(mode: QuantMode) -> Geometry {
        let (group_size, bits, scale_dtype, scale_block_rows) = match mode {
            QuantMode::Mxfp4 => (32, 4, ScaleDtype::E8m0, 1),
            QuantMode::Affine => (64, 4, ScaleDtype::Bf16, 1),
            QuantMode::Fp8E4m3Block => (128, 8, ScaleDtype::E8m0, 128),
        };
        let g = Geometry {
            mode,
            rows: 512,
            cols: 1024,
            group_size,
            bits,
            scale_dtype,
            scale_block_rows,
            tile_count: 1,
        };
        g.layout().unwrap();
        g
    }

    /// Version 1 only for synthetic MXFP4 without flags; version 3 for FP8 whatever the rest.
    #[test]
    fn the_lowest_version_is_the_first_that_records_everything() {
        use ContentKind::{CheckpointDerived as Derived, SyntheticDeterministic as Synthetic};
        let cases = [
            (QuantMode::Mxfp4, Synthetic, false, 1),
            (QuantMode::Mxfp4, Synthetic, true, 2),
            (QuantMode::Mxfp4, Derived, false, 2),
            (QuantMode::Affine, Synthetic, false, 2),
            (QuantMode::Affine, Derived, true, 2),
            (QuantMode::Fp8E4m3Block, Synthetic, false, 3),
            (QuantMode::Fp8E4m3Block, Derived, true, 3),
        ];
        for (mode, kind, digests, version) in cases {
            assert_eq!(
                valid(mode).lowest_version(kind, digests),
                version,
                "{mode} {kind} digests {digests}"
            );
        }
    }
}
