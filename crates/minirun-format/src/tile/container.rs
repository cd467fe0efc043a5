//! A validated container header: reading it in the documented order of refusals,
//! writing it as the lowest version that expresses the request, and addressing tiles.

use std::ops::Range;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::codes::{ContentKind, Flags, QuantMode, ScaleDtype};
use super::geometry::{Geometry, GeometryError, Layout};
use super::header::RawHeader;
use super::{DIGEST_TABLE_V2, DIGEST_TABLE_V3, HEADER_BYTES, MAGIC};

/// Why a container (or one of its tiles) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileError {
    #[error(
        "truncated: a tile container starts with a 16384-byte header but only {len} bytes are there"
    )]
    Truncated { len: u64 },
    #[error(
        "not a tile container: it starts with {found:02x?} where a container starts with \"MNRNTIL1\""
    )]
    BadMagic { found: [u8; 8] },
    #[error("unsupported tile container version {found}; this build reads versions 1, 2 and 3")]
    UnsupportedVersion { found: u32 },
    #[error("the header-size field says {found} bytes; every container header is 16384")]
    HeaderSize { found: u32 },
    #[error("unknown quantization mode code {code} (known: 0 mxfp4, 1 affine, 2 fp8-e4m3-block)")]
    UnknownMode { code: u32 },
    #[error(
        "unknown content kind code {code} (known: 0 synthetic-deterministic, 1 checkpoint-derived)"
    )]
    UnknownContentKind { code: u32 },
    #[error(
        "feature flags {flags:#x} set bits this build does not understand ({unknown:#x}); refusing rather than reading on without them"
    )]
    UnknownFlags { flags: u32, unknown: u32 },
    #[error(
        "unknown scale element type code {code} (known: 0 e8m0, 1 float16, 2 bfloat16, 3 float32)"
    )]
    UnknownScaleDtype { code: u32 },
    #[error("reserved header field at offset {offset} holds {value:#x}; it must be 0")]
    ReservedNonZero { offset: u32, value: u64 },
    #[error(
        "the biases flag is {flag} but the mode is {mode}: biases exist exactly in affine mode"
    )]
    BiasFlag { mode: QuantMode, flag: bool },
    #[error(
        "version {version} cannot carry flags {flags:#x}: 2-D block scales and padded sub-regions need version 3"
    )]
    FlagsNeedV3 { version: u32, flags: u32 },
    #[error("digest table offset {found} is wrong for these flags (expected {expected})")]
    DigestTableOffset { found: u64, expected: u64 },
    #[error("{tiles} tile digests do not fit the header (room for {capacity})")]
    DigestTableTooLarge { tiles: u32, capacity: u64 },
    #[error("geometry cannot be served: {0}")]
    Geometry(#[from] GeometryError),
    #[error("header field {field} says {declared} but the geometry derives {derived}")]
    DerivedField {
        field: &'static str,
        declared: u64,
        derived: u64,
    },
    #[error(
        "declared version {declared}, but this content is expressible as version {needed}, the lowest version, which is the one a writer must emit"
    )]
    VersionTooHigh { declared: u32, needed: u32 },
    #[error(
        "declared flags {declared:#x} differ from the flags this content requires ({derived:#x})"
    )]
    FlagsMismatch { declared: u32, derived: u32 },
    #[error("the file is {len} bytes but the header's geometry needs {needed}: truncated")]
    FileTooShort { len: u64, needed: u64 },
    #[error("tile {index} does not exist: the container has {count} tiles")]
    NoSuchTile { index: u64, count: u32 },
    #[error("tile {index} is {actual} bytes; the stride is {expected}")]
    TileLength {
        index: u64,
        expected: u64,
        actual: u64,
    },
    #[error(
        "this container carries no tile digests (flag 0x2 unset); its tiles can only be checked against an external digest"
    )]
    NoDigests,
    #[error(
        "SHA-256 {actual} of tile {index} differs from the header's record {expected}: the tile is corrupt"
    )]
    DigestMismatch {
        index: u64,
        expected: String,
        actual: String,
    },
    #[error("{count} digests were given for {tiles} tiles")]
    DigestCount { count: usize, tiles: u32 },
}

/// What a writer is asked to produce: everything the header states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub geometry: Geometry,
    pub content_kind: ContentKind,
    /// The seed of synthetic content; 0 for checkpoint bytes.
    pub seed: u64,
    /// One SHA-256 per tile (over the tile's whole stride), or none.
    pub digests: Option<Vec<[u8; 32]>>,
}

