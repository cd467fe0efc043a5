//! The checkpoint of a verification in progress (`DIR/.minirun/verify-checkpoint.json`),
//! rewritten atomically after every file that matched, so that a killed pass resumes and
//! re-hashes only what it had not finished, and only files whose identity is unchanged. It is
//! sealed like the evidence: a checkpoint whose seal does not open under the user's key is
//! ignored, and every file is hashed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::evidence::{self, EVIDENCE_DIR, EvidenceFile};
use crate::root::Root;
use crate::seal::SealKey;

pub const CHECKPOINT_FILE: &str = "verify-checkpoint.json";
const SCHEMA: &str = "minirun-verify-checkpoint/2";
const SEAL_DOMAIN: &str = "minirun-verify-checkpoint-seal/2";

/// What a checkpoint is valid for: the same publication, plan and directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointKey {
    pub repo: String,
    pub revision: String,
    pub tree_identity: String,
    pub root_device: u64,
    pub root_inode: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved {
    schema: String,
    key: CheckpointKey,
    files: Vec<EvidenceFile>,
}

/// The files matched so far, persisted after each.
pub struct Checkpoint {
    path: PathBuf,
    key: CheckpointKey,
    seal_key: SealKey,
    done: Mutex<BTreeMap<String, EvidenceFile>>,
}

pub fn checkpoint_path(root: &Path) -> PathBuf {
    root.join(EVIDENCE_DIR).join(CHECKPOINT_FILE)
}

impl Checkpoint {
    /// The checkpoint for `key`: an earlier one with the same key and a seal that opens under
    /// `seal_key` is taken over; anything else (another publication, another directory,
    /// unreadable, unsealed) starts empty.
    pub fn open(root: &Root, key: CheckpointKey, seal_key: &SealKey) -> Checkpoint {
        let path = checkpoint_path(root.path());
        let relative = format!("{EVIDENCE_DIR}/{CHECKPOINT_FILE}");
        let done = evidence::read_sealed::<Saved>(root, &relative, SEAL_DOMAIN, seal_key)
            .ok()
            .filter(|saved| saved.schema == SCHEMA && saved.key == key)
            .map(|saved| {
                saved
                    .files
                    .into_iter()
                    .map(|f| (f.path.clone(), f))
                    .collect()
            })
            .unwrap_or_default();
        Checkpoint {
            path,
            key,
            seal_key: seal_key.clone(),
            done: Mutex::new(done),
        }
    }

    /// The record of `path` from an earlier pass, if any.
    pub fn earlier(&self, path: &str) -> Option<EvidenceFile> {
        self.done.lock().ok()?.get(path).cloned()
    }

    /// Adds a matched file and rewrites the checkpoint atomically.
    pub fn record(&self, file: EvidenceFile) -> std::io::Result<()> {
        let mut done = self
            .done
            .lock()
            .map_err(|_| std::io::Error::other("the checkpoint lock is poisoned"))?;
        done.insert(file.path.clone(), file);
        let saved = Saved {
            schema: SCHEMA.to_string(),
            key: self.key.clone(),
            files: done.values().cloned().collect(),
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        match (dir.parent(), dir.file_name()) {
            (Some(root), Some(name)) => atomic_file::create_dirs_beneath(root, Path::new(name))?,
            _ => std::fs::create_dir_all(dir)?,
        }
        let bytes = evidence::seal(&saved, SEAL_DOMAIN, &self.seal_key)?;
        atomic_file::write_bytes_with(&self.path, atomic_file::Options::private(), &bytes)
            .map_err(|e| e.source)
    }

    /// Removes the checkpoint (the pass finished, one way or the other).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
