//! Evidence: what a positive verification proved, bound to filesystem objects. Specified in
//! `docs/formats/evidence.md`.

use std::path::{Path, PathBuf};

use minirun_format::tree::{FileDigest, Tree};
use sha2::{Digest as _, Sha256};

use crate::identity::FileIdentity;
use crate::root::Root;
use crate::seal::SealKey;

/// The schema this build writes and reads.
pub const SCHEMA: &str = "minirun-evidence/2";
/// What the seal of an evidence file is computed under (see `docs/formats/evidence.md`).
const SEAL_DOMAIN: &str = "minirun-evidence-seal/2";
/// Far above the evidence of any published artifact (about 300 bytes per file).
pub const MAX_EVIDENCE_BYTES: u64 = 64 << 20;
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
    /// Set for a file the publication does not hold, verified instead against the upstream
    /// repository its `index.json` names (see [`Origin`]); absent for the publication's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

/// The repository and pinned revision whose tree a file outside the publication was verified
/// against: the single upstream the publication's own (verified) `index.json` names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    pub repo: String,
    pub revision: String,
}

/// Who signed the statement a `signed` pass verified against, as the allowed-signers file the
/// verifier trusted names them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SignerRecord {
    /// The principals of the allowed-signers line that holds the key.
    pub principals: String,
    /// The key's `SHA256:...` fingerprint.
    pub fingerprint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootRecord {
    pub device: u64,
    pub inode: u64,
    /// `statvfs.f_fsid` of the filesystem.
    pub fsid: u64,
    /// The volume's own identity, where the filesystem has one that survives an unmount and
    /// a remount (see [`Root::volume`]); `None` where it has not.
    pub volume: Option<String>,
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
    /// Set on `signed` evidence only; absent (not `null`) otherwise, so evidence written
    /// before the field existed still opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<SignerRecord>,
}

impl Evidence {
    /// Whether every byte of the artifact was hashed against digests a publisher vouches for
    /// (its published tree, or its signed statement and the manifests that statement covers):
    /// only then may a reader skip re-hashing tiles.
    pub fn vouches_for_every_byte(&self) -> bool {
        matches!(self.mode.as_str(), "full" | "signed")
    }
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

/// A record and the user's seal over it, as stored on disk: `{"sealed": {...}, "seal": hex}`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored<T> {
    sealed: T,
    seal: String,
}

/// Why stored sealed JSON could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SealedReadError {
    #[error("absent")]
    Absent,
    #[error("{0}")]
    Unreadable(String),
    #[error(
        "its seal does not open with this user's evidence key {key}: it was not written by `minirun verify` run as this user (edited, copied from elsewhere, or planted)"
    )]
    NotSealed { key: String },
}

/// Serializes `record` sealed under `domain`.
pub(crate) fn seal<T: serde::Serialize>(
    record: &T,
    domain: &str,
    key: &SealKey,
) -> std::io::Result<Vec<u8>> {
    let body = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let stored = Stored {
        sealed: record,
        seal: key.seal(domain, &body),
    };
    serde_json::to_vec_pretty(&stored).map_err(std::io::Error::other)
}

/// Reads `relative` beneath `root` (rooted, no-follow, bounded) and returns its record if the
/// seal over the record's compact serialization opens under `key`.
pub(crate) fn read_sealed<T>(
    root: &Root,
    relative: &str,
    domain: &str,
    key: &SealKey,
) -> Result<T, SealedReadError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    match root.entry_kind(relative) {
        Ok(crate::root::EntryKind::Absent) => return Err(SealedReadError::Absent),
        Ok(_) => {}
        Err(e) => return Err(SealedReadError::Unreadable(e.to_string())),
    }
    let unreadable = |e: &dyn std::fmt::Display| SealedReadError::Unreadable(e.to_string());
    let (file, _) = root.open_file(relative).map_err(|e| unreadable(&e))?;
    let bytes = regular_file::read_at_most(file, MAX_EVIDENCE_BYTES)
        .map_err(|e| unreadable(&e))?
        .ok_or_else(|| {
            SealedReadError::Unreadable(format!("it is larger than {MAX_EVIDENCE_BYTES} bytes"))
        })?;
    let stored: Stored<T> = serde_json::from_slice(&bytes).map_err(|e| {
        // Evidence of an older minirun is a bare record with its schema at the top level.
        let older = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("schema")?.as_str().map(str::to_string));
        match older {
            Some(schema) => SealedReadError::Unreadable(format!(
                "it is in the format of an older minirun ({schema:?}), which carries no seal"
            )),
            None => unreadable(&e),
        }
    })?;
    let body = serde_json::to_vec(&stored.sealed).map_err(|e| unreadable(&e))?;
    if !key.opens(domain, &body, &stored.seal) {
        return Err(SealedReadError::NotSealed {
            key: key.path().display().to_string(),
        });
    }
    Ok(stored.sealed)
}

/// The held evidence under `root`, if its seal opens under `key`.
pub fn read(root: &Root, key: &SealKey) -> Result<Evidence, SealedReadError> {
    read_sealed(
        root,
        &format!("{EVIDENCE_DIR}/{EVIDENCE_FILE}"),
        SEAL_DOMAIN,
        key,
    )
}

/// Writes `evidence` sealed under `key` to `<root>/.minirun/evidence.json` atomically (temp
/// file, fsync, rename).
pub fn write(root: &Path, evidence: &Evidence, key: &SealKey) -> std::io::Result<PathBuf> {
    let dir = root.join(EVIDENCE_DIR);
    atomic_file::create_dirs_beneath(root, Path::new(EVIDENCE_DIR))?;
    let bytes = seal(evidence, SEAL_DOMAIN, key)?;
    let path = dir.join(EVIDENCE_FILE);
    atomic_file::write_bytes_with(&path, atomic_file::Options::private(), &bytes)
        .map_err(|e| e.source)?;
    Ok(path)
}

/// Removes held evidence (a failed or aborted verification leaves none behind).
pub fn erase(root: &Path) {
    let _ = std::fs::remove_file(evidence_path(root));
}

#[cfg(test)]
mod tests {
    use super::*;
    use minirun_format::tree::RepoFile;

    fn file(path: &str, size: u64, algorithm: &str, hex: &str) -> (String, RepoFile) {
        let digest = FileDigest::parse(algorithm, hex).unwrap();
        let file = RepoFile {
            path: path.to_string(),
            size,
            digest,
        };
        (path.to_string(), file)
    }

    /// The digest plan's identity, computed independently with Python's hashlib from the
    /// definition above.
    #[test]
    fn the_tree_identity_is_sha256_over_the_length_prefixed_plan() {
        let tree = Tree {
            repo: "team/model".into(),
            revision: "0123456789abcdef0123456789abcdef01234567".into(),
            files: [
                file(
                    "layer00/w.tile",
                    3,
                    "sha256",
                    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                ),
                file(
                    "index.json",
                    2,
                    "git-blob-sha1",
                    "9e26dfeeb6e641a33dae4961196235bdb965b21b",
                ),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            tree_identity(&tree),
            "66ed720c9082e6b8b339d11ac213342b4b15aab8eb4c8e37bb827c634b2e2b0a"
        );
    }

    #[test]
    fn evidence_lives_in_the_artifacts_own_folder_and_erasing_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = evidence_path(dir.path());
        assert_eq!(path, dir.path().join(".minirun/evidence.json"));
        std::fs::create_dir(dir.path().join(".minirun")).unwrap();
        std::fs::write(&path, b"{}").unwrap();
        erase(dir.path());
        assert!(!path.exists());
        erase(dir.path());
    }
}