/// A header that passed every check, with its derived layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TileContainer {
    pub version: u32,
    pub geometry: Geometry,
    pub content_kind: ContentKind,
    /// False for version 1, which cannot state its content kind (it is implied synthetic).
    pub content_kind_declared: bool,
    pub flags: Flags,
    pub seed: u64,
    pub layout: Layout,
    #[serde(serialize_with = "hex_digests")]
    pub digests: Option<Vec<[u8; 32]>>,
}

fn hex_digests<S: serde::Serializer>(d: &Option<Vec<[u8; 32]>>, s: S) -> Result<S::Ok, S::Error> {
    let hexes: Option<Vec<String>> = d.as_ref().map(|v| v.iter().map(|x| hex(x)).collect());
    serde::Serialize::serialize(&hexes, s)
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest_table_start(version: u32) -> u64 {
    if version >= 3 {
        DIGEST_TABLE_V3
    } else {
        DIGEST_TABLE_V2
    }
}

/// How many digests fit between the table start and the end of the header.
pub fn digest_capacity(version: u32) -> u64 {
    (HEADER_BYTES - digest_table_start(version)) / 32
}

impl ContainerSpec {
    /// Validates the request and returns the header bytes (16384) and the container it
    /// describes. The version is the lowest that expresses the request; flags are derived.
    pub fn encode_header(&self) -> Result<(Vec<u8>, TileContainer), TileError> {
        let g = &self.geometry;
        let layout = g.layout()?;
        if let Some(d) = &self.digests
            && d.len() != g.tile_count as usize
        {
            return Err(TileError::DigestCount {
                count: d.len(),
                tiles: g.tile_count,
            });
        }
        let with_digests = self.digests.is_some();
        let version = g.lowest_version(self.content_kind, with_digests);
        let flags = g.derived_flags(with_digests);
        let table = if with_digests {
            digest_table_start(version)
        } else {
            0
        };
        if with_digests && u64::from(g.tile_count) > digest_capacity(version) {
            return Err(TileError::DigestTableTooLarge {
                tiles: g.tile_count,
                capacity: digest_capacity(version),
            });
        }
        let raw = RawHeader {
            magic: *MAGIC,
            version,
            header_bytes: HEADER_BYTES as u32,
            tile_count: g.tile_count,
            rows: g.rows,
            cols: g.cols,
            group_size: g.group_size,
            packed_bytes: layout.packed_bytes,
            scale_bytes: layout.scale_bytes,
            scale_offset: layout.scale_offset,
            tile_stride: layout.tile_stride,
            first_tile_offset: layout.first_tile_offset,
            seed: self.seed,
            mode: g.mode.code(),
            bits: g.bits,
            content_kind: self.content_kind.code(),
            flags: flags.0,
            bias_bytes: layout.bias_bytes,
            bias_offset: layout.bias_offset,
            digest_table_offset: table,
            scale_dtype: g.scale_dtype.code(),
            scale_block_rows: g.scale_block_rows,
            packed_region: layout.packed_region,
            scale_region: layout.scale_region,
            ..RawHeader::default()
        };
        let digests = self.digests.clone();
        let bytes = raw.encode(digests.as_deref().unwrap_or(&[]));
        let container = TileContainer {
            version,
            geometry: *g,
            content_kind: self.content_kind,
            content_kind_declared: version >= 2,
            flags,
            seed: self.seed,
            layout,
            digests,
        };
        Ok((bytes, container))
    }
}

impl TileContainer {
    /// Validates a container from its first bytes (at least the 16384-byte header) and
    /// the total file length, in the documented order of refusals.
    pub fn parse(header: &[u8], file_len: u64) -> Result<TileContainer, TileError> {
        if (header.len() as u64) < HEADER_BYTES || file_len < HEADER_BYTES {
            return Err(TileError::Truncated {
                len: file_len.min(header.len() as u64),
            });
        }
        let raw = RawHeader::read(header);
        check_identity(&raw)?;
        let (mode, kind, scale_dtype) = decode_codes(&raw)?;
        check_reserved_and_flags(&raw, mode)?;
        let geometry = Geometry {
            mode,
            rows: raw.rows,
            cols: raw.cols,
            group_size: raw.group_size,
            bits: if raw.version == 1 { 4 } else { raw.bits },
            scale_dtype,
            scale_block_rows: if raw.version >= 3 {
                raw.scale_block_rows
            } else {
                1
            },
            tile_count: raw.tile_count,
        };
        let with_digests = Flags(raw.flags).has(Flags::TILE_DIGESTS);
        check_digest_table(&raw, with_digests)?;
        let layout = geometry.layout()?;
        check_derived(&raw, &layout)?;
        let needed = geometry.lowest_version(kind, with_digests);
        if raw.version != needed {
            return Err(TileError::VersionTooHigh {
                declared: raw.version,
                needed,
            });
        }
        let derived = geometry.derived_flags(with_digests);
        if raw.flags != derived.0 {
            return Err(TileError::FlagsMismatch {
                declared: raw.flags,
                derived: derived.0,
            });
        }
        if file_len < layout.total_bytes {
            return Err(TileError::FileTooShort {
                len: file_len,
                needed: layout.total_bytes,
            });
        }
        Ok(TileContainer {
            version: raw.version,
            geometry,
            content_kind: kind,
            content_kind_declared: raw.version >= 2,
            flags: derived,
            seed: raw.seed,
            layout,
            digests: with_digests.then(|| read_digests(header, &raw)),
        })
    }

    /// Byte range of tile `index` in the file (its whole stride, padding included).
    pub fn tile_range(&self, index: u64) -> Result<Range<u64>, TileError> {
        if index >= u64::from(self.geometry.tile_count) {
            return Err(TileError::NoSuchTile {
                index,
                count: self.geometry.tile_count,
            });
        }
        // parse() proved first + count * stride fits in a u64.
        let start = self.layout.first_tile_offset + index * self.layout.tile_stride;
        Ok(start..start + self.layout.tile_stride)
    }

    /// Byte range of tile `index`'s packed payload.
    pub fn packed_range(&self, index: u64) -> Result<Range<u64>, TileError> {
        let start = self.tile_range(index)?.start;
        Ok(start..start + self.layout.packed_bytes)
    }

    /// Byte range of tile `index`'s scale payload.
    pub fn scale_range(&self, index: u64) -> Result<Range<u64>, TileError> {
        let start = self.tile_range(index)?.start + self.layout.scale_offset;
        Ok(start..start + self.layout.scale_bytes)
    }

    /// Byte range of tile `index`'s bias payload, if the container has biases.
    pub fn bias_range(&self, index: u64) -> Result<Option<Range<u64>>, TileError> {
        let start = self.tile_range(index)?.start + self.layout.bias_offset;
        Ok((self.layout.bias_bytes > 0).then(|| start..start + self.layout.bias_bytes))
    }

    /// Checks the bytes of tile `index` (its whole stride) against the recorded SHA-256.
    pub fn verify_tile(&self, index: u64, tile: &[u8]) -> Result<(), TileError> {
        let expected = self.expected_digest(index)?;
        if tile.len() as u64 != self.layout.tile_stride {
            return Err(TileError::TileLength {
                index,
                expected: self.layout.tile_stride,
                actual: tile.len() as u64,
            });
        }
        self.compare_digest(index, expected, Sha256::digest(tile).into())
    }

    /// The one comparison of a tile's SHA-256 with the header's record, for tiles hashed whole
    /// ([`verify_tile`](Self::verify_tile)) or in chunks (`check_tile_from`).
    pub(crate) fn compare_digest(
        &self,
        index: u64,
        expected: [u8; 32],
        actual: [u8; 32],
    ) -> Result<(), TileError> {
        if actual != expected {
            return Err(TileError::DigestMismatch {
                index,
                expected: hex(&expected),
                actual: hex(&actual),
            });
        }
        Ok(())
    }

    /// The recorded SHA-256 of tile `index`.
    pub fn expected_digest(&self, index: u64) -> Result<[u8; 32], TileError> {
        self.tile_range(index)?;
        let digests = self.digests.as_ref().ok_or(TileError::NoDigests)?;
        digests
            .get(index as usize)
            .copied()
            .ok_or(TileError::NoSuchTile {
                index,
                count: self.geometry.tile_count,
            })
    }
}

/// Steps 2-4: magic, version, header size.
fn check_identity(raw: &RawHeader) -> Result<(), TileError> {
    if !raw.has_magic() {
        return Err(TileError::BadMagic { found: raw.magic });
    }
    if !(1..=3).contains(&raw.version) {
        return Err(TileError::UnsupportedVersion { found: raw.version });
    }
    if u64::from(raw.header_bytes) != HEADER_BYTES {
        return Err(TileError::HeaderSize {
            found: raw.header_bytes,
        });
    }
    Ok(())
}

/// Step 5: the codes; version 1 implies mxfp4, synthetic content and e8m0 scales.
fn decode_codes(raw: &RawHeader) -> Result<(QuantMode, ContentKind, ScaleDtype), TileError> {
    if raw.version == 1 {
        return Ok((
            QuantMode::Mxfp4,
            ContentKind::SyntheticDeterministic,
            ScaleDtype::E8m0,
        ));
    }
    let mode = QuantMode::from_code(raw.mode).ok_or(TileError::UnknownMode { code: raw.mode })?;
    let kind = ContentKind::from_code(raw.content_kind).ok_or(TileError::UnknownContentKind {
        code: raw.content_kind,
    })?;
    let unknown = raw.flags & !Flags::KNOWN;
    if unknown != 0 {
        return Err(TileError::UnknownFlags {
            flags: raw.flags,
            unknown,
        });
    }
    let scale = ScaleDtype::from_code(raw.scale_dtype).ok_or(TileError::UnknownScaleDtype {
        code: raw.scale_dtype,
    })?;
    Ok((mode, kind, scale))
}

/// Steps 5-6, as the reference orders them: reserved@124, the bias flag, then the v3
/// reserved fields and the flags version 2 cannot carry.
fn check_reserved_and_flags(raw: &RawHeader, mode: QuantMode) -> Result<(), TileError> {
    if raw.version == 1 {
        return Ok(());
    }
    if raw.reserved_124 != 0 {
        return Err(TileError::ReservedNonZero {
            offset: 124,
            value: raw.reserved_124.into(),
        });
    }
    let bias_flag = Flags(raw.flags).has(Flags::BIASES);
    if bias_flag != (mode == QuantMode::Affine) {
        return Err(TileError::BiasFlag {
            mode,
            flag: bias_flag,
        });
    }
    if raw.reserved_148 != 0 {
        return Err(TileError::ReservedNonZero {
            offset: 148,
            value: raw.reserved_148.into(),
        });
    }
    if raw.reserved_152 != 0 {
        return Err(TileError::ReservedNonZero {
            offset: 152,
            value: raw.reserved_152,
        });
    }
    let v3_only = Flags::BLOCK_SCALES_2D | Flags::PADDED_SUBREGIONS;
    if raw.version == 2 && raw.flags & v3_only != 0 {
        return Err(TileError::FlagsNeedV3 {
            version: raw.version,
            flags: raw.flags,
        });
    }
    Ok(())
}

/// Step 7: the table sits right after the fixed fields when the flag is set, else 0.
fn check_digest_table(raw: &RawHeader, with_digests: bool) -> Result<(), TileError> {
    let expected = if with_digests {
        digest_table_start(raw.version)
    } else {
        0
    };
    if raw.digest_table_offset != expected {
        return Err(TileError::DigestTableOffset {
            found: raw.digest_table_offset,
            expected,
        });
    }
    if with_digests && u64::from(raw.tile_count) > digest_capacity(raw.version) {
        return Err(TileError::DigestTableTooLarge {
            tiles: raw.tile_count,
            capacity: digest_capacity(raw.version),
        });
    }
    Ok(())
}

/// Step 9: every stored size equals its re-derivation from the geometry.
fn check_derived(raw: &RawHeader, layout: &Layout) -> Result<(), TileError> {
    let mut pairs = vec![
        ("packed_bytes", raw.packed_bytes, layout.packed_bytes),
        ("scale_bytes", raw.scale_bytes, layout.scale_bytes),
        ("scale_offset", raw.scale_offset, layout.scale_offset),
        ("tile_stride", raw.tile_stride, layout.tile_stride),
        (
            "first_tile_offset",
            raw.first_tile_offset,
            layout.first_tile_offset,
        ),
    ];
    if raw.version >= 2 {
        pairs.push(("bias_bytes", raw.bias_bytes, layout.bias_bytes));
        pairs.push(("bias_offset", raw.bias_offset, layout.bias_offset));
    }
    if raw.version >= 3 {
        pairs.push(("packed_region", raw.packed_region, layout.packed_region));
        pairs.push(("scale_region", raw.scale_region, layout.scale_region));
    }
    match pairs
        .into_iter()
        .find(|(_, declared, derived)| declared != derived)
    {
        Some((field, declared, derived)) => Err(TileError::DerivedField {
            field,
            declared,
            derived,
        }),
        None => Ok(()),
    }
}

/// The table was proved to fit the 16384-byte header, which `header` holds.
fn read_digests(header: &[u8], raw: &RawHeader) -> Vec<[u8; 32]> {
    let start = raw.digest_table_offset as usize;
    (0..raw.tile_count as usize)
        .map(|i| {
            let mut d = [0u8; 32];
            if let Some(src) = header.get(start + 32 * i..start + 32 * (i + 1)) {
                d.copy_from_slice(src);
            }
            d
        })
        .collect()
}
