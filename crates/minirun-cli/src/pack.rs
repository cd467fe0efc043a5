//! `minirun pack` and `minirun check`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use indicatif::{ProgressBar, ProgressStyle};
use minirun_format::artifact::{LAYOUTS, Layout};
use minirun_pack::{CheckError, PackOptions};
use serde_json::json;

use crate::shown;

#[derive(Args)]
pub struct PackArgs {
    /// The upstream checkpoint directory: config.json, *.safetensors shards, tokenizer files, licence.
    #[arg(long, value_name = "CHECKPOINT_DIR")]
    pub source: PathBuf,
    /// The artifact directory to write (new, empty, or a previous pack's output).
    #[arg(long, value_name = "ARTIFACT_DIR")]
    pub out: PathBuf,
    /// The Hugging Face repo the checkpoint was published as (owner/name); with
    /// --source-revision it makes index.json name its upstream and carry identities.
    #[arg(long, value_name = "OWNER/NAME", requires = "source_revision")]
    pub source_repo: Option<String>,
    /// The pinned upstream commit (40 lowercase hex characters).
    #[arg(long, value_name = "SHA", requires = "source_repo")]
    pub source_revision: Option<String>,
    /// The artifact layout to write: minirun's own; the published Kimi K3 layout
    /// (docs/formats/k3-published.md) from a K3 checkpoint with MXFP4 routed experts and every
    /// other tensor F32 or BF16, under the upstream tensor names or mlx-lm's; or the published
    /// DeepSeek V4 layout (docs/formats/v4-published.md) from a checkpoint in DeepSeek's own
    /// storage (needs --source-repo and --source-revision, which every manifest names).
    #[arg(long, value_name = "LAYOUT", default_value = "minirun", value_parser = layout_names())]
    pub layout: Layout,
    /// Sign the artifact once packed, as `minirun sign --key KEYFILE` does (minirun's own
    /// layout only: the published layouts' manifests record no payload digests to sign).
    #[arg(long, value_name = "KEYFILE")]
    pub sign: Option<PathBuf>,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
}

/// The layouts by the names `minirun_format`'s table gives them.
fn layout_names() -> impl TypedValueParser<Value = Layout> {
    let names = LAYOUTS.iter().map(|row| row.name);
    PossibleValuesParser::new(names)
        .try_map(|name: String| Layout::from_name(&name).ok_or(format!("no layout {name}")))
}

#[derive(Args)]
pub struct CheckArgs {
    /// The artifact directory written by `minirun pack`.
    pub artifact: PathBuf,
    /// The checkpoint directory it was packed from.
    #[arg(long, value_name = "CHECKPOINT_DIR")]
    pub source: PathBuf,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
}

/// A progress bar over the checkpoint's tensor bytes (read from the shard headers only).
pub(crate) fn bytes_bar(source: &std::path::Path) -> ProgressBar {
    let total = minirun_pack::checkpoint::Checkpoint::open(source)
        .map(|c| c.tensors.values().map(|t| t.len).sum())
        .unwrap_or(0);
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

pub fn pack(args: &PackArgs) -> Result<ExitCode> {
    if args.sign.is_some() && args.layout != Layout::Own {
        anyhow::bail!(
            "--sign signs minirun's own layout only: the published layouts' manifests record no payload digests for a statement to cover"
        );
    }
    match args.layout {
        Layout::K3Published => return pack_k3_published(args),
        Layout::V4Published => return pack_v4_published(args),
        Layout::Own => {}
    }
    let opts = provenance(args);
    let bar = bytes_bar(&args.source);
    let start = Instant::now();
    let summary = minirun_pack::pack(&args.source, &args.out, &opts, &|n| bar.inc(n))
        .with_context(|| {
            format!(
                "cannot pack {} into {}",
                shown(&args.source),
                shown(&args.out)
            )
        })?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "artifact": shown(&args.out), "seconds": seconds, "summary": summary })
            )?
        );
    } else {
        println!(
            "packed {} -> {}: {} units, {} payload files ({} tile containers, {} quantized matrices kept as plain streams), {} bytes in {seconds:.2} s",
            shown(&args.source),
            shown(&args.out),
            summary.units.len(),
            summary.payload_files,
            summary.tile_containers,
            summary.quantized_as_plain,
            summary.payload_bytes
        );
        println!("copied verbatim: {}", summary.copied_files.join(", "));
        for w in &summary.warnings {
            eprintln!("warning: {w}");
        }
        println!(
            "next: minirun check {} --source {}",
            shown(&args.out),
            shown(&args.source)
        );
    }
    if let Some(key) = &args.sign {
        crate::sign::sign_artifact(&args.out, key)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The upstream's identity, as the published layouts record it.
fn provenance(args: &PackArgs) -> PackOptions {
    PackOptions {
        source_repo: args.source_repo.clone(),
        source_revision: args.source_revision.clone(),
    }
}

/// What a write into a published layout says: the JSON summary, or its lines.
struct Report<'a, S> {
    layout: &'a str,
    seconds: f64,
    summary: &'a S,
    lines: Vec<String>,
}

