//! Reading an artifact's own layout: the one reader of unit manifests, the incomplete-pack
//! marker and root metadata, for every consumer (the runtime, `minirun check`, offline
//! verification). Every open is beneath the held root without following links; every read is
//! bounded; payload and metadata go through held evidence when the caller holds some.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use minirun_format::artifact::{
    self, INCOMPLETE_MARKER, INDEX_FILE, Layout, MAX_MANIFEST_BYTES, ManifestError, UnitManifest,
};
use minirun_format::tree::{FileDigest, RepoFile, Tree};
use sha2::{Digest as _, Sha256};

use crate::held::{HeldEvidence, StoreError};
use crate::root::{EntryKind, OpenError, Root};

/// Why an artifact's layout could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Evidence(#[from] StoreError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot open the artifact root {path}: {error}")]
    Root { path: String, error: std::io::Error },
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} is larger than {limit} bytes")]
    TooLarge { path: String, limit: u64 },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(
        "{path} is not a complete artifact ({reason}): pack it again with `minirun pack`, or download it with `minirun download`"
    )]
    Incomplete { path: String, reason: &'static str },
    #[error(
        "{path}/index.json is not an artifact index ({problem}): pack the artifact again with `minirun pack`, or download it again"
    )]
    NotAnIndex { path: String, problem: String },
    #[error(
        "{path} carries no per-file digests this build can check ({reason}); published artifacts' manifests have none: verify against the publisher with --repo ID --revision SHA"
    )]
    NoOwnDigests { path: String, reason: String },
    #[error(
        "{path} is not in the verification evidence (it was added after the artifact was verified), and a verified run reads nothing the evidence does not cover: run `minirun verify` again"
    )]
    NotEvidenced { path: String },
}

/// The most a root file may hold to be hashed into offline evidence: metadata, never weights.
pub const MAX_ROOT_FILE_BYTES: u64 = 256 << 20;

/// A root file's bytes, and whether held evidence vouched for them.
#[derive(Debug, Clone)]
pub struct Metadata {
    pub bytes: Vec<u8>,
    pub evidenced: bool,
}

/// An artifact directory opened for reading: through held evidence, or plainly beneath its
/// root (the caller said the run is unverified).
#[derive(Debug)]
pub enum ArtifactFiles {
    Verified(Box<HeldEvidence>),
    Unverified(Root),
}

impl ArtifactFiles {
    /// Opens `path` for reads that no evidence vouches for (still rooted and no-follow).
    pub fn unverified(path: &Path) -> Result<ArtifactFiles, LayoutError> {
        Root::open(path)
            .map(ArtifactFiles::Unverified)
            .map_err(|error| LayoutError::Root {
                path: path.display().to_string(),
                error,
            })
    }

    pub fn root(&self) -> &Root {
        match self {
            ArtifactFiles::Verified(held) => held.root(),
            ArtifactFiles::Unverified(root) => root,
        }
    }

    pub fn held(&self) -> Option<&HeldEvidence> {
        match self {
            ArtifactFiles::Verified(held) => Some(held),
            ArtifactFiles::Unverified(_) => None,
        }
    }

    /// Refuses a directory a pack is still writing (or was killed writing), or one without
    /// an index.json.
    pub fn check_complete(&self) -> Result<(), LayoutError> {
        let root = self.root();
        self.check_not_interrupted()?;
        if root.entry_kind(INDEX_FILE)? != EntryKind::File {
            return Err(LayoutError::Incomplete {
                path: root.path().display().to_string(),
                reason: "it has no index.json",
            });
        }
        Ok(())
    }

    /// Refuses a directory holding a pack's incomplete marker: its manifests may be missing
    /// or half written.
    pub fn check_not_interrupted(&self) -> Result<(), LayoutError> {
        let root = self.root();
        if root.entry_kind(INCOMPLETE_MARKER)? != EntryKind::Absent {
            return Err(LayoutError::Incomplete {
                path: root.path().display().to_string(),
                reason: "a pack into it was interrupted",
            });
        }
        Ok(())
    }

    /// Opens a payload file: through the evidence when held (only evidenced files, identity
    /// rechecked), else beneath the root.
    pub fn open_payload(&self, path: &str) -> Result<File, LayoutError> {
        Ok(match self {
            ArtifactFiles::Verified(held) => held.open(path)?,
            ArtifactFiles::Unverified(root) => root.open_file(path)?.0,
        })
    }

    /// A root or unit metadata file, at most `limit` bytes, or `None` when it does not exist.
    /// Through the evidence when held: a file the evidence does not cover is refused, not read
    /// ([`LayoutError::NotEvidenced`]). Unverified, it is read beneath the root.
    pub fn read_metadata(&self, path: &str, limit: u64) -> Result<Option<Metadata>, LayoutError> {
        if let Some(held) = self.held()
            && held.covers(path)
        {
            let bytes = read_bounded(held.open(path)?, path, limit)?;
            return Ok(Some(Metadata {
                bytes,
                evidenced: true,
            }));
        }
        match self.root().entry_kind(path)? {
            EntryKind::Absent => Ok(None),
            _ if self.held().is_some() => Err(LayoutError::NotEvidenced {
                path: path.to_string(),
            }),
            _ => {
                let (file, _) = self.root().open_file(path)?;
                let bytes = read_bounded(file, path, limit)?;
                Ok(Some(Metadata {
                    bytes,
                    evidenced: false,
                }))
            }
        }
    }

