//! `dormouse plot`: a training log drawn as a chart (held-out and training bits per byte
//! against steps, the compressors' baselines, the learning rate), written as SVG and PNG. `train`
//! and `quickstart` draw theirs through [`write_beside`] at each evaluation.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
#[command(
    about = "Draw a training log (dormouse train --log) as a chart: bits per byte against steps, with the gzip/xz/zstd baselines and the learning rate",
    after_help = "Without --out, writes LOG's name with .svg and .png beside it (run.jsonl: run.svg, run.png).

Example:
  dormouse train --steps 300 --log run.jsonl     # draws run.svg and run.png at each evaluation
  dormouse plot run.jsonl --out curves.svg"
)]
pub struct Args {
    /// The JSON Lines log `dormouse train --log` wrote.
    log: PathBuf,
    /// Where to write the chart: a .svg or .png file (the format follows the extension).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("plot: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<Vec<PathBuf>> {
    let Some(out) = &args.out else {
        let (svg, png) = write_beside(&args.log)?;
        return Ok(vec![svg, png]);
    };
    let curves = read_curves(&args.log)?;
    let bytes = match out.extension().and_then(|e| e.to_str()) {
        Some("svg") => training_plot::svg(&curves)?.into_bytes(),
        Some("png") => training_plot::png(&curves)?,
        _ => bail!(
            "--out {} names no chart format: give a file ending in .svg or .png",
            out.display()
        ),
    };
    write(out, &bytes)?;
    Ok(vec![out.clone()])
}

/// Draws the log at `log` as `LOG.svg` and `LOG.png` beside it (the log's extension replaced);
/// returns their paths.
pub fn write_beside(log: &Path) -> Result<(PathBuf, PathBuf)> {
    let (svg, png) = (log.with_extension("svg"), log.with_extension("png"));
    if svg == log || png == log {
        bail!(
            "{} ends in .svg or .png, so its chart would replace it: give the log a .jsonl name, or --out",
            log.display()
        );
    }
    let curves = read_curves(log)?;
    write(&svg, training_plot::svg(&curves)?.as_bytes())?;
    write(&png, &training_plot::png(&curves)?)?;
    Ok((svg, png))
}

fn read_curves(log: &Path) -> Result<training_plot::Curves> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("cannot read {}", log.display()))?;
    training_plot::read(&text).with_context(|| format!("cannot plot {}", log.display()))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_file::write_bytes(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The run's chart, redrawn beside its log at each evaluation. A chart that cannot be drawn
/// is said once and the training goes on: the log it comes from is intact.
#[derive(Default)]
pub struct LiveChart {
    pub drawn: Option<(PathBuf, PathBuf)>,
    failed: bool,
}

impl LiveChart {
    pub fn redraw(&mut self, log: &Path) {
        match write_beside(log) {
            Ok(paths) => self.drawn = Some(paths),
            Err(e) if !self.failed => {
                self.failed = true;
                eprintln!(
                    "the curves could not be drawn ({}); training goes on, and `dormouse plot {}` draws them later",
                    error_line::one_line(&e),
                    log.display()
                );
            }
            Err(_) => {}
        }
    }
}
