//! `dormouse train`: train a dormouse model and keep the run in a checkpoint.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::Device;
use dormouse::DormouseConfig;
use dormouse::baselines;
use dormouse::data::Corpus;
use dormouse::engram::sidecar;
use dormouse::run_policy::{self, EngramFlags, SettingsOverrides};
use dormouse::train::{RunError, Trainer};
use dormouse::training_run::{self, RunEvent, Schedule, TrainLog};
use indicatif::{ProgressBar, ProgressStyle};

use crate::plot_cmd;

#[derive(clap::Args)]
#[command(
    about = "Train a byte-level dormouse model (with its Engram memory) and save the run as a checkpoint",
    after_help = "Examples:
  dormouse train --preset nano --steps 200                      # the embedded corpus, seconds on a laptop
  dormouse train --preset small --steps 3000 --data ./texts/    # your own files and folders
  dormouse train --resume --steps 6000                          # continue checkpoints/latest.bin to step 6000

A run is checkpoints/<name>.bin (model, AdamW moments, EMA teacher, trainer state) plus
<name>.config.toml, the exact config it trains. Turn it into one inference file with
`dormouse export run --ckpt-dir checkpoints --ckpt-name <name>`."
)]
pub struct Args {
    /// A preset config: nano (< 300k params) or small (~9.2M). Default: nano.
    #[arg(long, conflicts_with = "config")]
    preset: Option<String>,
    /// A config TOML file (see crates/dormouse/configs/*.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Training text: files and folders (walked recursively). Default: the embedded
    /// public-domain corpus (the King James Version, 4.3 MB).
    #[arg(long, value_name = "PATH", num_args = 1..)]
    data: Vec<PathBuf>,
    /// Total training steps (on --resume: the step to continue to).
    #[arg(long)]
    steps: Option<u64>,
    /// Windows per step. Default 8.
    #[arg(long)]
    batch: Option<usize>,
    /// Bytes per window. Default 256.
    #[arg(long)]
    seq: Option<usize>,
    /// Peak learning rate. Default 3e-3.
    #[arg(long)]
    lr: Option<f64>,
    /// Linear warmup steps. Default 50.
    #[arg(long)]
    warmup: Option<u64>,
    /// Learning rate at the end of the cosine decay. Default 3e-4.
    #[arg(long)]
    min_lr: Option<f64>,
    /// AdamW weight decay (matrices only). Default 0.01.
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Clip the global gradient norm to this. Default 1.0.
    #[arg(long)]
    grad_clip: Option<f64>,
    /// EMA teacher decay per step. Default 0.99.
    #[arg(long)]
    ema_decay: Option<f64>,
    /// Seed of initialisation and batch sampling. Default 1.
    #[arg(long)]
    seed: Option<u64>,
    /// Held-out tail of the corpus, never trained on. Default 65536.
    #[arg(long)]
    eval_bytes: Option<usize>,
    /// Where runs live.
    #[arg(long, default_value = "checkpoints")]
    ckpt_dir: PathBuf,
    /// The run's name: <ckpt-dir>/<name>.bin and <name>.config.toml.
    #[arg(long, default_value = "latest")]
    ckpt_name: String,
    /// Save every N steps (and always at the end). Default: only at the end.
    #[arg(long, default_value_t = 0)]
    save_every: u64,
    /// Evaluate held-out bits per byte every N steps (and at the end). Default: only at the end.
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// Continue the run saved as <ckpt-dir>/<ckpt-name>.bin.
    #[arg(long)]
    resume: bool,
    /// Keep the Engram memory in host RAM (saved as <ckpt-dir>/<ckpt-name>.ngram, which can be
    /// tens of GB) instead of in the model; the in-model tables shrink to one row per order, so
    /// an export of such a run cannot be served. Sets engram_ram in the config.
    #[arg(long)]
    engram_ram: bool,
    /// Rows per n-gram order of the host-RAM memory (implies --engram-ram). Default: the
    /// config's engram_slots (1000000).
    #[arg(long, value_name = "N")]
    engram_slots: Option<usize>,
    /// Append one JSON line per step and per evaluation to this file, and draw the curves
    /// beside it at each evaluation (run.jsonl: run.svg and run.png; see `dormouse plot`).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

impl Args {
    fn engram_flags(&self) -> EngramFlags {
        EngramFlags {
            ram: self.engram_ram,
            slots: self.engram_slots,
        }
    }

