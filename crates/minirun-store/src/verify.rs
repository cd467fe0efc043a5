//! Full verification of an artifact directory against a published tree.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use minirun_format::artifact::{INCOMPLETE_MARKER, INDEX_FILE, MAX_MANIFEST_BYTES};
use minirun_format::index::ArtifactIndex;
use minirun_format::tree::{RepoFile, StreamHasher, Tree};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::checkpoint::{Checkpoint, CheckpointKey};
use crate::evidence::{
    self, DigestRecord, Evidence, EvidenceFile, Origin, RootRecord, SignerRecord,
};
use crate::root::{EntryKind, OpenError, Root};
use crate::seal::SealKey;

const READ_CHUNK: usize = 4 << 20;

/// Why an artifact does not match its publication.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot open the artifact root {path}: {error}")]
    Root { path: String, error: std::io::Error },
    #[error(
        "the artifact does not hold exactly the files it is checked against: missing {missing:?}, not listed {extra:?}"
    )]
    Files {
        missing: Vec<String>,
        extra: Vec<String>,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("{path}: {got} bytes, {expected} listed")]
    WrongSize {
        path: String,
        expected: u64,
        got: u64,
    },
    #[error("{path}: the content hashes to {got}, {expected} listed")]
    WrongDigest {
        path: String,
        expected: String,
        got: String,
    },
    #[error("{path}: changed while it was being hashed ({what}); verification aborted")]
    ChangedDuringHash { path: String, what: String },
    #[error("{path}: read failed: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{a} and {b} are the same file (one inode)")]
    Alias { a: String, b: String },
    #[error("cannot write the evidence: {0}")]
    Write(std::io::Error),
    #[error(
        "verification stopped before it finished; {done} file(s) are checkpointed and the next run continues from them"
    )]
    Stopped { done: usize },
    #[error(
        "{path} does not match what index.json pins for it ({what}): the artifact's {role} is not the one its index names"
    )]
    PinnedIdentity {
        path: String,
        role: &'static str,
        what: String,
    },
    #[error(transparent)]
    Layout(#[from] Box<crate::LayoutError>),
    #[error(
        "{path} holds {marker}: a pack into it was interrupted, so it is not a complete artifact; pack it again with `minirun pack`"
    )]
    Incomplete { path: String, marker: &'static str },
    #[error(
        "{path} is both in the publication and offered as a file from {origin}: the publication's own copy is the one verified"
    )]
    SourcedTwice { path: String, origin: String },
    #[error(
        "{path} is to be verified against {origin}, and only a verification against a publication can take files from the upstream it names"
    )]
    SourcedWithoutPublication { path: String, origin: String },
}

/// A root file the publication does not hold (Kimi K3 publishes no `config.json`), verified
/// against the tree of the upstream repository and pinned revision that the publication's
/// `index.json` names. The folder must hold it; the evidence records it with its [`Origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcedFile {
    /// The file as the upstream tree lists it (path, size, digest).
    pub file: RepoFile,
    pub origin: Origin,
}

/// What the digests being checked come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// The publisher's tree of a pinned revision: the folder must hold exactly its files.
    /// Evidence mode `full`.
    Publication,
    /// The artifact's own manifests (offline): only the files they list are checked, and the
    /// manifests themselves are not authenticated. Evidence mode `own-manifests`, which never
    /// lets a reader skip tile digests.
    OwnManifests,
}

/// What a pass checks against: an [`Authority`] a caller names, or a publisher's signed
/// statement and the manifests it covers ([`verify_signed`]: the folder must hold exactly the
/// files they list; evidence mode `signed`, naming the signer).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Against {
    Publication,
    OwnManifests,
    Signed(SignerRecord),
}

impl Against {
    /// The signer evidence of this pass names (a signed pass's only).
    fn signer(&self) -> Option<SignerRecord> {
        match self {
            Against::Signed(signer) => Some(signer.clone()),
            Against::Publication | Against::OwnManifests => None,
        }
    }
}

impl From<Authority> for Against {
    fn from(authority: Authority) -> Against {
        match authority {
            Authority::Publication => Against::Publication,
            Authority::OwnManifests => Against::OwnManifests,
        }
    }
}

/// How much to hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Selection {
    /// Every file (evidence mode `full` or `own-manifests`).
    #[default]
    Full,
    /// Payload files only, largest first, skipping any that would overflow this many bytes
    /// (evidence mode `spot-check`: the folder's file set is still checked, only the selected
    /// files are evidenced, and it never lets a reader skip tile digests).
    SpotCheck { budget: u64 },
}

fn mode(authority: &Against, selection: Selection) -> &'static str {
    match (selection, authority) {
        (Selection::SpotCheck { .. }, _) => "spot-check",
        (Selection::Full, Against::Publication) => "full",
        (Selection::Full, Against::OwnManifests) => "own-manifests",
        (Selection::Full, Against::Signed(_)) => "signed",
    }
}

