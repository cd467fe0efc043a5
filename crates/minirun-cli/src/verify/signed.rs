//! `minirun verify --allowed-signers`: offline, against the publisher's signed statement.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use minirun_sign::statement::MAX_STATEMENT_BYTES;
use minirun_sign::{SIGNATURE_FILE, STATEMENT_FILE, Statement, allowed_signers, signature};
use minirun_store::{ArtifactFiles, SealKey, SignerRecord};

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
    let files = ArtifactFiles::unverified(dir)?;
    let Some(statement) = files.read_metadata(STATEMENT_FILE, MAX_STATEMENT_BYTES)? else {
        bail!(
            "{} has no {STATEMENT_FILE}: it was never signed (a publisher signs it with `minirun sign`); verify it against its publication with --repo and --revision, or offline against its own manifests",
            shown(dir)
        );
    };
    let signature = files
        .read_metadata(SIGNATURE_FILE, MAX_SIGNATURE_BYTES)?
        .with_context(|| {
            format!(
                "{} has {STATEMENT_FILE} but no {SIGNATURE_FILE}",
                shown(dir)
            )
        })?;
    let (statement_bytes, signature_bytes) = (statement.bytes, signature.bytes);
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

fn read_allowed(path: &Path) -> Result<Vec<minirun_sign::AllowedSigner>> {
    let bytes = crate::sign::read_small_file(
        path,
        allowed_signers::MAX_ALLOWED_SIGNERS_BYTES,
        "an allowed signers file",
    )?;
    let signers = allowed_signers::parse(&bytes).with_context(|| shown(path))?;
    if signers.is_empty() {
        bail!("{} lists no signer", shown(path));
    }
    Ok(signers)
}
