//! Training bytes: the embedded public-domain corpus or files and folders given by the user,
//! split into a training part and a held-out tail, and the seeded stream of batches drawn
//! from the training part.

use std::path::{Path, PathBuf};

use crate::rng::{purpose, stream};

/// The embedded corpus: the King James Version, 4.3 MB (provenance in `data/PROVENANCE.md`).
pub const EMBEDDED_CORPUS: &[u8] = include_bytes!("../data/kjv.txt");

/// Why training data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no training bytes: {0} holds no non-empty file")]
    Empty(String),
}

/// The bytes of every file under `paths` (folders walked recursively, entries sorted by name,
/// hidden entries skipped), concatenated in that order.
pub fn read_paths(paths: &[PathBuf]) -> Result<Vec<u8>, DataError> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    let mut bytes = Vec::new();
    for file in &files {
        let content = std::fs::read(file).map_err(|source| DataError::Unreadable {
            path: file.clone(),
            source,
        })?;
        bytes.extend_from_slice(&content);
    }
    if bytes.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(DataError::Empty(shown.join(", ")));
    }
    Ok(bytes)
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let meta = std::fs::metadata(path).map_err(|source| DataError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_file() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|source| DataError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    entries.sort();
    for entry in entries {
        collect(&entry, files)?;
    }
    Ok(())
}

/// Why a corpus cannot be trained on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorpusError {
    #[error("the corpus is empty")]
    Empty,
    #[error("a training window needs at least one byte to read (--seq 0)")]
    NoWindow,
    #[error(
        "the corpus has {len} bytes: it needs at least one training window of {window} bytes plus the {eval} held-out bytes"
    )]
    TooShort {
        len: usize,
        window: usize,
        eval: usize,
    },
}

/// The corpus, split into a training part and a held-out tail that is never trained on.
#[derive(Debug, Clone)]
pub struct Corpus {
    bytes: Vec<u8>,
    train_len: usize,
}

impl Corpus {
    pub fn new(bytes: Vec<u8>, eval_bytes: usize, seq: usize) -> Result<Self, CorpusError> {
        if bytes.is_empty() {
            return Err(CorpusError::Empty);
        }
        if seq == 0 {
            return Err(CorpusError::NoWindow);
        }
        let window = seq.saturating_add(1);
        let needed = eval_bytes.checked_add(window);
        if needed.is_none_or(|n| bytes.len() < n) || eval_bytes < window {
            return Err(CorpusError::TooShort {
                len: bytes.len(),
                window,
                eval: eval_bytes.max(window),
            });
        }
        Ok(Corpus {
            train_len: bytes.len() - eval_bytes,
            bytes,
        })
    }

    pub fn train(&self) -> &[u8] {
        &self.bytes[..self.train_len]
    }

    pub fn held_out(&self) -> &[u8] {
        &self.bytes[self.train_len..]
    }

    /// The batch of step `step`: `batch` windows of `seq + 1` bytes from the training part,
    /// a pure function of (seed, step) so that a resumed run reads what the uninterrupted
    /// one would have.
    pub fn batch(&self, seed: u64, step: u64, batch: usize, seq: usize) -> Vec<&[u8]> {
        let mut rng = stream(seed, purpose::BATCHES, step);
        let starts = self.train_len - seq;
        (0..batch)
            .map(|_| {
                let start = (rng.next_u64() % starts as u64) as usize;
                &self.bytes[start..start + seq + 1]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    #[test]
    fn the_embedded_corpus_is_the_documented_file() {
        assert!(EMBEDDED_CORPUS.len() >= 1_000_000);
        let digest: String = Sha256::digest(EMBEDDED_CORPUS)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest, "6f74f5589333c56c263963e6347dba662bae2d96861302e690aaae0b4a855eda",
            "see data/PROVENANCE.md"
        );
    }

    #[test]
    fn folders_are_read_in_name_order_and_hidden_files_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("b.txt"), "B").unwrap();
        std::fs::write(dir.path().join("a.txt"), "A").unwrap();
        std::fs::write(dir.path().join("sub/c.txt"), "C").unwrap();
        std::fs::write(dir.path().join(".hidden"), "H").unwrap();
        assert_eq!(read_paths(&[dir.path().to_path_buf()]).unwrap(), b"ABC");
    }
}
