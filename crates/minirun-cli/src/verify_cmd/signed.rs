//! `minirun verify --allowed-signers`: offline, against the publisher's signed statement.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use minirun_sign::statement::MAX_STATEMENT_BYTES;
use minirun_sign::{SIGNATURE_FILE, STATEMENT_FILE, Statement, allowed_signers, signature};
use minirun_store::{EntryKind, Root, SealKey, SignerRecord};

use crate::shown;

/// The most bytes a signature file may have (an armored signature is under 1 KiB).
const MAX_SIGNATURE_BYTES: u64 = 64 << 10;

/// Verifies `dir` against its signed statement; any refusal erases evidence an earlier pass
/// left, so that a run after it is not authorized by what no longer holds.
pub fn verify(dir: &Path, allowed: &Path, key: &SealKey) -> Result<ExitCode> {
    let result = verify_statement(dir, allowed, key);
    if result.is_err() {
        minirun_store::evidence::erase(dir);
    }
    result
}

fn verify_statement(dir: &Path, allowed: &Path, key: &SealKey) -> Result<ExitCode> {
    let root = Root::open(dir).with_context(|| format!("cannot open {}", shown(dir)))?;
    if root.entry_kind(STATEMENT_FILE)? == EntryKind::Absent {
        bail!(
            "{} has no {STATEMENT_FILE}: it was never signed (a publisher signs it with `minirun sign`); verify it against its publication with --repo and --revision, or offline against its own manifests",
            shown(dir)
        );
    }
    let statement_bytes = read_beneath(&root, STATEMENT_FILE, MAX_STATEMENT_BYTES)?;
    let signature_bytes = read_beneath(&root, SIGNATURE_FILE, MAX_SIGNATURE_BYTES)?;
    let signers = read_allowed(allowed)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let armored = String::from_utf8_lossy(&signature_bytes);
    let signer =
        signature::verify(&statement_bytes, &armored, &signers, now).with_context(|| {
            format!(
                "{}'s signature is refused (against {})",
                shown(dir),
                shown(allowed)
            )
        })?;
    let statement = Statement::parse(&statement_bytes)
        .with_context(|| format!("{}/{STATEMENT_FILE}", shown(dir)))?;
    let tree = minirun_store::signed_tree(dir, &statement, &statement_bytes, &signature_bytes)
        .with_context(|| format!("{} does not match its signed statement", shown(dir)))?;
    let against = format!(
        "the statement signed by {} (key {})",
        signer.principals, signer.fingerprint
    );
    eprintln!(
        "verifying {} against {against}: {} files, {} bytes",
        shown(dir),
        tree.files.len(),
        tree.total_bytes()
    );
    let bar = super::hashing_bar(tree.total_bytes());
    let started = Instant::now();
    let never = std::sync::atomic::AtomicBool::new(false);
    let record = SignerRecord {
        principals: signer.principals.clone(),
        fingerprint: signer.fingerprint.clone(),
    };
    let sealing = minirun_store::Sealing {
        key,
        progress: &|n| bar.inc(n),
        stop: &never,
    };
    let result = minirun_store::verify_signed(dir, &tree, record, sealing);
    bar.finish_and_clear();
    let verified = result.with_context(|| format!("{} does not match {against}", shown(dir)))?;
    eprintln!(
        "verified: {} files match {against} ({:.1} s); evidence (signed) written to {}",
        verified.evidence.files.len(),
        started.elapsed().as_secs_f64(),
        minirun_store::evidence::evidence_path(dir).display()
    );
    Ok(ExitCode::SUCCESS)
}

fn read_beneath(root: &Root, name: &str, limit: u64) -> Result<Vec<u8>> {
    let (file, _) = root.open_file(name)?;
    Ok(minirun_store::read_bounded(file, name, limit)?)
}

fn read_allowed(path: &Path) -> Result<Vec<minirun_sign::AllowedSigner>> {
    let file = regular_file::open(path).with_context(|| format!("cannot read {}", shown(path)))?;
    let bytes = regular_file::read_at_most(file, allowed_signers::MAX_ALLOWED_SIGNERS_BYTES)?
        .with_context(|| format!("{} is too large for an allowed signers file", shown(path)))?;
    let signers = allowed_signers::parse(&bytes).with_context(|| shown(path))?;
    if signers.is_empty() {
        bail!("{} lists no signer", shown(path));
    }
    Ok(signers)
}