fn report<S: serde::Serialize>(args: &PackArgs, r: Report<'_, S>) -> Result<ExitCode> {
    match args.json {
        true => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "artifact": shown(&args.out), "layout": r.layout,
                "seconds": r.seconds, "summary": r.summary,
            }))?
        ),
        false => r.lines.iter().for_each(|line| println!("{line}")),
    }
    Ok(ExitCode::SUCCESS)
}

fn pack_k3_published(args: &PackArgs) -> Result<ExitCode> {
    let opts = provenance(args);
    let bar = bytes_bar(&args.source);
    let start = Instant::now();
    let summary = minirun_pack::k3_published::pack_k3_published(
        &args.source,
        &args.out,
        minirun_pack::k3_published::BandSizes::default(),
        &opts,
        &|n| bar.inc(n),
    )
    .with_context(|| {
        format!(
            "cannot write {} in the published Kimi K3 layout into {}",
            shown(&args.source),
            shown(&args.out)
        )
    })?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if opts.source_repo.is_none() && !args.json {
        eprintln!(
            "warning: no --source-repo/--source-revision: index.json names no upstream and carries no tokenizer identity"
        );
    }
    let lines = vec![
        format!(
            "wrote {} ({} names) -> {} in the published Kimi K3 layout: {} layers, {} payload files, {} bytes in {seconds:.2} s",
            shown(&args.source),
            summary.naming,
            shown(&args.out),
            summary.layers,
            summary.payload_files,
            summary.payload_bytes
        ),
        format!("copied verbatim: {}", summary.copied_files.join(", ")),
        format!(
            "next: minirun info {}/layer00/manifest.json",
            shown(&args.out)
        ),
    ];
    report(
        args,
        Report {
            layout: Layout::K3Published.name(),
            seconds,
            summary: &summary,
            lines,
        },
    )
}

fn pack_v4_published(args: &PackArgs) -> Result<ExitCode> {
    let bar = bytes_bar(&args.source);
    let start = Instant::now();
    let summary = minirun_pack::v4_published::pack_v4_published(
        &args.source,
        &args.out,
        &provenance(args),
        &|n| bar.inc(n),
    )
    .with_context(|| {
        format!(
            "cannot write {} in the published DeepSeek V4 layout into {}",
            shown(&args.source),
            shown(&args.out)
        )
    })?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let out = shown(&args.out);
    let lines = vec![
        format!(
            "wrote {} -> {out} in the published DeepSeek V4 layout: {} units, {} payload files, {} bytes in {seconds:.2} s",
            shown(&args.source),
            summary.units,
            summary.payload_files,
            summary.payload_bytes
        ),
        format!("copied verbatim: {}", summary.copied_files.join(", ")),
        format!(
            "next: minirun verify {out} --repo OWNER/NAME --revision SHA (once published; offline verification reads minirun's own layout only), or minirun run {out} --unverified"
        ),
    ];
    report(
        args,
        Report {
            layout: Layout::V4Published.name(),
            seconds,
            summary: &summary,
            lines,
        },
    )
}

pub fn check(args: &CheckArgs) -> Result<ExitCode> {
    let bar = bytes_bar(&args.source);
    let result = minirun_pack::check(&args.artifact, &args.source, &|n| bar.inc(n));
    bar.finish_and_clear();
    match result {
        Ok(report) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "identical": true, "report": report }))?
                );
            } else {
                println!(
                    "identical: {} files in {} units ({} bytes) match the source byte for byte",
                    report.files,
                    report.units.len(),
                    report.bytes_compared
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(CheckError::Differs(d)) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "identical": false, "difference": d }))?
                );
            }
            eprintln!("minirun: {}", CheckError::Differs(d));
            Ok(ExitCode::from(1))
        }
        Err(other) => Err(other).context("cannot check the artifact"),
    }
}
