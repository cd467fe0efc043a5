//! `dormouse export`: turn a training run into one `.dmexp` inference file, and explain any file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Subcommand;
use dmexp::{Dtype, FileKind};
use dormouse::export::{ConfigSource, ExportRequest, export_run};

#[derive(clap::Args)]
#[command(
    about = "Turn a dormouse training run into one self-describing, checksummed .dmexp file, and explain any file",
    after_help = "Examples:
  dormouse export run --ckpt-dir checkpoints --ckpt-name latest            # -> checkpoints/latest.bf16.dmexp
  dormouse export run --ckpt-dir checkpoints --ckpt-name latest --dtype f32
  dormouse export info checkpoints/latest.bf16.dmexp                       # header, sizes, CRC check
  dormouse export info some-file --json"
)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export the run <ckpt-dir>/<ckpt-name>.bin with the config snapshot beside it. Reads the
    /// model and trainer sections only: never the optimizer, the EMA teacher or a .ngram sidecar.
    #[command(after_help = "Examples:
  dormouse export run --ckpt-dir checkpoints --ckpt-name latest            # -> checkpoints/latest.bf16.dmexp
  dormouse export run --ckpt-dir checkpoints --ckpt-name latest --dtype f32")]
    Run {
        /// Where the run lives.
        #[arg(long, default_value = "checkpoints")]
        ckpt_dir: PathBuf,
        /// The run's name (<ckpt-dir>/<name>.bin).
        #[arg(long, default_value = "latest")]
        ckpt_name: String,
        /// Storage type of the weights: f32 (exact), f16 or bf16 (half the size; loaded as f32).
        #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
        dtype: Dtype,
        /// Output file. Default <ckpt-dir>/<ckpt-name>.<dtype>.dmexp. An existing one is replaced
        /// only when it is an earlier .dmexp export (or empty): one of the run's own files (by
        /// any name), any other file, or anything but a regular file is refused.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only when <ckpt-name>.config.toml is absent: the preset whose shape to assume
        /// (recorded in the export as a guess).
        #[arg(long)]
        preset: Option<String>,
    },
    /// Describe a .dmexp file (every header field, sizes, CRC verified) without building a
    /// model; for any other file, say what it is.
    #[command(after_help = "Examples:
  dormouse export info checkpoints/latest.bf16.dmexp                       # header, sizes, CRC check
  dormouse export info some-file --json")]
    Info {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn parse_dtype(text: &str) -> Result<Dtype, String> {
    text.parse::<Dtype>().map_err(|e| e.to_string())
}

pub fn main(args: Args) -> ExitCode {
    match args.command {
        Command::Run {
            ckpt_dir,
            ckpt_name,
            dtype,
            out,
            preset,
        } => report(run(ExportRequest {
            ckpt_dir,
            ckpt_name,
            dtype,
            out,
            preset,
        })),
        Command::Info { file, json } => info(&file, json),
    }
}

fn report(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("export: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run(req: ExportRequest) -> Result<()> {
    let started = Instant::now();
    let bin = req.checkpoint_path();
    let done = export_run(&req).with_context(|| format!("cannot export {}", bin.display()))?;
    if let ConfigSource::GuessedPreset(preset) = &done.config_source {
        eprintln!(
            "WARNING: {} is absent; the shape of these weights was GUESSED from preset {preset:?} \
             (recorded in the export's source). If the run used another config, this export is wrong.",
            req.snapshot_path().display()
        );
    }
    let header = &done.written.header;
    eprintln!(
        "wrote {} ({} bytes, {} params in {} tensors, {}, step {}) in {:.2} s",
        done.out.display(),
        done.written.file_len(),
        header.num_params,
        header.num_tensors(),
        header.dtype.name(),
        done.step,
        started.elapsed().as_secs_f64()
    );
    if header.flushed > 0 {
        eprintln!(
            "note: {} non-zero weights were below {}'s range and are stored as 0",
            header.flushed,
            header.dtype.name()
        );
    }
    if let Err(refusal) = dormouse::serving::refuse_unservable_memory(&done.config) {
        eprintln!("WARNING: generate and serve will refuse this export: {refusal}");
    } else {
        eprintln!(
            "next: dormouse export info {0} | dormouse generate --export {0} --prompt \"once\" --max-tokens 64",
            done.out.display()
        );
    }
    Ok(())
}

fn info(file: &Path, json: bool) -> ExitCode {
    match dmexp::info(file) {
        Ok(info) => {
            match json {
                true => println!("{}", info.to_json()),
                false => print!("{}", info.render_text()),
            }
            ExitCode::SUCCESS
        }
        Err(dmexp::Error::NotAnExport { kind, advice }) => not_an_export(&kind, &advice, json),
        Err(e) => {
            let err = anyhow::Error::new(e).context(file.display().to_string());
            eprintln!("export info: {}", error_line::one_line(&err));
            ExitCode::from(1)
        }
    }
}

fn not_an_export(kind: &FileKind, advice: &str, json: bool) -> ExitCode {
    if json {
        println!(
            "{}",
            serde_json::json!({ "is_export": false, "kind": kind.label(), "advice": advice })
        );
    }
    eprintln!("export info: {advice}");
    ExitCode::from(1)
}
