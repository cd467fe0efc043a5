//! Evidence: what a positive verification proved, bound to filesystem objects. Specified in
//! `docs/formats/evidence.md`.

use std::path::{Path, PathBuf};

use minirun_format::tree::{FileDigest, Tree};
use sha2::{Digest as _, Sha256};

use crate::identity::FileIdentity;

/// The schema this build writes and reads.
pub const SCHEMA: &str = "minirun-evidence/1";
/// Where evidence lives, relative to the artifact root (never part of the publication).
pub const EVIDENCE_DIR: &str = ".minirun";
pub const EVIDENCE_FILE: &str = "evidence.json";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DigestRecord {
    pub algorithm: String,
    pub hex: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EvidenceFile {
    pub path: String,
    pub expected_size: u64,
    pub digest: DigestRecord,
    /// Stored in LFS upstream (a weight payload) rather than in git (metadata).
    pub payload: bool,
    pub identity: FileIdentity,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootRecord {
    pub device: u64,
    pub inode: u64,
    /// `statvfs.f_fsid` of the filesystem.
    pub fsid: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Evidence {
    pub schema: String,
    pub repo: String,
    pub revision: String,
    /// SHA-256 over the verified plan (see `tree_identity`).
    pub tree_identity: String,
    /// `full`: every file of the tree was hashed.
    pub mode: String,
    pub root: RootRecord,
    pub files: Vec<EvidenceFile>,
}

/// SHA-256 over `minirun-artifact-digest-plan-v1`, an empty field, then for each file sorted
/// by path: path, decimal size, digest algorithm, digest hex, `1`/`0` payload; each field
/// written as `<byte length>:<bytes>\n`.
pub fn tree_identity(tree: &Tree) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update(format!("{}:", bytes.len()).as_bytes());
        h.update(bytes);
        h.update(b"\n");
    };
    field(b"minirun-artifact-digest-plan-v1");
    field(b"");
    for file in tree.files.values() {
        field(file.path.as_bytes());
        field(file.size.to_string().as_bytes());
        field(file.digest.algorithm().as_bytes());
        field(file.digest.hex().as_bytes());
        field(if is_payload(&file.digest) { b"1" } else { b"0" });
    }
    minirun_format::tile::hex(&h.finalize())
}

pub(crate) fn is_payload(digest: &FileDigest) -> bool {
    matches!(digest, FileDigest::Sha256(_))
}

pub fn evidence_path(root: &Path) -> PathBuf {
    root.join(EVIDENCE_DIR).join(EVIDENCE_FILE)
}

/// Writes `evidence` to `<root>/.minirun/evidence.json` atomically (temp file, fsync, rename).
pub fn write(root: &Path, evidence: &Evidence) -> std::io::Result<PathBuf> {
    let dir = root.join(EVIDENCE_DIR);
    atomic_file::create_dirs_beneath(root, Path::new(EVIDENCE_DIR))?;
    let text = serde_json::to_string_pretty(evidence).map_err(std::io::Error::other)?;
    let path = dir.join(EVIDENCE_FILE);
    atomic_file::write_bytes_with(&path, atomic_file::Options::private(), text.as_bytes())
        .map_err(|e| e.source)?;
    Ok(path)
}

/// Removes held evidence (a failed or aborted verification leaves none behind).
pub fn erase(root: &Path) {
    let _ = std::fs::remove_file(evidence_path(root));
}
