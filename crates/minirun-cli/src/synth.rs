//! `minirun synth`: write a synthetic-deterministic MXFP4 container atomically.

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
    let bar = ProgressBar::new(u64::from(args.tiles)).with_style(
        ProgressStyle::with_template("{bar:40} tile {pos}/{len} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let container = atomic_file::write_with(&args.out, atomic_file::Options::default(), |file| {
        let writer = BufWriter::with_capacity(4 << 20, file);
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
        writer.into_inner().map_err(|e| e.into_error())?;
        anyhow::Ok(container)
    })
    .with_context(|| format!("cannot write {}", shown(&args.out)))?;
    bar.finish_and_clear();
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
