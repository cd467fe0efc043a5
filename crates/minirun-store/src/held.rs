//! Evidence held by a reader: files open only through it, rooted and no-follow, with their
//! identity rechecked on every open.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use crate::evidence::{self, Evidence, EvidenceFile, SealedReadError};
use crate::root::{OpenError, Root};
use crate::seal::SealKey;

/// Why held evidence cannot vouch for a file any more.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no evidence at {path}: run `minirun verify` on the artifact first")]
    NoEvidence { path: String },
    #[error("{path}: unreadable evidence: {reason}; run `minirun verify` again to replace it")]
    BadEvidence { path: String, reason: String },
    #[error("{path}: {reason}; run `minirun verify` again")]
    UnsealedEvidence { path: String, reason: String },
    #[error("cannot open the artifact root {path}: {error}")]
    Root { path: String, error: std::io::Error },
    #[error(
        "{path} is no longer the directory that was verified (its inode, or its device and filesystem id on a volume without a stable identity, changed): run `minirun verify` again"
    )]
    RootChanged { path: String },
    #[error("{path} is not in the evidence: only verified files are opened")]
    NotEvidenced { path: String },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(
        "{path} changed since it was verified ({what}): the evidence no longer holds; run `minirun verify` again"
    )]
    Changed { path: String, what: String },
}

/// Evidence loaded for reading, with its root held open.
#[derive(Debug)]
pub struct HeldEvidence {
    root: Root,
    evidence: Evidence,
    files: BTreeMap<String, EvidenceFile>,
    /// The volume came back under another device number (same volume identity): files are
    /// matched on everything but the device number.
    remounted: bool,
}

impl HeldEvidence {
    /// Loads `<root>/.minirun/evidence.json` (rooted, no-follow, bounded), checks its seal
    /// under `key`, checks the root is the verified directory, and re-identifies every
    /// evidenced file (opening each, reading nothing).
    pub fn load(root_path: &Path, key: &SealKey) -> Result<HeldEvidence, StoreError> {
        let shown = evidence::evidence_path(root_path).display().to_string();
        let root = Root::open(root_path).map_err(|error| StoreError::Root {
            path: root_path.display().to_string(),
            error,
        })?;
        let evidence = evidence::read(&root, key).map_err(|e| match e {
            SealedReadError::Absent => StoreError::NoEvidence {
                path: shown.clone(),
            },
            SealedReadError::Unreadable(reason) => StoreError::BadEvidence {
                path: shown.clone(),
                reason,
            },
            SealedReadError::NotSealed { .. } => StoreError::UnsealedEvidence {
                path: shown.clone(),
                reason: e.to_string(),
            },
        })?;
        if evidence.schema != evidence::SCHEMA {
            return Err(StoreError::BadEvidence {
                path: shown,
                reason: format!(
                    "schema {:?}; this build reads {:?}",
                    evidence.schema,
                    evidence::SCHEMA
                ),
            });
        }
        let remounted = match same_root(&evidence.root, &root) {
            Some(remounted) => remounted,
            None => {
                return Err(StoreError::RootChanged {
                    path: root_path.display().to_string(),
                });
            }
        };
        let files = evidence
            .files
            .iter()
            .map(|f| (f.path.clone(), f.clone()))
            .collect();
        let held = HeldEvidence {
            root,
            evidence,
            files,
            remounted,
        };
        for path in held.files.keys() {
            held.open(path)?;
        }
        Ok(held)
    }

    /// The artifact root the evidence holds open.
    pub fn root(&self) -> &Root {
        &self.root
    }

    /// Whether `path` is one of the evidenced files.
    pub fn covers(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }

    /// Opens an evidenced file beneath the held root, refusing it if its identity changed.
    pub fn open(&self, path: &str) -> Result<File, StoreError> {
        let record = self
            .files
            .get(path)
            .ok_or_else(|| StoreError::NotEvidenced {
                path: path.to_string(),
            })?;
        let (file, now) = self.root.open_sole_written(path)?;
        let changed = match self.remounted {
            true => now.changes_on_remounted_volume(&record.identity),
            false => now.changes_from(&record.identity),
        };
        if !changed.is_empty() {
            return Err(StoreError::Changed {
                path: path.to_string(),
                what: changed.join(", "),
            });
        }
        Ok(file)
    }

    /// Whether a tile reader may skip re-hashing tiles (ADR 0013): only when this evidence is
    /// a full verification of the same repository and revision the manifest names. Lengths,
    /// headers and geometry are checked regardless.
    pub fn may_skip_tile_digests(&self, repo: &str, revision: &str) -> bool {
        self.evidence.vouches_for_every_byte()
            && self.evidence.repo == repo
            && self.evidence.revision == revision
    }
}

/// Whether `root` is the directory `recorded` names: `Some(false)` when device, inode and
/// filesystem id are all unchanged; `Some(true)` when only the device number (and with it the
/// fsid of filesystems that derive it from the device) moved but the inode and a recorded
/// volume identity are the same (the remount rule); `None` otherwise.
fn same_root(recorded: &evidence::RootRecord, root: &Root) -> Option<bool> {
    if recorded.inode != root.inode() {
        return None;
    }
    if (recorded.device, recorded.fsid) == (root.device(), root.fsid()) {
        return Some(false);
    }
    let stable = recorded.volume.is_some() && recorded.volume == root.volume();
    stable.then_some(true)
}
