//! `minirun verify`: check an artifact directory against what the publisher released and hold
//! the result as evidence bound to the files.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use minirun_format::tree::Tree;
use minirun_hub::Hub;
use minirun_hub::upstream::{self, Lookup};
use minirun_store::SourcedFile;
use minirun_store::{Authority, Selection};

pub(crate) mod signed;

#[derive(Args)]
pub struct VerifyArgs {
    /// The artifact directory.
    dir: PathBuf,
    /// The published repository, e.g. nanguoyu/Kimi-K3-minirun.
    #[arg(long)]
    repo: Option<String>,
    /// The pinned commit the files must match (40 lowercase hex digits).
    #[arg(long)]
    revision: Option<String>,
    /// Use this saved tree listing (the JSON array the Hub's tree endpoint returns, pages
    /// concatenated) instead of asking the Hub.
    #[arg(long, value_name = "FILE")]
    tree: Option<PathBuf>,
    /// Where the publication holds no config.json (Kimi K3, DeepSeek V4) or no tokenizer: the
    /// tree listing of the upstream repository its index.json names, at the revision it names,
    /// to verify the files placed in the artifact against (saved like --tree). Without it, the
    /// Hub is asked, and fetches what the artifact lacks.
    #[arg(long, value_name = "FILE")]
    source_tree: Option<PathBuf>,
    /// The Hub's origin (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long)]
    endpoint: Option<String>,
    /// Hash only payload files, largest first, within this many bytes (labelled a spot check
    /// in the evidence; readers never skip tile digests on one).
    #[arg(long, value_name = "BYTES")]
    spot_check: Option<u64>,
    /// Verify offline against the publisher's signed statement (minirun-statement.txt and its
    /// .sig, written by `minirun sign`), trusting the keys of this allowed-signers file (git's
    /// and ssh-keygen's format: principals, options, key).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["repo", "revision", "tree", "source_tree", "spot_check"]
    )]
    allowed_signers: Option<PathBuf>,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
}

pub fn run(args: &VerifyArgs) -> Result<ExitCode> {
    // The evidence is sealed with it: a key that cannot be had fails before any hashing.
    let key = minirun_store::SealKey::for_user()?;
    if let Some(allowed) = &args.allowed_signers {
        return signed::verify(&args.dir, allowed, &key);
    }
    let (tree, authority) = match (&args.repo, &args.revision) {
        (Some(repo), Some(revision)) => (
            published_tree(args, repo, revision)?,
            Authority::Publication,
        ),
        (None, None) if args.tree.is_none() => (
            minirun_store::own_manifest_tree(&args.dir)?,
            Authority::OwnManifests,
        ),
        _ => bail!(
            "give both --repo and --revision (with --tree FILE or the Hub), or neither (offline, against the artifact's own manifests)"
        ),
    };
    let sourced = match authority {
        Authority::Publication => from_upstream(args, &tree)?,
        Authority::OwnManifests if args.source_tree.is_some() => bail!(
            "--source-tree verifies a file the publication lacks against its upstream: give it with --repo and --revision"
        ),
        Authority::OwnManifests => Vec::new(),
    };
    let against = match authority {
        Authority::Publication => format!("{}@{}", tree.repo, tree.revision),
        Authority::OwnManifests => "its own manifests (offline; the manifests themselves are not authenticated, and files they do not list are not checked; a signed artifact verifies with --allowed-signers)".to_string(),
    };
    let selection = match args.spot_check {
        Some(budget) => Selection::SpotCheck { budget },
        None => Selection::Full,
    };
    let total = match selection {
        Selection::Full => tree.total_bytes(),
        Selection::SpotCheck { budget } => {
            eprintln!(
                "SPOT CHECK: only payload files within {budget} bytes are hashed, largest first"
            );
            budget.min(tree.total_bytes())
        }
    };
    eprintln!(
        "verifying {} against {against}: {} files, {total} bytes",
        args.dir.display(),
        tree.files.len()
    );
    let bar = hashing_bar(total);
    let started = Instant::now();
    // A kill keeps the per-file checkpoint; the next run continues from it.
    let never = std::sync::atomic::AtomicBool::new(false);
    let result = minirun_store::verify_sourced(
        &args.dir,
        &tree,
        &sourced,
        authority,
        selection,
        minirun_store::Sealing {
            key: &key,
            progress: &|n| bar.inc(n),
            stop: &never,
        },
    );
    bar.finish_and_clear();
    let verified =
        result.with_context(|| format!("{} does not match {against}", args.dir.display()))?;
    if verified.reused > 0 {
        eprintln!(
            "{} file(s) were taken from an interrupted earlier pass (identity unchanged), not hashed again",
            verified.reused
        );
    }
    if verified.carried > 0 {
        eprintln!(
            "{} file(s) were carried forward from the evidence of an earlier revision (same path, size and digest; identity unchanged)",
            verified.carried
        );
    }
    let evidence = verified.evidence;
    for s in &sourced {
        eprintln!(
            "{} is not in the publication: verified against {}@{}, the upstream its index.json names",
            s.file.path, s.origin.repo, s.origin.revision
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "verified: {} files match {against} ({:.1} s, {:.0} MB/s); evidence ({}) written to {}",
        evidence.files.len(),
        seconds,
        total as f64 / 1e6 / seconds.max(1e-9),
        evidence.mode,
        minirun_store::evidence::evidence_path(&args.dir).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A progress bar over the bytes a pass hashes.
pub(crate) fn hashing_bar(total: u64) -> ProgressBar {
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

fn published_tree(args: &VerifyArgs, repo: &str, revision: &str) -> Result<Tree> {
    Ok(match &args.tree {
        Some(path) => {
            if !minirun_format::identity::is_pinned_revision(revision) {
                bail!("{revision:?} is not a pinned revision (40 lowercase hex digits)");
            }
            upstream::read_listing(path, repo, revision)?
        }
        None => Hub::from_env(args.endpoint.as_deref())?
            .tree(repo, revision)
            .with_context(|| format!("cannot list {repo}@{revision}"))?,
    })
}

/// The files the publication lacks and a run needs, from the upstream its index.json names
/// (fetched where missing), saying what was fetched and what the upstream lacks too.
fn from_upstream(args: &VerifyArgs, tree: &Tree) -> Result<Vec<SourcedFile>> {
    let lookup = Lookup {
        source_tree: args.source_tree.as_deref(),
        offline: args.tree.is_some(),
        endpoint: args.endpoint.as_deref(),
    };
    let sourced = upstream::sourced_files(&args.dir, tree, lookup)?;
    let Some(origin) = &sourced.origin else {
        return Ok(sourced.files);
    };
    let upstream = format!("{}@{}", origin.repo, origin.revision);
    for name in &sourced.absent_upstream {
        eprintln!(
            "warning: neither the publication nor its upstream {upstream} holds {name}: `minirun run` refuses an artifact without what it needs"
        );
    }
    for name in &sourced.fetched {
        eprintln!(
            "fetched {name} from {upstream} (the upstream the publication's index.json names)"
        );
    }
    Ok(sourced.files)
}