    fn settings(&self) -> SettingsOverrides {
        SettingsOverrides {
            steps: self.steps,
            batch: self.batch,
            seq: self.seq,
            lr: self.lr,
            warmup: self.warmup,
            min_lr: self.min_lr,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            ema_decay: self.ema_decay,
            seed: self.seed,
            eval_bytes: self.eval_bytes,
        }
    }
}

pub fn main(args: Args) -> ExitCode {
    let started = Instant::now();
    match run(args, started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run(args: Args, started: Instant) -> Result<()> {
    let device = Device::Cpu;
    fs::create_dir_all(&args.ckpt_dir)
        .with_context(|| format!("cannot create {}", args.ckpt_dir.display()))?;
    probe_writable(&args.ckpt_dir)?;
    let bin = args.ckpt_dir.join(format!("{}.bin", args.ckpt_name));
    let snapshot = args
        .ckpt_dir
        .join(format!("{}.config.toml", args.ckpt_name));
    let mut trainer = if args.resume {
        resume(&args, &bin, &snapshot, &device)?
    } else {
        start(&args, &bin, &snapshot, &device)?
    };
    let s = trainer.settings.clone();
    let bytes = match args.data.is_empty() {
        true => dormouse::data::EMBEDDED_CORPUS.to_vec(),
        false => dormouse::data::read_paths(&args.data)?,
    };
    let corpus = Corpus::new(bytes, s.eval_bytes, s.seq).context("cannot train on this corpus")?;
    let mut log = match &args.log {
        Some(path) => {
            TrainLog::append_to(path).with_context(|| format!("cannot open {}", path.display()))?
        }
        None => TrainLog::none(),
    };
    let params: usize = trainer
        .varmap
        .all_vars()
        .iter()
        .map(|v| v.elem_count())
        .sum();
    if let Some(host) = &trainer.host {
        let shape = host.shape();
        eprintln!(
            "the Engram memory lives in host RAM: {} orders x {} slots x {} ({} more parameters, saved as {})",
            shape.orders.len(),
            shape.slots,
            shape.dim,
            shape.orders.len() * shape.slots * shape.dim,
            sidecar::sidecar_path(&bin).display()
        );
    }
    eprintln!(
        "training {params} parameters on {} bytes ({} held out) from step {} to {}, batch {} x {} bytes",
        corpus.train().len(),
        corpus.held_out().len(),
        trainer.step,
        s.steps,
        s.batch,
        s.seq
    );
    let ready = started.elapsed().as_secs_f64();
    eprintln!(
        "ready to train {ready:.2} s after start (config, model, checkpoint and corpus loaded)"
    );
    log.startup(ready)?;
    report_baselines(&corpus, &mut log)?;
    train_loop(&mut trainer, &corpus, &args, &bin, &mut log)
}

fn probe_writable(dir: &Path) -> Result<()> {
    tempfile::tempfile_in(dir)
        .map(drop)
        .with_context(|| format!("the checkpoint folder {} is not writable", dir.display()))
}

/// The config a `--config` file or `--preset` names, if either was given.
fn asked_config(args: &Args) -> Result<Option<DormouseConfig>> {
    Ok(match (&args.config, &args.preset) {
        (Some(path), _) => {
            let text = fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Some(
                DormouseConfig::from_toml(&text)
                    .with_context(|| format!("{} is not a valid config", path.display()))?,
            )
        }
        (None, Some(preset)) => Some(DormouseConfig::preset(preset)?),
        (None, None) => None,
    })
}

fn start(args: &Args, bin: &Path, snapshot: &Path, device: &Device) -> Result<Trainer> {
    run_policy::refuse_existing_run(bin, &args.ckpt_name)?;
    let base = match asked_config(args)? {
        Some(cfg) => cfg,
        None => DormouseConfig::preset("nano")?,
    };
    let cfg = args.engram_flags().apply(base)?;
    let settings = args.settings().over_defaults();
    run_policy::check_settings_fit(&cfg, &settings)?;
    atomic_file::write_bytes(snapshot, cfg.to_toml().as_bytes())
        .with_context(|| format!("cannot write {}", snapshot.display()))?;
    Ok(Trainer::new(&cfg, settings, device)?)
}

fn resume(args: &Args, bin: &Path, snapshot: &Path, device: &Device) -> Result<Trainer> {
    let text = fs::read_to_string(snapshot)
        .with_context(|| format!("cannot resume: {} is missing", snapshot.display()))?;
    let cfg = DormouseConfig::from_toml(&text)
        .with_context(|| format!("{} is not a valid config", snapshot.display()))?;
    run_policy::check_resumed_config(snapshot, &cfg, asked_config(args)?, args.engram_flags())?;
    let mut trainer = Trainer::resume(&cfg, bin, device)
        .with_context(|| format!("cannot resume {}", bin.display()))?;
    trainer.settings = run_policy::resumed_settings(&trainer.settings, &args.settings())?;
    Ok(trainer)
}

fn report_baselines(corpus: &Corpus, log: &mut TrainLog) -> Result<()> {
    let b = baselines::measure(corpus.held_out())?;
    eprintln!(
        "held-out baselines (bits per byte; a trained model must beat them): gzip -9 {:.3}, xz -9 {:.3}, zstd -19 {:.3}, order-0 entropy {:.3}",
        b.gzip_9, b.xz_9, b.zstd_19, b.order0_entropy
    );
    Ok(log.baselines(&b)?)
}

fn train_loop(
    trainer: &mut Trainer,
    corpus: &Corpus,
    args: &Args,
    bin: &Path,
    log: &mut TrainLog,
) -> Result<()> {
    let bar = ProgressBar::new(trainer.settings.steps).with_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len} {msg} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(trainer.step);
    let mut plot = plot_cmd::LiveChart::default();
    let schedule = Schedule {
        eval_every: args.eval_every,
        save_every: args.save_every,
    };
    let ran = training_run::run_to_end(trainer, corpus, schedule, bin, log, |event| match event {
        RunEvent::Step {
            entry,
            done,
            tokens_per_s,
        } => {
            bar.set_message(format!(
                "loss {:.4} lr {:.2e} {tokens_per_s:.0} tok/s",
                entry.loss, entry.lr
            ));
            bar.set_position(done);
        }
        RunEvent::Evaluated(e) => bar.suspend(|| {
            eprintln!(
                "step {}: held-out bits per byte {:.4} (EMA teacher {:.4})",
                e.step, e.bpb, e.ema_bpb
            );
            if let Some(path) = &args.log {
                plot.redraw(path);
            }
        }),
        RunEvent::Saved { .. } => {}
    });
    match ran {
        Err(RunError::Diverged { step, loss }) => {
            bar.abandon();
            bail!(
                "the loss became {loss} at step {step}; the last good checkpoint ({}) is kept",
                bin.display()
            );
        }
        other => other?,
    }
    bar.finish_and_clear();
    if let Some((svg, png)) = &plot.drawn {
        eprintln!("curves drawn in {} and {}", svg.display(), png.display());
    }
    if trainer.host.is_some() {
        eprintln!(
            "saved step {} to {} and its host-RAM memory to {}; resume it with `dormouse train --resume`. \
             An export of this run has one memory row per order and `dormouse generate` refuses it: \
             train without --engram-ram for a servable model",
            trainer.step,
            bin.display(),
            sidecar::sidecar_path(bin).display()
        );
        return Ok(());
    }
    eprintln!(
        "saved step {} to {}; export it with: dormouse export run --ckpt-dir {} --ckpt-name {}",
        trainer.step,
        bin.display(),
        args.ckpt_dir.display(),
        args.ckpt_name
    );
    Ok(())
}
