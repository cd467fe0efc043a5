//! Reading tiles through held evidence (ADR 0013). Every load opens the container rooted and
//! no-follow with its identity rechecked, reconciles the file's length with the manifest's
//! byte count and the header's own total, checks the requested geometry against the header
//! before a tile byte is read, and checks the tile's length. Only the tile's SHA-256 is
//! conditional: skipped when the evidence is a full verification of the pinned repository and
//! revision, checked otherwise.

use std::os::unix::fs::FileExt;

use minirun_format::tile::{Geometry, HEADER_BYTES, TileContainer, TileError};

use crate::held::{HeldEvidence, StoreError};

/// What a caller knows about the container it wants.
#[derive(Debug, Clone, Copy)]
pub struct TileRequest<'a> {
    /// The container's path in the artifact.
    pub path: &'a str,
    /// Its size as the unit manifest gives it.
    pub manifest_bytes: u64,
    /// The geometry the caller will decode with.
    pub geometry: Geometry,
    /// The publication the run is pinned to.
    pub repo: &'a str,
    pub revision: &'a str,
}

/// One tile's bytes (its whole stride).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedTile {
    pub bytes: Vec<u8>,
    /// Whether the tile's SHA-256 was checked on this load.
    pub digest_checked: bool,
}

/// Why a tile was not handed out.
#[derive(Debug, thiserror::Error)]
pub enum TileReadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: {what} says {expected} bytes but the file has {actual}")]
    Length {
        path: String,
        what: &'static str,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: {error}")]
    Container { path: String, error: TileError },
    #[error("{path}: the header's geometry {header:?} is not the requested {requested:?}")]
    Geometry {
        path: String,
        header: Box<Geometry>,
        requested: Box<Geometry>,
    },
}

impl HeldEvidence {
    /// Loads tile `index` of the container `request` names.
    pub fn load_tile(
        &self,
        request: &TileRequest<'_>,
        index: u64,
    ) -> Result<LoadedTile, TileReadError> {
        let path = request.path.to_string();
        let io = |error| TileReadError::Io {
            path: path.clone(),
            error,
        };
        let file = self.open(request.path)?;
        let actual = file.metadata().map_err(io)?.len();
        let length = |what, expected| TileReadError::Length {
            path: path.clone(),
            what,
            expected,
            actual,
        };
        if actual != request.manifest_bytes {
            return Err(length("the manifest", request.manifest_bytes));
        }
        let mut header = vec![0u8; HEADER_BYTES.min(actual) as usize];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let container_error = |error| TileReadError::Container {
            path: path.clone(),
            error,
        };
        let container = TileContainer::parse(&header, actual).map_err(container_error)?;
        if container.layout.total_bytes != actual {
            return Err(length("the container header", container.layout.total_bytes));
        }
        if container.geometry != request.geometry {
            return Err(TileReadError::Geometry {
                path,
                header: Box::new(container.geometry),
                requested: Box::new(request.geometry),
            });
        }
        let range = container.tile_range(index).map_err(container_error)?;
        let mut bytes = vec![0u8; (range.end - range.start) as usize];
        file.read_exact_at(&mut bytes, range.start).map_err(io)?;
        let trusted = self.may_skip_tile_digests(request.repo, request.revision);
        let digest_checked = !trusted && container.digests.is_some();
        if digest_checked {
            container
                .verify_tile(index, &bytes)
                .map_err(container_error)?;
        }
        Ok(LoadedTile {
            bytes,
            digest_checked,
        })
    }
}
