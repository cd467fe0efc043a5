//! Random checkpoints at any geometry, written in their upstream layouts and storage, for
//! minirun's tests, benchmarks and quickstart: [`tiny_models`] (small DeepSeek-V3, Qwen3-MoE and
//! gpt-oss checkpoints in the MLX layout, of any size), [`deepseek_v4`] and [`kimi_k3`] (the
//! published geometries, cut to their first layers). Not models of anything: their outputs mean
//! nothing, but they are exactly determined by their bytes, which is what a streamed-versus-
//! resident comparison and a byte-for-byte repack need.

pub mod deepseek_v4;
pub mod kimi_k3;
mod safetensors_writer;
pub mod tiny_models;

use std::path::{Path, PathBuf};

/// Why a checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The message carries the I/O error itself (not as a `source`), so that a report of the
    /// error chain says it once.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// safetensors refused to serialize a shard (a tensor's bytes do not match its shape).
    #[error("{}: the shard could not be written: {reason}", path.display())]
    BadShard { path: PathBuf, reason: String },
    /// The upstream config cannot describe the checkpoint asked for.
    #[error("{what}: {reason}")]
    Refused { what: String, reason: String },
}

impl SynthError {
    pub(crate) fn io(path: impl AsRef<Path>, error: std::io::Error) -> Self {
        SynthError::Io {
            path: path.as_ref().to_path_buf(),
            error,
        }
    }
}
