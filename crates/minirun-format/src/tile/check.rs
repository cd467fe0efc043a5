//! Checking a tile in a file: the one implementation behind `minirun info --verify-tiles` and
//! the runtime's tile loads. A tile is confirmed against the SHA-256 its header records, hashed
//! in bounded chunks (a tile may be gigabytes), or, for synthetic content without digests,
//! regenerated from the seed. A checkpoint-derived tile without a recorded digest cannot be
//! confirmed here at all, and saying so is the answer.

use sha2::{Digest, Sha256};

use super::container::{TileContainer, TileError};
use crate::synthetic::{self, RegenerationError};

/// The most bytes of a tile held at once while hashing it.
pub const CHECK_CHUNK: u64 = 4 << 20;

/// How a tile was confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileCheck {
    /// Its SHA-256 equals the header's record.
    Digest,
    /// It equals the synthetic content regenerated from the header's seed.
    Regenerated,
}

impl TileCheck {
    /// How a container's tiles are checked, in words, or why they cannot be.
    pub fn method(container: &TileContainer) -> Result<&'static str, RegenerationError> {
        match (&container.digests, container.content_kind) {
            (Some(_), _) => Ok("SHA-256 against the header's digests"),
            (None, super::ContentKind::SyntheticDeterministic) => {
                Ok("regenerating the synthetic content")
            }
            (None, super::ContentKind::CheckpointDerived) => {
                Err(RegenerationError::CheckpointDerived)
            }
        }
    }
}

/// Why a tile was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum TileCheckError {
    #[error("cannot read the tile: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Tile(#[from] TileError),
    #[error(transparent)]
    Regeneration(#[from] RegenerationError),
}

impl TileContainer {
    /// Checks tile `index`, reading it through `read_at(file_offset, buf)` (which must fill
    /// `buf`); `progress` is told how many bytes each read covered.
    pub fn check_tile_from(
        &self,
        index: u64,
        mut read_at: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
        mut progress: impl FnMut(u64),
    ) -> Result<TileCheck, TileCheckError> {
        TileCheck::method(self)?;
        let range = self.tile_range(index)?;
        let Some(_) = &self.digests else {
            let mut tile = vec![0u8; (range.end - range.start) as usize];
            read_at(range.start, &mut tile)?;
            progress(tile.len() as u64);
            synthetic::regenerate_check(self, index, &tile)?;
            return Ok(TileCheck::Regenerated);
        };
        let expected = self.expected_digest(index)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; CHECK_CHUNK.min(range.end - range.start) as usize];
        // A fixed step: a chunk of zero fails at once instead of looping on the same offset.
        for at in (range.start..range.end).step_by(CHECK_CHUNK as usize) {
            let n = (range.end - at).min(CHECK_CHUNK) as usize;
            read_at(at, &mut buf[..n])?;
            hasher.update(&buf[..n]);
            progress(n as u64);
        }
        self.compare_digest(index, expected, hasher.finalize().into())?;
        Ok(TileCheck::Digest)
    }
}
