//! `minirun verify`: check an artifact directory against what the publisher released and hold
//! the result as evidence bound to the files.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use minirun_hub::{Hub, TreeBuilder};

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
    /// The Hub's origin (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long)]
    endpoint: Option<String>,
    /// Files hashed at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

pub fn run(args: &VerifyArgs) -> Result<ExitCode> {
    let (Some(repo), Some(revision)) = (&args.repo, &args.revision) else {
        bail!(
            "verify needs the publication to check against: --repo ID --revision SHA (asks the Hub), \
             optionally with --tree FILE (a saved tree listing). Offline verification against the \
             artifact's own manifest digests is not built yet, so nothing is claimed without them"
        );
    };
    let tree = match &args.tree {
        Some(path) => {
            if !minirun_hub::is_pinned_revision(revision) {
                bail!("{revision:?} is not a pinned revision (40 lowercase hex digits)");
            }
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let mut builder = TreeBuilder::default();
            builder
                .add_page(&bytes)
                .with_context(|| format!("{} is not a tree listing", path.display()))?;
            builder.finish(repo, revision)
        }
        None => Hub::from_env(args.endpoint.as_deref())?
            .tree(repo, revision)
            .with_context(|| format!("cannot list {repo}@{revision}"))?,
    };
    let total = tree.total_bytes();
    eprintln!(
        "verifying {} against {repo}@{revision}: {} files, {total} bytes",
        args.dir.display(),
        tree.files.len()
    );
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.max(1))
        .build()?;
    let started = Instant::now();
    // A kill keeps the per-file checkpoint; the next run continues from it.
    let never = std::sync::atomic::AtomicBool::new(false);
    let result = pool.install(|| minirun_store::verify(&args.dir, &tree, &|n| bar.inc(n), &never));
    bar.finish_and_clear();
    let verified = result
        .with_context(|| format!("{} does not match {repo}@{revision}", args.dir.display()))?;
    if verified.reused > 0 {
        eprintln!(
            "{} file(s) were taken from an interrupted earlier pass (identity unchanged), not hashed again",
            verified.reused
        );
    }
    let evidence = verified.evidence;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "verified: all {} files match {repo}@{revision} ({:.1} s, {:.0} MB/s); evidence written to {}",
        evidence.files.len(),
        seconds,
        total as f64 / 1e6 / seconds.max(1e-9),
        minirun_store::evidence::evidence_path(&args.dir).display()
    );
    Ok(ExitCode::SUCCESS)
}
