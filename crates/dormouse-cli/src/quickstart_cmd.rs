//! `dormouse quickstart`: the whole path in one command. Trains `nano` on the embedded corpus, exports
//! it as bf16 (its log and curves beside), explains the export and generates a sample, printing where each file went and
//! the commands to try next.

use std::fs;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Device;
use dmexp::Dtype;
use dormouse::DormouseConfig;
use dormouse::baselines::measure;
use dormouse::data::Corpus;
use dormouse::export::{ExportRequest, export_run};
use dormouse::sample::{Sampler, SamplingParams, generate};
use dormouse::serving::load_export;
use dormouse::train::{TrainSettings, Trainer};
use dormouse::training_run::{self, RunEvent, Schedule, TrainLog};
use indicatif::{ProgressBar, ProgressStyle};

use crate::plot_cmd::LiveChart;

#[derive(clap::Args)]
#[command(
    about = "Train nano on the embedded corpus, export it, explain the export and generate a sample (about 2 minutes)",
    after_help = "Examples:
  dormouse quickstart
  dormouse quickstart --dir /tmp/qs --steps 300 --prompt \"In the beginning\""
)]
pub struct Args {
    /// Folder for the run and the export (a rerun replaces what the last one wrote there).
    #[arg(long, default_value = "quickstart")]
    dir: PathBuf,
    /// Training steps (1200: about 80 s on a 2-core machine).
    #[arg(long, default_value_t = 1200)]
    steps: u64,
    /// Prompt for the sample.
    #[arg(long, default_value = "And God said")]
    prompt: String,
}

pub fn main(args: Args) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let ckpt_dir = args.dir.join("checkpoints");
    fs::create_dir_all(&ckpt_dir)
        .with_context(|| format!("cannot create {}", ckpt_dir.display()))?;
    let cfg = DormouseConfig::preset("nano")?;
    let settings = TrainSettings {
        steps: args.steps,
        batch: 8,
        seq: 128,
        lr: 1e-2,
        warmup: 20,
        min_lr: 1e-3,
        ..TrainSettings::default()
    };
    let corpus = Corpus::new(
        dormouse::data::EMBEDDED_CORPUS.to_vec(),
        settings.eval_bytes,
        settings.seq,
    )?;
    println!(
        "1/4 training nano ({} steps of {} x {} bytes) on the embedded King James Version",
        settings.steps, settings.batch, settings.seq
    );
    let mut trainer = Trainer::new(&cfg, settings.clone(), &Device::Cpu)?;
    let bin = ckpt_dir.join("latest.bin");
    let (log_path, baselines) = (args.dir.join("run.jsonl"), measure(corpus.held_out())?);
    let mut log = fresh_log(&log_path)?;
    log.baselines(&baselines)?;
    let bar = ProgressBar::new(settings.steps).with_style(
        ProgressStyle::with_template("    {bar:30} step {pos}/{len} {msg} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let schedule = Schedule {
        eval_every: (settings.steps / 4).max(1),
        save_every: 0,
    };
    let (mut chart, mut last) = (LiveChart::default(), None);
    training_run::run_to_end(
        &mut trainer,
        &corpus,
        schedule,
        &bin,
        &mut log,
        |event| match event {
            RunEvent::Step { entry, done, .. } => {
                bar.set_message(format!("loss {:.3}", entry.loss));
                bar.set_position(done);
            }
            RunEvent::Evaluated(e) => {
                last = Some(e.bpb);
                bar.suspend(|| chart.redraw(&log_path));
            }
            RunEvent::Saved { .. } => {}
        },
    )?;
    bar.finish_and_clear();
    atomic_file::write_bytes(
        &ckpt_dir.join("latest.config.toml"),
        cfg.to_toml().as_bytes(),
    )?;
    println!(
        "    held-out bits per byte {:.3} (an untrained model: 8; on the same bytes gzip -9 {:.3}, xz -9 {:.3})\n    run saved to {} (+ latest.config.toml)\n    log {}",
        last.unwrap_or(f64::NAN),
        baselines.gzip_9,
        baselines.xz_9,
        bin.display(),
        log_path.display()
    );
    if let Some((svg, png)) = &chart.drawn {
        println!(
            "    curves drawn in {} and {}",
            svg.display(),
            png.display()
        );
    }

    println!("2/4 exporting bf16");
    let exported = export_run(&ExportRequest {
        ckpt_dir: ckpt_dir.clone(),
        ckpt_name: "latest".into(),
        dtype: Dtype::Bf16,
        out: None,
        preset: None,
    })?;
    println!(
        "    {} ({} bytes; the training checkpoint is {} bytes)",
        exported.out.display(),
        exported.written.file_len(),
        fs::metadata(&bin)?.len()
    );

    println!("3/4 dormouse export info {}", exported.out.display());
    for line in dmexp::info(&exported.out)?.render_text().lines() {
        println!("    {line}");
    }

    println!(
        "4/4 dormouse generate --export {} --prompt {:?} --max-tokens 200",
        exported.out.display(),
        args.prompt
    );
    let served = load_export(&exported.out, &Device::Cpu)?;
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "    {}", args.prompt)?;
    generate(
        &served.model,
        args.prompt.as_bytes(),
        200,
        &mut Sampler::new(SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            seed: 1,
        }),
        |byte| {
            let shown: &[u8] = if byte == b'\n' { b"\n    " } else { &[byte] };
            match stdout.write_all(shown).and_then(|()| stdout.flush()) {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        },
    )?;
    writeln!(stdout)?;
    let out = exported.out.display();
    println!(
        "\ndone in {:.0} s. Next:\n  cargo run --release -p dormouse-cli -- generate --export {out} --prompt \"In the beginning\" --temperature 0.8 --seed 3\n  cargo run --release -p dormouse-cli -- serve --export {out} --port 8000\n  cargo run --release -p dormouse-cli -- train --preset small --steps 300 --log run.jsonl   # a bigger model",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The quickstart's log, emptied: a rerun replaces what the last one wrote.
fn fresh_log(path: &std::path::Path) -> Result<TrainLog> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot replace {}", path.display()));
        }
        _ => {}
    }
    TrainLog::append_to(path).with_context(|| format!("cannot open {}", path.display()))
}
