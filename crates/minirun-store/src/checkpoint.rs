//! The checkpoint of a verification in progress (`DIR/.minirun/verify-checkpoint.json`),
//! rewritten atomically after every file that matched, so that a killed pass resumes and
//! re-hashes only what it had not finished, and only files whose identity is unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::evidence::{EVIDENCE_DIR, EvidenceFile};

pub const CHECKPOINT_FILE: &str = "verify-checkpoint.json";
const SCHEMA: &str = "minirun-verify-checkpoint/1";

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
    done: Mutex<BTreeMap<String, EvidenceFile>>,
}

pub fn checkpoint_path(root: &Path) -> PathBuf {
    root.join(EVIDENCE_DIR).join(CHECKPOINT_FILE)
}

impl Checkpoint {
    /// The checkpoint for `key`: an earlier one with the same key is taken over; anything
    /// else (another publication, another directory, unreadable) starts empty.
    pub fn open(root: &Path, key: CheckpointKey) -> Checkpoint {
        let path = checkpoint_path(root);
        let done = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str::<Saved>(&text).ok())
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
        let text = serde_json::to_string(&saved).map_err(std::io::Error::other)?;
        atomic_file::write_bytes_with(&self.path, atomic_file::Options::private(), text.as_bytes())
            .map_err(|e| e.source)
    }

    /// Removes the checkpoint (the pass finished, one way or the other).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
