//! Evidence held by a reader: files open only through it, rooted and no-follow, with their
//! identity rechecked on every open.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use crate::evidence::{self, Evidence, EvidenceFile};
use crate::root::{OpenError, Root};

/// Why held evidence cannot vouch for a file any more.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no evidence at {path}: run `minirun verify` on the artifact first")]
    NoEvidence { path: String },
    #[error("{path}: unreadable evidence: {reason}")]
    BadEvidence { path: String, reason: String },
    #[error("cannot open the artifact root {path}: {error}")]
    Root { path: String, error: std::io::Error },
    #[error(
        "{path} is no longer the directory that was verified (device, inode or filesystem id changed): run `minirun verify` again"
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
}

impl HeldEvidence {
    /// Loads `<root>/.minirun/evidence.json`, checks the root is the verified directory, and
    /// re-identifies every evidenced file (opening each, reading nothing).
    pub fn load(root_path: &Path) -> Result<HeldEvidence, StoreError> {
        let path = evidence::evidence_path(root_path);
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|_| StoreError::NoEvidence {
            path: shown.clone(),
        })?;
        let evidence: Evidence =
            serde_json::from_str(&text).map_err(|e| StoreError::BadEvidence {
                path: shown.clone(),
                reason: e.to_string(),
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
        let root = Root::open(root_path).map_err(|error| StoreError::Root {
            path: root_path.display().to_string(),
            error,
        })?;
        let now = (root.device(), root.inode(), root.fsid());
        if now
            != (
                evidence.root.device,
                evidence.root.inode,
                evidence.root.fsid,
            )
        {
            return Err(StoreError::RootChanged {
                path: root_path.display().to_string(),
            });
        }
        let files = evidence
            .files
            .iter()
            .map(|f| (f.path.clone(), f.clone()))
            .collect();
        let held = HeldEvidence {
            root,
            evidence,
            files,
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
        let (file, now) = self.root.open_file(path)?;
        let changed = now.changes_from(&record.identity);
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
        self.evidence.mode == "full"
            && self.evidence.repo == repo
            && self.evidence.revision == revision
    }
}
