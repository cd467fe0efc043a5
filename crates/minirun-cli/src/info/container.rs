//! `minirun info CONTAINER [--verify-tiles]`: the header, and optionally every tile checked.

use dmexp::identify::printable_lines;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use minirun_format::tile::{HEADER_BYTES, TileCheck, TileContainer};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::json;

use crate::shown;

/// What `minirun info` was asked to do with a tile container.
pub struct ContainerRequest {
    pub as_json: bool,
    /// Check every tile against its digest (exit 1 on a failure).
    pub verify_tiles: bool,
}

pub fn run(path: &Path, asked: ContainerRequest) -> Result<ExitCode> {
    let file = regular_file::open(path).with_context(|| format!("cannot open {}", shown(path)))?;
    let file_len = file.metadata()?.len();
    let mut header = vec![0u8; HEADER_BYTES.min(file_len) as usize];
    file.read_exact_at(&mut header, 0)?;
    let container = TileContainer::parse(&header, file_len)
        .with_context(|| format!("{} is not a valid tile container", shown(path)))?;
    let report = if asked.verify_tiles {
        Some(verify_tiles(&file, &container)?)
    } else {
        None
    };
    if asked.as_json {
        let doc = json!({ "kind": "tile-container", "path": shown(path), "file_bytes": file_len,
                          "container": container, "verification": report });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", printable_lines(&describe(path, file_len, &container)));
        if let Some(r) = &report {
            print!("{}", printable_lines(&r.describe()));
        }
    }
    Ok(match report {
        Some(r) if !r.failures.is_empty() => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

fn describe(path: &Path, file_len: u64, c: &TileContainer) -> String {
    let g = &c.geometry;
    let l = &c.layout;
    let kind = if c.content_kind_declared {
        c.content_kind.to_string()
    } else {
        format!(
            "{} (implied: version 1 cannot state its content kind)",
            c.content_kind
        )
    };
    let digests = match &c.digests {
        Some(d) => format!("{} SHA-256 tile digests in the header", d.len()),
        None => {
            "none (tiles can only be checked against an external digest or regenerated)".to_string()
        }
    };
    let trailing = file_len.saturating_sub(l.total_bytes);
    let lines = [
        format!(
            "container   {} ({file_len} bytes{})",
            shown(path),
            if trailing > 0 {
                format!(", {trailing} past the last tile")
            } else {
                String::new()
            }
        ),
        format!("format      MNRNTIL1 version {}", c.version),
        format!(
            "mode        {} ({}-bit elements, group {})",
            g.mode, g.bits, g.group_size
        ),
        format!(
            "scales      {} ({} row(s) per scale)",
            g.scale_dtype, g.scale_block_rows
        ),
        format!("content     {kind}; seed {}", c.seed),
        format!("flags       {}", c.flags),
        format!(
            "geometry    {} tiles of {} rows x {} cols ({} rows in all)",
            g.tile_count,
            g.rows,
            g.cols,
            u64::from(g.rows) * u64::from(g.tile_count)
        ),
        format!(
            "tile        stride {} = packed {} (region {}) + scales {} (region {}){}",
            l.tile_stride,
            l.packed_bytes,
            l.packed_region,
            l.scale_bytes,
            l.scale_region,
            if l.bias_bytes > 0 {
                format!(
                    " + biases {} (region {}) at {}",
                    l.bias_bytes, l.bias_region, l.bias_offset
                )
            } else {
                String::new()
            }
        ),
        format!(
            "total       {} bytes = 16384 header + {} x {}",
            l.total_bytes, g.tile_count, l.tile_stride
        ),
        format!("digests     {digests}"),
    ];
    lines.join("\n") + "\n"
}

/// The outcome of checking every tile.
#[derive(Debug, Serialize)]
struct VerifyReport {
    method: &'static str,
    tiles: u32,
    bytes: u64,
    seconds: f64,
    threads: usize,
    failures: Vec<String>,
}

impl VerifyReport {
    fn describe(&self) -> String {
        let gbps = self.bytes as f64 / self.seconds.max(1e-9) / 1e9;
        let mut s = format!(
            "verified    {} tiles, {} bytes by {} in {:.2} s ({gbps:.2} GB/s, {} threads): {}\n",
            self.tiles,
            self.bytes,
            self.method,
            self.seconds,
            self.threads,
            if self.failures.is_empty() {
                "all ok".to_string()
            } else {
                format!("{} FAILED", self.failures.len())
            }
        );
        for f in &self.failures {
            s.push_str(&format!("  {f}\n"));
        }
        s
    }
}

fn verify_tiles(file: &File, c: &TileContainer) -> Result<VerifyReport> {
    let method = TileCheck::method(c).map_err(|_| {
        anyhow::anyhow!(
            "this checkpoint-derived container carries no tile digests: its tiles can only be checked \
             against an external digest (minirun verify against the publisher's tree)"
        )
    })?;
    let total = u64::from(c.geometry.tile_count) * c.layout.tile_stride;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let failures: Vec<String> = (0..u64::from(c.geometry.tile_count))
        .into_par_iter()
        .filter_map(|i| {
            c.check_tile_from(
                i,
                |offset, buf| file.read_exact_at(buf, offset),
                |n| bar.inc(n),
            )
            .err()
            .map(|e| format!("tile {i}: {e}"))
        })
        .collect();
    bar.finish_and_clear();
    Ok(VerifyReport {
        method,
        tiles: c.geometry.tile_count,
        bytes: total,
        seconds: start.elapsed().as_secs_f64(),
        threads: rayon::current_num_threads(),
        failures,
    })
}