/// The files a selection hashes, largest first.
fn select(tree: &Tree, selection: Selection) -> Vec<&RepoFile> {
    let mut files: Vec<&RepoFile> = tree.files.values().collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.size));
    let Selection::SpotCheck { budget } = selection else {
        return files;
    };
    let mut used = 0u64;
    files
        .into_iter()
        .filter(|f| evidence::is_payload(&f.digest))
        .filter(|f| match used.checked_add(f.size) {
            Some(total) if total <= budget => {
                used = total;
                true
            }
            _ => false,
        })
        .collect()
}

/// A finished verification.
#[derive(Debug, Clone)]
pub struct Verified {
    pub evidence: Evidence,
    /// Files taken from an interrupted earlier pass (unchanged identity), not hashed again.
    pub reused: usize,
    /// Files carried forward from the evidence of an earlier revision of the same repository
    /// in the same directory: same path, size and digest, unchanged identity (ADR 0014).
    pub carried: usize,
}

/// Hashes every file of `tree` under `root` (files in parallel on rayon's pool, 4 MiB reads),
/// re-checks each file's identity after hashing, checkpoints after every matched file, and on
/// success writes the evidence atomically. Files an interrupted earlier pass of the same
/// publication and directory had matched are reused when their identity is unchanged. Setting
/// `stop` ends the pass after the files in progress (their checkpoint kept). Any failure
/// erases evidence held from an earlier pass.
pub fn verify(
    root_path: &Path,
    tree: &Tree,
    key: &SealKey,
    progress: &(dyn Fn(u64) + Sync),
    stop: &AtomicBool,
) -> Result<Verified, VerifyError> {
    verify_with(
        root_path,
        tree,
        Authority::Publication,
        Selection::Full,
        Sealing {
            key,
            progress,
            stop,
        },
    )
}

/// What a pass seals its evidence and checkpoints with, reports progress to and stops on.
#[derive(Clone, Copy)]
pub struct Sealing<'a> {
    /// The user's key: evidence and checkpoints are sealed with it, and only records it opens
    /// are reused.
    pub key: &'a SealKey,
    /// Called with the number of bytes hashed (or reused) as the pass goes.
    pub progress: &'a (dyn Fn(u64) + Sync),
    /// Set to end the pass after the files in progress.
    pub stop: &'a AtomicBool,
}

/// [`verify`] with the digests' authority and the selection stated.
pub fn verify_with(
    root_path: &Path,
    tree: &Tree,
    authority: Authority,
    selection: Selection,
    sealing: Sealing<'_>,
) -> Result<Verified, VerifyError> {
    verify_sourced(root_path, tree, &[], authority, selection, sealing)
}

/// [`verify_with`], and besides the publication's files the `sourced` ones, each hashed
/// against its upstream tree's digest whatever the selection (they are metadata, and only
/// evidence that holds them lets a run read them).
pub fn verify_sourced(
    root_path: &Path,
    tree: &Tree,
    sourced: &[SourcedFile],
    authority: Authority,
    selection: Selection,
    sealing: Sealing<'_>,
) -> Result<Verified, VerifyError> {
    verify_inner(
        root_path,
        tree,
        sourced,
        authority.into(),
        selection,
        sealing,
    )
}

/// Every file of `tree` (from [`crate::signed_tree`]) hashed, the folder holding exactly those
/// files, and evidence of mode `signed` naming `signer`, whose signature the caller checked.
pub fn verify_signed(
    root_path: &Path,
    tree: &Tree,
    signer: SignerRecord,
    sealing: Sealing<'_>,
) -> Result<Verified, VerifyError> {
    verify_inner(
        root_path,
        tree,
        &[],
        Against::Signed(signer),
        Selection::Full,
        sealing,
    )
}

/// One pass ([`pass`]); a failed one erases any evidence held from an earlier pass.
fn verify_inner(
    root_path: &Path,
    tree: &Tree,
    sourced: &[SourcedFile],
    authority: Against,
    selection: Selection,
    sealing: Sealing<'_>,
) -> Result<Verified, VerifyError> {
    let result = pass(root_path, tree, sourced, &authority, selection, sealing);
    if result.is_err() {
        evidence::erase(root_path);
    }
    result
}

