//! `minirun catalog` and `minirun download`: the Hugging Face side.

use dmexp::identify::printable;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use minirun_hub::{DownloadOptions, Hub};

#[derive(Args)]
pub struct CatalogArgs {
    /// The account whose `<name>-minirun` repositories to list.
    #[arg(long, default_value = "nanguoyu")]
    author: String,
    /// The Hub's origin (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long)]
    endpoint: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DownloadArgs {
    /// The repository, e.g. nanguoyu/Kimi-K3-minirun.
    #[arg(long)]
    repo: String,
    /// The commit to download: 40 lowercase hex digits (a branch name is refused: it can move).
    #[arg(long)]
    revision: String,
    /// Where to put the files (created if missing; files already there with the right digest
    /// are kept, partial files from an interrupted run are continued).
    #[arg(long)]
    out: PathBuf,
    /// Files fetched at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// The Hub's origin (default: $HF_ENDPOINT, else https://huggingface.co).
    #[arg(long)]
    endpoint: Option<String>,
}

pub fn catalog(args: &CatalogArgs) -> Result<ExitCode> {
    let hub = Hub::from_env(args.endpoint.as_deref())?;
    let entries = hub
        .catalog(&args.author)
        .with_context(|| format!("cannot list {}'s artifacts", args.author))?;
    if args.json {
        let list: Vec<_> = entries
            .iter()
            .map(|e| serde_json::json!({"name": e.name, "repo": e.repo, "revision": e.sha}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        println!("{} has no repositories named <name>-minirun", args.author);
    }
    for e in &entries {
        println!(
            "{:<40} {}  {}",
            printable(&e.name),
            printable(&e.sha),
            printable(&e.repo)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn download(args: &DownloadArgs) -> Result<ExitCode> {
    let hub = Hub::from_env(args.endpoint.as_deref())?;
    let tree = hub
        .tree(&args.repo, &args.revision)
        .with_context(|| format!("cannot list {}@{}", args.repo, args.revision))?;
    let total = tree.total_bytes();
    eprintln!(
        "{}@{}: {} files, {} bytes, from {}",
        tree.repo,
        tree.revision,
        tree.files.len(),
        total,
        hub.endpoint()
    );
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let options = DownloadOptions {
        parallel: args.parallel.max(1),
        ..DownloadOptions::default()
    };
    let report = hub
        .download(&tree, &args.out, &options, &|n| bar.inc(n))
        .with_context(|| format!("download into {} stopped", args.out.display()))?;
    bar.finish_and_clear();
    eprintln!(
        "{} files fetched ({} continued from an earlier run), {} already in place; {} bytes received in {:.1} s; every file's size and published digest matched the tree",
        report.fetched.len(),
        report.resumed.len(),
        report.already_present.len(),
        report.bytes_received,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
