//! A publisher's signed statement, on the artifact's side: the statement a signer writes for a
//! folder (every file that is not payload, hashed; payload is covered by the manifests' own
//! digests), and the tree a verified statement vouches for. The signature itself is checked by
//! the caller (`minirun_sign`) before the tree is built. Specified in
//! `docs/formats/signed-statement.md`.

use std::collections::BTreeMap;
use std::path::Path;

use minirun_format::artifact::{self, MAX_MANIFEST_BYTES};
use minirun_format::tree::{FileDigest, RepoFile, Tree};
use minirun_sign::{Identity, Listed, SIGNATURE_FILE, STATEMENT_FILE, Statement};
use sha2::{Digest as _, Sha256};

use crate::artifact_files::{
    ArtifactFiles, LayoutError, own_digest_manifests, payload_files, read_bounded, sha256_of,
};

/// Why a statement could not be written for a folder, or does not describe it.
#[derive(Debug, thiserror::Error)]
pub enum SignedError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Open(#[from] crate::root::OpenError),
    #[error(
        "{path} differs from the signed statement ({what}): it was changed after signing, or the statement is another artifact's"
    )]
    Mismatch { path: String, what: String },
    #[error(
        "the signed statement lists {path}, which a unit manifest lists as payload: a statement covers only what no manifest digests"
    )]
    ListsPayload { path: String },
    #[error("the signed statement lists no unit manifest, so it vouches for no payload")]
    NoManifests,
}

/// The statement for the artifact at `path`: `identity`, and the size and SHA-256 of every file
/// beneath the root that no unit manifest lists (metadata, manifests included), except the
/// statement, its signature and the evidence folder. Reads metadata only.
pub fn statement_of(path: &Path, identity: Option<Identity>) -> Result<Statement, SignedError> {
    let files = ArtifactFiles::unverified(path)?;
    files.check_complete()?;
    let manifests = own_digest_manifests(&files)?;
    let payload = payload_files(path, &manifests)?;
    let mut listed = BTreeMap::new();
    for file in crate::root::files_beneath(path, crate::evidence::EVIDENCE_DIR)? {
        if payload.contains_key(&file) || file == STATEMENT_FILE || file == SIGNATURE_FILE {
            continue;
        }
        let (size, sha256) = sha256_of(files.root(), &file)?;
        listed.insert(file, Listed { size, sha256 });
    }
    Ok(Statement {
        identity,
        files: listed,
    })
}

/// What a verified statement vouches for: each file it lists with its digest, each payload
/// file the listed manifests record (every manifest read now and checked against the
/// statement first, so the payload digests are the signer's), and the statement and signature
/// as they were checked, so the evidence binds exactly those bytes.
pub fn signed_tree(
    path: &Path,
    statement: &Statement,
    statement_bytes: &[u8],
    signature_bytes: &[u8],
) -> Result<Tree, SignedError> {
    let files = ArtifactFiles::unverified(path)?;
    files.check_complete()?;
    let mut manifests = Vec::new();
    for (file, listed) in &statement.files {
        let Some(unit) = file.strip_suffix("/manifest.json") else {
            continue;
        };
        if !artifact::is_unit_name(unit) {
            continue;
        }
        let (opened, _) = files.root().open_file(file)?;
        let bytes = read_bounded(opened, file, MAX_MANIFEST_BYTES)?;
        check_listed(file, listed, &bytes)?;
        manifests.push(artifact::parse_manifest(unit, &bytes).map_err(LayoutError::from)?);
    }
    if manifests.is_empty() {
        return Err(SignedError::NoManifests);
    }
    let mut tree = Tree {
        repo: statement
            .identity
            .as_ref()
            .map_or_else(String::new, |i| i.repo.clone()),
        revision: statement
            .identity
            .as_ref()
            .map_or_else(String::new, |i| i.revision.clone()),
        files: payload_files(path, &manifests)?,
    };
    for (file, listed) in &statement.files {
        if tree.files.contains_key(file) {
            return Err(SignedError::ListsPayload { path: file.clone() });
        }
        insert(&mut tree, file, listed.size, listed.sha256);
    }
    for (file, bytes) in [
        (STATEMENT_FILE, statement_bytes),
        (SIGNATURE_FILE, signature_bytes),
    ] {
        insert(
            &mut tree,
            file,
            bytes.len() as u64,
            Sha256::digest(bytes).into(),
        );
    }
    Ok(tree)
}

fn insert(tree: &mut Tree, path: &str, size: u64, sha256: [u8; 32]) {
    let file = RepoFile {
        path: path.to_string(),
        size,
        digest: FileDigest::Sha256(sha256),
    };
    tree.files.insert(path.to_string(), file);
}

fn check_listed(path: &str, listed: &Listed, bytes: &[u8]) -> Result<(), SignedError> {
    let mismatch = |what: String| SignedError::Mismatch {
        path: path.to_string(),
        what,
    };
    if bytes.len() as u64 != listed.size {
        return Err(mismatch(format!(
            "{} bytes, the statement says {}",
            bytes.len(),
            listed.size
        )));
    }
    if <[u8; 32]>::from(Sha256::digest(bytes)) != listed.sha256 {
        return Err(mismatch("its SHA-256 is not the one signed".into()));
    }
    Ok(())
}
