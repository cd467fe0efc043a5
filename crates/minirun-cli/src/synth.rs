//! `minirun synth`: write a synthetic-deterministic MXFP4 container atomically.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use minirun_format::synthetic;

use crate::shown;

#[derive(Args)]
pub struct SynthArgs {
    /// Where to write the container (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Output rows per tile; rows x cols must be a multiple of 524288 so that the packed
    /// and scale sub-regions fill whole 16 KiB pages.
    #[arg(long, default_value_t = 2048)]
    pub rows: u32,
    /// Columns (the reduction length), a multiple of 32.
    #[arg(long, default_value_t = 4096)]
    pub cols: u32,
    /// Number of tiles.
    #[arg(long, default_value_t = 16)]
    pub tiles: u32,
    /// Seed of the deterministic content.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Record each tile's SHA-256 in the header (version 2; at most 508 tiles).
    #[arg(long)]
    pub digests: bool,
}

pub fn run(args: &SynthArgs) -> Result<ExitCode> {
    let dir = match args.out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let temp = tempfile::Builder::new()
        .prefix(".minirun-synth.")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a file in {}", shown(&dir)))?;
    let bar = ProgressBar::new(u64::from(args.tiles)).with_style(
        ProgressStyle::with_template("{bar:40} tile {pos}/{len} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let writer = BufWriter::with_capacity(4 << 20, temp.as_file());
    let (writer, container) = synthetic::write_mxfp4_container(
        writer,
        args.rows,
        args.cols,
        args.tiles,
        args.seed,
        args.digests,
        |_| bar.inc(1),
    )
    .context("cannot write the container")?;
    bar.finish_and_clear();
    let file: &File = writer.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    temp.persist(&args.out)
        .with_context(|| format!("cannot place {}", shown(&args.out)))?;
    println!(
        "wrote {} ({} bytes): MNRNTIL1 v{}, {} tiles of {} x {} mxfp4, seed {}{}",
        shown(&args.out),
        container.layout.total_bytes,
        container.version,
        args.tiles,
        args.rows,
        args.cols,
        args.seed,
        if args.digests {
            ", with tile digests"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}