fn pass(
    root_path: &Path,
    tree: &Tree,
    sourced: &[SourcedFile],
    authority: &Against,
    selection: Selection,
    sealing: Sealing<'_>,
) -> Result<Verified, VerifyError> {
    let Sealing {
        key,
        progress,
        stop,
    } = sealing;
    let root = Root::open(root_path).map_err(|error| VerifyError::Root {
        path: root_path.display().to_string(),
        error,
    })?;
    if root.entry_kind(INCOMPLETE_MARKER)? != EntryKind::Absent {
        return Err(VerifyError::Incomplete {
            path: root_path.display().to_string(),
            marker: INCOMPLETE_MARKER,
        });
    }
    check_sourced(tree, sourced, authority)?;
    if *authority != Against::OwnManifests {
        check_file_set(root_path, tree, sourced)?;
    }
    check_index_pins(&root)?;
    let tree_identity = evidence::tree_identity(tree);
    let checkpoint = Checkpoint::open(
        &root,
        CheckpointKey {
            repo: tree.repo.clone(),
            revision: tree.revision.clone(),
            tree_identity: tree_identity.clone(),
            root_device: root.device(),
            root_inode: root.inode(),
        },
        key,
    );
    let files = select(tree, selection);
    let donor = earlier_revision(&root, tree, key);
    let reused = AtomicUsize::new(0);
    let carried = AtomicUsize::new(0);
    let outcomes: Vec<Result<Option<EvidenceFile>, VerifyError>> = files
        .par_iter()
        .map(|file| {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            if let Some(record) = reusable(&root, file, checkpoint.earlier(&file.path)) {
                reused.fetch_add(1, Ordering::Relaxed);
                progress(file.size);
                return Ok(Some(record));
            }
            if let Some(record) = reusable(&root, file, donor.get(&file.path).cloned()) {
                carried.fetch_add(1, Ordering::Relaxed);
                checkpoint
                    .record(record.clone())
                    .map_err(VerifyError::Write)?;
                progress(file.size);
                return Ok(Some(record));
            }
            let record = verify_file(&root, file, progress)?;
            checkpoint
                .record(record.clone())
                .map_err(VerifyError::Write)?;
            Ok(Some(record))
        })
        .collect();
    let mut records = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome {
            Ok(Some(record)) => records.push(record),
            Ok(None) => {}
            Err(e) => {
                checkpoint.remove();
                return Err(e);
            }
        }
    }
    if records.len() < files.len() {
        return Err(VerifyError::Stopped {
            done: records.len(),
        });
    }
    for s in sourced {
        let mut record =
            verify_file(&root, &s.file, progress).inspect_err(|_| checkpoint.remove())?;
        record.origin = Some(s.origin.clone());
        records.push(record);
    }
    records.sort_by(|a, b| a.path.cmp(&b.path));
    let mut seen = BTreeMap::new();
    for r in &records {
        if let Some(other) = seen.insert((r.identity.device, r.identity.inode), &r.path) {
            checkpoint.remove();
            return Err(VerifyError::Alias {
                a: other.clone(),
                b: r.path.clone(),
            });
        }
    }
    let evidence = Evidence {
        schema: evidence::SCHEMA.to_string(),
        repo: tree.repo.clone(),
        revision: tree.revision.clone(),
        tree_identity,
        mode: mode(authority, selection).to_string(),
        root: RootRecord {
            device: root.device(),
            inode: root.inode(),
            fsid: root.fsid(),
            volume: root.volume(),
        },
        files: records,
        signer: authority.signer(),
    };
    evidence::write(root_path, &evidence, key).map_err(VerifyError::Write)?;
    checkpoint.remove();
    Ok(Verified {
        evidence,
        reused: reused.into_inner(),
        carried: carried.into_inner(),
    })
}

/// The files of held evidence for an *earlier revision* of the same repository in this same
/// directory (a re-verification of the same revision hashes everything again: that is what
/// catches silent corruption). Only evidence sealed under the user's key donates.
fn earlier_revision(root: &Root, tree: &Tree, key: &SealKey) -> BTreeMap<String, EvidenceFile> {
    let Ok(held) = evidence::read(root, key) else {
        return BTreeMap::new();
    };
    let same_place = (held.root.device, held.root.inode, held.root.fsid)
        == (root.device(), root.inode(), root.fsid());
    let donor = held.schema == evidence::SCHEMA
        && held.mode == "full"
        && !tree.repo.is_empty()
        && held.repo == tree.repo
        && held.revision != tree.revision
        && same_place;
    if !donor {
        return BTreeMap::new();
    }
    held.files
        .into_iter()
        .map(|f| (f.path.clone(), f))
        .collect()
}

/// An earlier pass's record of `file`, if it is for the same size and digest and the file
/// still has the identity recorded then (opened rooted, no content read).
fn reusable(root: &Root, file: &RepoFile, earlier: Option<EvidenceFile>) -> Option<EvidenceFile> {
    let earlier = earlier.filter(|e| e.origin.is_none())?;
    let same_claim = earlier.expected_size == file.size
        && earlier.digest.algorithm == file.digest.algorithm()
        && earlier.digest.hex == file.digest.hex();
    let (_, now) = root.open_sole_written(&file.path).ok()?;
    (same_claim && now == earlier.identity).then_some(earlier)
}

