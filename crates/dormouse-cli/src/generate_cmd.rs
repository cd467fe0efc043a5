//! `dormouse generate`: continue a prompt with a `.dmexp` model, streaming bytes to stdout.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Device;
use dormouse::sample::{Sampler, SamplingParams, generate};
use dormouse::serving::load_export;

#[derive(clap::Args)]
#[command(
    about = "Continue a prompt with a dormouse .dmexp export, streaming the bytes to stdout",
    after_help = "Examples:
  dormouse generate --export checkpoints/latest.bf16.dmexp --prompt \"once\" --max-tokens 64
  dormouse generate --export model.dmexp --prompt \"And God said\" --temperature 0.8 --top-p 0.95 --seed 7

generate takes an export and nothing else: turn a training run into one with `dormouse export run`."
)]
pub struct Args {
    /// The .dmexp file to run.
    #[arg(long)]
    export: PathBuf,
    /// The text to continue (its UTF-8 bytes).
    #[arg(long)]
    prompt: String,
    /// Bytes to generate (a dormouse model's tokens are bytes; `--steps` is the old name).
    #[arg(long, alias = "steps", default_value_t = 64)]
    max_tokens: usize,
    /// 0 is greedy (the most likely byte each step); above 0 samples.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample among the k most likely bytes only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely bytes whose probabilities reach p (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Seed of the sampling draws (the same seed gives the same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn main(args: Args) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generate: {}", error_line::one_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    params.validate()?;
    let served = load_export(&args.export, &Device::Cpu)?;
    let started = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let produced = generate(
        &served.model,
        args.prompt.as_bytes(),
        args.max_tokens,
        &mut Sampler::new(params),
        |byte| match stdout.write_all(&[byte]).and_then(|()| stdout.flush()) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                write_error = Some(e);
                ControlFlow::Break(())
            }
        },
    )
    .context("generation failed")?;
    if let Some(e) = write_error {
        return Err(e).context("cannot write to stdout");
    }
    writeln!(stdout)?;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{produced} bytes in {seconds:.2} s ({:.1} bytes/s)",
        produced as f64 / seconds.max(1e-9)
    );
    Ok(())
}
