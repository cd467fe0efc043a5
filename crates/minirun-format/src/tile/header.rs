//! The 16 KiB container header: the raw little-endian fields at their fixed offsets, read
//! from and written to bytes without judging them. Validation lives in `container.rs`.
//!
//! | off | width | field                                   | versions |
//! |-----|-------|-----------------------------------------|----------|
//! | 0   | 8     | magic `MNRNTIL1`                        | all      |
//! | 8   | 4     | format version                          | all      |
//! | 12  | 4     | header bytes (16384)                    | all      |
//! | 16  | 4     | tile count                              | all      |
//! | 20  | 4     | rows per tile                           | all      |
//! | 24  | 4     | cols                                    | all      |
//! | 28  | 4     | group size                              | all      |
//! | 32  | 8     | packed bytes per tile                   | all      |
//! | 40  | 8     | scale bytes per tile                    | all      |
//! | 48  | 8     | scale offset in tile                    | all      |
//! | 56  | 8     | tile stride                             | all      |
//! | 64  | 8     | first tile offset (16384)               | all      |
//! | 72  | 8     | seed (synthetic content)                | all      |
//! | 80  | 4     | quant mode                              | v2+      |
//! | 84  | 4     | bits                                    | v2+      |
//! | 88  | 4     | content kind                            | v2+      |
//! | 92  | 4     | feature flags                           | v2+      |
//! | 96  | 8     | bias bytes per tile                     | v2+      |
//! | 104 | 8     | bias offset in tile                     | v2+      |
//! | 112 | 8     | digest table offset (0, 128 or 160)     | v2+      |
//! | 120 | 4     | scale dtype                             | v2+      |
//! | 124 | 4     | reserved, 0                             | v2+      |
//! | 128 | 4     | scale block rows                        | v3       |
//! | 132 | 8     | packed region bytes                     | v3       |
//! | 140 | 8     | scale region bytes                      | v3       |
//! | 148 | 4     | reserved, 0                             | v3       |
//! | 152 | 8     | reserved, 0                             | v3       |

use super::{HEADER_BYTES, MAGIC};

/// Every fixed field as stored; fields a version does not have read as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_bytes: u32,
    pub tile_count: u32,
    pub rows: u32,
    pub cols: u32,
    pub group_size: u32,
    pub packed_bytes: u64,
    pub scale_bytes: u64,
    pub scale_offset: u64,
    pub tile_stride: u64,
    pub first_tile_offset: u64,
    pub seed: u64,
    pub mode: u32,
    pub bits: u32,
    pub content_kind: u32,
    pub flags: u32,
    pub bias_bytes: u64,
    pub bias_offset: u64,
    pub digest_table_offset: u64,
    pub scale_dtype: u32,
    pub reserved_124: u32,
    pub scale_block_rows: u32,
    pub packed_region: u64,
    pub scale_region: u64,
    pub reserved_148: u32,
    pub reserved_152: u64,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    if let Some(src) = bytes.get(at..at + 4) {
        word.copy_from_slice(src);
    }
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(src) = bytes.get(at..at + 8) {
        word.copy_from_slice(src);
    }
    u64::from_le_bytes(word)
}

impl RawHeader {
    /// Reads the fixed fields of `version` from `bytes` (the first 160 bytes suffice);
    /// fields the version lacks are left 0. Missing bytes read as 0.
    pub fn read(bytes: &[u8]) -> RawHeader {
        let mut magic = [0u8; 8];
        if let Some(src) = bytes.get(..8) {
            magic.copy_from_slice(src);
        }
        let version = u32_at(bytes, 8);
        let mut h = RawHeader {
            magic,
            version,
            header_bytes: u32_at(bytes, 12),
            tile_count: u32_at(bytes, 16),
            rows: u32_at(bytes, 20),
            cols: u32_at(bytes, 24),
            group_size: u32_at(bytes, 28),
            packed_bytes: u64_at(bytes, 32),
            scale_bytes: u64_at(bytes, 40),
            scale_offset: u64_at(bytes, 48),
            tile_stride: u64_at(bytes, 56),
            first_tile_offset: u64_at(bytes, 64),
            seed: u64_at(bytes, 72),
            ..RawHeader::default()
        };
        if version >= 2 {
            h.mode = u32_at(bytes, 80);
            h.bits = u32_at(bytes, 84);
            h.content_kind = u32_at(bytes, 88);
            h.flags = u32_at(bytes, 92);
            h.bias_bytes = u64_at(bytes, 96);
            h.bias_offset = u64_at(bytes, 104);
            h.digest_table_offset = u64_at(bytes, 112);
            h.scale_dtype = u32_at(bytes, 120);
            h.reserved_124 = u32_at(bytes, 124);
        }
        if version >= 3 {
            h.scale_block_rows = u32_at(bytes, 128);
            h.packed_region = u64_at(bytes, 132);
            h.scale_region = u64_at(bytes, 140);
            h.reserved_148 = u32_at(bytes, 148);
            h.reserved_152 = u64_at(bytes, 152);
        }
        h
    }

    /// The 16384-byte header: the fields of `self.version`, then `digests` at
    /// `digest_table_offset` if any, zeros everywhere else.
    pub(crate) fn encode(self, digests: &[[u8; 32]]) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_BYTES as usize];
        let mut put = |at: usize, field: &[u8]| out[at..at + field.len()].copy_from_slice(field);
        put(0, &self.magic);
        put(8, &self.version.to_le_bytes());
        put(12, &self.header_bytes.to_le_bytes());
        put(16, &self.tile_count.to_le_bytes());
        put(20, &self.rows.to_le_bytes());
        put(24, &self.cols.to_le_bytes());
        put(28, &self.group_size.to_le_bytes());
        put(32, &self.packed_bytes.to_le_bytes());
        put(40, &self.scale_bytes.to_le_bytes());
        put(48, &self.scale_offset.to_le_bytes());
        put(56, &self.tile_stride.to_le_bytes());
        put(64, &self.first_tile_offset.to_le_bytes());
        put(72, &self.seed.to_le_bytes());
        if self.version >= 2 {
            put(80, &self.mode.to_le_bytes());
            put(84, &self.bits.to_le_bytes());
            put(88, &self.content_kind.to_le_bytes());
            put(92, &self.flags.to_le_bytes());
            put(96, &self.bias_bytes.to_le_bytes());
            put(104, &self.bias_offset.to_le_bytes());
            put(112, &self.digest_table_offset.to_le_bytes());
            put(120, &self.scale_dtype.to_le_bytes());
            put(124, &self.reserved_124.to_le_bytes());
        }
        if self.version >= 3 {
            put(128, &self.scale_block_rows.to_le_bytes());
            put(132, &self.packed_region.to_le_bytes());
            put(140, &self.scale_region.to_le_bytes());
            put(148, &self.reserved_148.to_le_bytes());
            put(152, &self.reserved_152.to_le_bytes());
        }
        let table = self.digest_table_offset as usize;
        for (i, digest) in digests.iter().enumerate() {
            put(table + 32 * i, digest);
        }
        out
    }

    /// Whether the magic is `MNRNTIL1`.
    pub fn has_magic(&self) -> bool {
        &self.magic == MAGIC
    }
}