fn verify_file(
    root: &Root,
    file: &RepoFile,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<EvidenceFile, VerifyError> {
    let (mut handle, before) = root.open_sole_written(&file.path)?;
    if before.size != file.size {
        return Err(VerifyError::WrongSize {
            path: file.path.clone(),
            expected: file.size,
            got: before.size,
        });
    }
    let mut hasher = StreamHasher::new(&file.digest, file.size);
    let mut buf = vec![0u8; READ_CHUNK];
    let read_error = |error| VerifyError::Read {
        path: file.path.clone(),
        error,
    };
    loop {
        let n = handle.read(&mut buf).map_err(read_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        progress(n as u64);
    }
    let after = crate::identity::FileIdentity::of(&handle.metadata().map_err(read_error)?);
    let changed = after.changes_from(&before);
    if !changed.is_empty() {
        return Err(VerifyError::ChangedDuringHash {
            path: file.path.clone(),
            what: changed.join(", "),
        });
    }
    let got = hasher.finish();
    if got != file.digest {
        return Err(VerifyError::WrongDigest {
            path: file.path.clone(),
            expected: file.digest.to_string(),
            got: got.to_string(),
        });
    }
    Ok(EvidenceFile {
        path: file.path.clone(),
        expected_size: file.size,
        digest: DigestRecord {
            algorithm: file.digest.algorithm().to_string(),
            hex: file.digest.hex(),
        },
        payload: evidence::is_payload(&file.digest),
        identity: before,
        origin: None,
    })
}

/// Sourced files come only with a publication, and never in place of one of its files.
fn check_sourced(
    tree: &Tree,
    sourced: &[SourcedFile],
    authority: &Against,
) -> Result<(), VerifyError> {
    for s in sourced {
        let path = s.file.path.clone();
        let origin = format!("{}@{}", s.origin.repo, s.origin.revision);
        if *authority != Against::Publication {
            return Err(VerifyError::SourcedWithoutPublication { path, origin });
        }
        if tree.files.contains_key(&path) {
            return Err(VerifyError::SourcedTwice { path, origin });
        }
    }
    Ok(())
}

/// Every non-directory entry under the root (symbolic links included, never followed), minus
/// the evidence folder, must be exactly the tree's files and the sourced ones.
fn check_file_set(root: &Path, tree: &Tree, sourced: &[SourcedFile]) -> Result<(), VerifyError> {
    let present = crate::root::files_beneath(root, crate::evidence::EVIDENCE_DIR)?;
    let published: BTreeSet<String> = tree
        .files
        .keys()
        .cloned()
        .chain(sourced.iter().map(|s| s.file.path.clone()))
        .collect();
    let missing: Vec<String> = published.difference(&present).cloned().collect();
    let extra: Vec<String> = present.difference(&published).cloned().collect();
    if missing.is_empty() && extra.is_empty() {
        Ok(())
    } else {
        Err(VerifyError::Files { missing, extra })
    }
}

/// The tokenizer and configuration files `index.json` pins (by length and SHA-256), when it
/// pins any, must be exactly those bytes.
fn check_index_pins(root: &Root) -> Result<(), VerifyError> {
    if root.entry_kind(INDEX_FILE)? == EntryKind::Absent {
        return Ok(());
    }
    let (file, _) = root.open_file(INDEX_FILE)?;
    let bytes = crate::read_bounded(file, INDEX_FILE, MAX_MANIFEST_BYTES)
        .map_err(|e| VerifyError::Layout(Box::new(e)))?;
    let index = ArtifactIndex::parse(&bytes);
    let tokenizer = index
        .tokenizer
        .and_then(Result::ok)
        .map(|t| ("tokenizer", t.file, t.bytes, t.sha256));
    let configuration = index
        .configuration
        .and_then(Result::ok)
        .map(|c| ("configuration", c.file, c.bytes, c.sha256));
    for (role, path, bytes, sha256) in tokenizer.into_iter().chain(configuration) {
        let mismatch = |what| VerifyError::PinnedIdentity {
            path: path.clone(),
            role,
            what,
        };
        let (mut file, identity) = root.open_file(&path)?;
        if identity.size != bytes {
            let size = identity.size;
            return Err(mismatch(format!("{size} bytes, index.json says {bytes}")));
        }
        // Hashed as it is read: the pinned length is the index's word, not a bound.
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(|error| VerifyError::Read {
            path: path.clone(),
            error,
        })?;
        let got = minirun_format::tile::hex(&hasher.finalize());
        if got != sha256 {
            return Err(mismatch(format!("SHA-256 {got}, index.json says {sha256}")));
        }
    }
    Ok(())
}