    /// Which layout the artifact is in (`minirun_format::artifact::Layout`), from its probe
    /// manifests read like any other metadata.
    pub fn layout(&self) -> Result<Layout, LayoutError> {
        Layout::detect(|path| {
            Ok(self
                .read_metadata(path, MAX_MANIFEST_BYTES)?
                .map(|m| m.bytes))
        })
    }

    /// Every unit's manifest, by unit name: a unit is a directory of the root (never a link)
    /// with a visible plain name that holds a `manifest.json`. Each manifest is read bounded
    /// (through the evidence when held) and checked ([`artifact::parse_manifest`]).
    pub fn unit_manifests(&self) -> Result<Vec<UnitManifest>, LayoutError> {
        let mut manifests = Vec::new();
        for unit in self.root().subdirectories()? {
            if !artifact::is_unit_name(&unit) {
                continue;
            }
            let path = artifact::manifest_path(&unit);
            let Some(read) = self.read_metadata(&path, MAX_MANIFEST_BYTES)? else {
                continue;
            };
            manifests.push(artifact::parse_manifest(&unit, &read.bytes)?);
        }
        Ok(manifests)
    }
}

/// What offline verification checks an artifact against: the payload files its unit manifests
/// list, with the SHA-256 each records (`minirun pack` writes them), and its metadata (every
/// visible regular file of the root, and every unit manifest) with the SHA-256 it has now.
/// Nothing authenticates the metadata offline; recording it binds it to the evidence, so a
/// verified run reads exactly the metadata that was there when it was verified (and
/// `index.json`'s pinned identities are checked by the pass).
pub fn own_manifest_tree(path: &Path) -> Result<Tree, LayoutError> {
    let files = ArtifactFiles::unverified(path)?;
    let manifests = own_digest_manifests(&files)?;
    let mut tree = Tree {
        repo: String::new(),
        revision: String::new(),
        files: payload_files(path, &manifests)?,
    };
    let metadata = files
        .root()
        .files_at_top()?
        .into_iter()
        .chain(manifests.iter().map(|m| artifact::manifest_path(&m.unit)));
    for path in metadata.filter(|p| !p.starts_with('.')) {
        let (size, sha256) = sha256_of(files.root(), &path)?;
        let digest = FileDigest::Sha256(sha256);
        tree.files
            .insert(path.clone(), RepoFile { path, size, digest });
    }
    Ok(tree)
}

/// The unit manifests of an artifact in minirun's own layout, whose manifests record every
/// payload file's SHA-256: refused when a pack was interrupted, the layout records no digests,
/// there are no manifests, or index.json is not an index.
pub(crate) fn own_digest_manifests(
    files: &ArtifactFiles,
) -> Result<Vec<UnitManifest>, LayoutError> {
    let path = files.root().path();
    // Say that a pack was interrupted, not how its half-written manifests fail to parse.
    files.check_not_interrupted()?;
    let no_digests = |reason: String| LayoutError::NoOwnDigests {
        path: path.display().to_string(),
        reason,
    };
    let layout = files.layout()?;
    if !layout.has_own_digests() {
        return Err(no_digests(format!("it is in {}", layout.describe())));
    }
    let manifests = files.unit_manifests().map_err(|e| match e {
        LayoutError::Manifest(m) => no_digests(m.to_string()),
        other => other,
    })?;
    if manifests.is_empty() {
        return Err(no_digests("it has no unit manifests".to_string()));
    }
    let index = files
        .read_metadata(INDEX_FILE, MAX_MANIFEST_BYTES)?
        .map(|m| m.bytes)
        .unwrap_or_default();
    if let Some(problem) = minirun_format::index::ArtifactIndex::parse(&index).parse_problem {
        return Err(LayoutError::NotAnIndex {
            path: path.display().to_string(),
            problem,
        });
    }
    Ok(manifests)
}

/// Every payload file the manifests list, by path, with the size and SHA-256 they record.
pub(crate) fn payload_files(
    root: &Path,
    manifests: &[UnitManifest],
) -> Result<BTreeMap<String, RepoFile>, LayoutError> {
    let mut files = BTreeMap::new();
    for manifest in manifests {
        for file in &manifest.files {
            let path = format!("{}/{}", manifest.unit, file.name());
            let digest = FileDigest::parse("sha256", file.sha256()).ok_or_else(|| {
                LayoutError::NoOwnDigests {
                    path: root.display().to_string(),
                    reason: format!("{path} has no valid sha256"),
                }
            })?;
            let size = file.bytes();
            files.insert(path.clone(), RepoFile { path, size, digest });
        }
    }
    Ok(files)
}

/// A metadata file's size and SHA-256, read beneath the root (at most
/// [`MAX_ROOT_FILE_BYTES`]).
pub(crate) fn sha256_of(root: &Root, path: &str) -> Result<(u64, [u8; 32]), LayoutError> {
    let (file, _) = root.open_file(path)?;
    let bytes = read_bounded(file, path, MAX_ROOT_FILE_BYTES)?;
    Ok((bytes.len() as u64, Sha256::digest(&bytes).into()))
}

/// Reads at most `limit` bytes of `file`, refusing a longer one without reading past the bound.
pub fn read_bounded(file: File, path: &str, limit: u64) -> Result<Vec<u8>, LayoutError> {
    regular_file::read_at_most(file, limit)
        .map_err(|error| LayoutError::Io {
            path: path.to_string(),
            error,
        })?
        .ok_or_else(|| LayoutError::TooLarge {
            path: path.to_string(),
            limit,
        })
}
