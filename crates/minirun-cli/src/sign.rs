//! `minirun sign`: a publisher's statement of every non-payload file of an artifact, signed
//! with their SSH key, so that anyone holding the key in an allowed-signers file can verify
//! the whole artifact offline (`minirun verify --allowed-signers`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use minirun_format::identity::{is_canonical_repo_id, is_pinned_revision};
use minirun_format::index::ArtifactIndex;
use minirun_sign::{Identity, NAMESPACE, SIGNATURE_FILE, STATEMENT_FILE, signature};

use crate::shown;

#[derive(Args)]
pub struct SignArgs {
    /// The artifact directory (minirun's own layout, whose manifests record every payload
    /// file's SHA-256).
    artifact: PathBuf,
    /// The OpenSSH private key to sign with (unencrypted; for a key with a passphrase, sign
    /// the statement with `ssh-keygen -Y sign` instead).
    #[arg(long, value_name = "KEYFILE")]
    key: PathBuf,
}

/// The most bytes a private key file may have.
const MAX_KEY_BYTES: u64 = 64 << 10;

pub fn run(args: &SignArgs) -> Result<ExitCode> {
    sign_artifact(&args.artifact, &args.key)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the statement of `artifact` and its signature by `key` beside it (each atomically),
/// and says what was signed and how to check it.
pub fn sign_artifact(artifact: &Path, key: &Path) -> Result<()> {
    let key_text = read_key(key)?;
    let identity = identity_of(artifact)?;
    let statement = minirun_store::statement_of(artifact, identity.clone())
        .with_context(|| format!("cannot sign {}", shown(artifact)))?;
    let bytes = statement.to_bytes();
    let signed = signature::sign(&bytes, &key_text)
        .with_context(|| format!("cannot sign with {}", shown(key)))?;
    atomic_file::write_bytes(&artifact.join(STATEMENT_FILE), &bytes)?;
    atomic_file::write_bytes(&artifact.join(SIGNATURE_FILE), signed.armored.as_bytes())?;
    let of = match &identity {
        Some(id) => format!(" of {}@{}", id.repo, id.revision),
        None => " (index.json names no single pinned upstream, so it names none)".to_string(),
    };
    eprintln!(
        "signed {}{of}: {} metadata files listed, payload covered by the unit manifests' SHA-256s; key {}, namespace {NAMESPACE}",
        shown(artifact),
        statement.files.len(),
        signed.fingerprint
    );
    eprintln!(
        "check: minirun verify {} --allowed-signers FILE   (or: ssh-keygen -Y verify -f FILE -I PRINCIPAL -n {NAMESPACE} -s {SIGNATURE_FILE} < {STATEMENT_FILE})",
        shown(artifact)
    );
    Ok(())
}

fn read_key(path: &Path) -> Result<String> {
    let bytes = read_small_file(path, MAX_KEY_BYTES, "an OpenSSH private key")?;
    String::from_utf8(bytes)
        .with_context(|| format!("{} is not an OpenSSH private key (not text)", shown(path)))
}

/// A file given on the command line that is `what` and at most `limit` bytes: opened as a
/// regular file only, read bounded.
pub(crate) fn read_small_file(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let file = regular_file::open(path).with_context(|| format!("cannot read {}", shown(path)))?;
    regular_file::read_at_most(file, limit)
        .with_context(|| format!("cannot read {}", shown(path)))?
        .with_context(|| format!("{} is larger than {limit} bytes: not {what}", shown(path)))
}

/// The upstream index.json names, when it names exactly one with a canonical id at a pinned
/// revision; otherwise none (the statement then says `-`, never a guess).
fn identity_of(artifact: &Path) -> Result<Option<Identity>> {
    let files = minirun_store::ArtifactFiles::unverified(artifact)?;
    let index = files
        .read_metadata(
            minirun_format::artifact::INDEX_FILE,
            minirun_format::artifact::MAX_MANIFEST_BYTES,
        )?
        .map(|m| m.bytes)
        .unwrap_or_default();
    let sources = ArtifactIndex::parse(&index).sources;
    Ok(match sources.as_slice() {
        [only] => only
            .revision
            .as_ref()
            .filter(|r| is_canonical_repo_id(&only.repo) && is_pinned_revision(r))
            .map(|revision| Identity {
                repo: only.repo.clone(),
                revision: revision.clone(),
            }),
        _ => None,
    })
}
