//! Writing a container tile by tile. Without digests the header is known up front and the
//! file is written strictly in order; with digests the header, which records each tile's
//! SHA-256, is written last over a zeroed placeholder, so tiles still stream through once.

use std::io::{self, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

use super::HEADER_BYTES;
use super::codes::ContentKind;
use super::container::{ContainerSpec, TileContainer, TileError};
use super::geometry::{Geometry, Layout};

/// Why writing a container failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Tile(#[from] TileError),
    #[error("writing the container: {0}")]
    Io(#[from] io::Error),
    #[error("tile {tile}: the {region} payload is {actual} bytes; this geometry needs {expected}")]
    SubRegion {
        tile: u32,
        region: &'static str,
        expected: u64,
        actual: u64,
    },
    #[error("{written} tiles were written but the geometry declares {declared}")]
    TileCount { written: u32, declared: u32 },
    #[error("all {declared} tiles the geometry declares are already written")]
    TooManyTiles { declared: u32 },
}

/// Streams the tiles of one container into `out`, starting at `out`'s current position
/// (normally the start of a new, empty file).
pub struct ContainerWriter<W: Write + Seek> {
    out: W,
    /// Where the header goes: `out`'s position when the writer was made.
    start: u64,
    spec: ContainerSpec,
    layout: Layout,
    digests: Vec<[u8; 32]>,
    written: u32,
}

impl<W: Write + Seek> ContainerWriter<W> {
    /// Validates the request (geometry, version, digest-table room) and writes the header:
    /// the final one when no digests are requested (so the output is written strictly in
    /// order), else a zeroed placeholder that [`finish`](Self::finish) replaces. Nothing is
    /// written when the request is refused.
    pub fn new(
        mut out: W,
        geometry: Geometry,
        content_kind: ContentKind,
        seed: u64,
        with_digests: bool,
    ) -> Result<Self, WriteError> {
        let placeholder_digests =
            with_digests.then(|| vec![[0u8; 32]; geometry.tile_count as usize]);
        let spec = ContainerSpec {
            geometry,
            content_kind,
            seed,
            digests: placeholder_digests,
        };
        let (header, container) = spec.encode_header()?;
        let start = out.stream_position()?;
        if with_digests {
            out.write_all(&vec![0u8; HEADER_BYTES as usize])?;
        } else {
            out.write_all(&header)?;
        }
        Ok(ContainerWriter {
            out,
            start,
            spec,
            layout: container.layout,
            digests: Vec::new(),
            written: 0,
        })
    }

    /// Appends one tile from its sub-region payloads (biases exactly in affine mode), each
    /// zero-padded to its 16 KiB region.
    pub fn push_tile(
        &mut self,
        packed: &[u8],
        scales: &[u8],
        biases: &[u8],
    ) -> Result<(), WriteError> {
        let tile = self.written;
        if tile >= self.spec.geometry.tile_count {
            return Err(WriteError::TileCount {
                written: tile + 1,
                declared: self.spec.geometry.tile_count,
            });
        }
        let l = self.layout;
        let regions = [
            ("packed", packed, l.packed_bytes, l.packed_region),
            ("scale", scales, l.scale_bytes, l.scale_region),
            ("bias", biases, l.bias_bytes, l.bias_region),
        ];
        for (region, bytes, expected, _) in regions {
            if bytes.len() as u64 != expected {
                return Err(WriteError::SubRegion {
                    tile,
                    region,
                    expected,
                    actual: bytes.len() as u64,
                });
            }
        }
        let mut hasher = self.spec.digests.is_some().then(Sha256::new);
        for (_, bytes, payload, region) in regions {
            let padding = vec![0u8; (region - payload) as usize];
            for part in [bytes, &padding[..]] {
                if let Some(h) = hasher.as_mut() {
                    h.update(part);
                }
                self.out.write_all(part)?;
            }
        }
        if let Some(h) = hasher {
            self.digests.push(h.finalize().into());
        }
        self.written += 1;
        Ok(())
    }

    /// Writes the final header (with the digests, if requested) and returns the output and
    /// the container as a reader will see it.
    pub fn finish(mut self) -> Result<(W, TileContainer), WriteError> {
        let declared = self.spec.geometry.tile_count;
        if self.written != declared {
            return Err(WriteError::TileCount {
                written: self.written,
                declared,
            });
        }
        if self.spec.digests.is_none() {
            let (_, container) = self.spec.encode_header()?;
            self.out.flush()?;
            return Ok((self.out, container));
        }
        self.spec.digests = Some(std::mem::take(&mut self.digests));
        let (header, container) = self.spec.encode_header()?;
        let end = self.out.stream_position()?;
        self.out.seek(SeekFrom::Start(self.start))?;
        self.out.write_all(&header)?;
        self.out.seek(SeekFrom::Start(end))?;
        self.out.flush()?;
        Ok((self.out, container))
    }
}
