//! The `MNRNTIL1` quantized tile container, versions 1-3.
//!
//! ```text
//! [ header: 16384 bytes, fixed fields + optional per-tile SHA-256 table, zero padded ]
//! [ tile 0: packed | scales | biases (affine only) ]   each sub-region on a 16 KiB boundary
//! [ tile 1: ... ]
//! ```
//!
//! The full specification is `docs/formats/tile-container.md`.

mod check;
mod codes;
mod container;
mod geometry;
mod header;
mod writer;

pub use check::{CHECK_CHUNK, TileCheck, TileCheckError};
pub use codes::{ContentKind, Flags, QuantMode, ScaleDtype};
pub use container::{ContainerSpec, TileContainer, TileError, digest_capacity, hex};
pub use geometry::{Geometry, GeometryError, Layout};
pub use header::RawHeader;
pub use writer::{ContainerWriter, WriteError};

/// The eight bytes every container starts with.
pub const MAGIC: &[u8; 8] = b"MNRNTIL1";

/// The alignment of every tile and sub-region: a constant of the format, never the host's
/// page size (16 KiB is a multiple of both the 4 KiB x86-64 and 16 KiB Apple pages).
pub const ALIGNMENT: u64 = 16384;

/// Every header is this long, padded with zeros; tile 0 starts here.
pub const HEADER_BYTES: u64 = 16384;

/// OCP MX fixes the MXFP4 group at 32 elements.
pub const MXFP4_GROUP: u32 = 32;

/// Where the digest table starts in a version-2 header (right after its 128 fixed bytes).
pub const DIGEST_TABLE_V2: u64 = 128;

/// Where the digest table starts in a version-3 header (right after its 160 fixed bytes).
pub const DIGEST_TABLE_V3: u64 = 160;
