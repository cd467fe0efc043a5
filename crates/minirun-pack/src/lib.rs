//! `minirun pack` and `minirun check`: repack an upstream safetensors checkpoint byte for
//! byte into a minirun artifact, and compare an artifact with its source.

pub mod check;
pub mod checkpoint;
mod k3_names;
pub mod k3_published;
pub mod pack;
pub mod recognize;
pub mod shard;
pub mod v4_published;

pub use check::{CheckError, CheckReport, Difference, check};
pub use pack::{PackOptions, PackSummary, pack};

use std::path::{Path, PathBuf};

/// Why packing or checking failed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The message carries the I/O error itself (not as a `source`), so that a report of the
    /// error chain says it once.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: not a valid safetensors shard: {reason}", path.display())]
    BadShard { path: PathBuf, reason: String },
    #[error("{what}: {reason}")]
    Refused { what: String, reason: String },
}

impl PackError {
    pub(crate) fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        PackError::Io {
            path: path.as_ref().to_path_buf(),
            error,
        }
    }
}

impl From<atomic_file::AtomicWriteError> for PackError {
    fn from(e: atomic_file::AtomicWriteError) -> Self {
        PackError::Io {
            path: e.path,
            error: e.source,
        }
    }
}
