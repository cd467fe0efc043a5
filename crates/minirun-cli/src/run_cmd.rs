//! `minirun run`: decode from an artifact, fully resident.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use minirun_runtime::generate::{Sampling, StopReason};
use minirun_runtime::session::{Session, Trust};

#[derive(Args)]
pub struct RunArgs {
    /// The artifact directory (written by `minirun pack` or `minirun download`).
    artifact: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Render the prompt as one user message with the artifact's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 is greedy; higher samples more freely.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample only among the most likely tokens whose probabilities sum to this.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler: the same seed gives the same continuation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past an end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Run without verification evidence (the output header says so on every line).
    #[arg(long)]
    unverified: bool,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
    /// Print one JSON object (prompt ids, generated ids, text, figures) instead of streaming.
    #[arg(long)]
    json: bool,
}

fn check_sampling(args: &RunArgs) -> Result<()> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!("--temperature must be a finite number >= 0 (0 is greedy)");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p must be in (0, 1]");
    }
    Ok(())
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    check_sampling(args)?;
    let trust = match args.unverified {
        true => Trust::Unverified,
        false => Trust::Verified,
    };
    let session = Session::open(&args.artifact, trust)?;
    let prompt = session.prompt_ids(&args.prompt, args.chat)?;
    let stop = match args.ignore_eos {
        true => Vec::new(),
        false => session.stop_ids(),
    };
    let model = session.model()?;
    if !args.json {
        let mark = if args.unverified { "[UNVERIFIED] " } else { "" };
        for line in session.header() {
            eprintln!("{mark}{line}");
        }
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut stdout = std::io::stdout().lock();
    let generation =
        session.generate(&model, &prompt, args.max_tokens, sampling, &stop, |new| {
            if !args.json {
                let _ = write!(stdout, "{new}");
                let _ = stdout.flush();
            }
        })?;
    let figures = &generation.figures;
    if args.json {
        let report = serde_json::json!({
            "artifact": args.artifact.display().to_string(),
            "verified": !args.unverified,
            "provenance": session.artifact.provenance,
            "prompt_token_ids": generation.prompt_ids,
            "generated_token_ids": generation.generated_ids,
            "text": generation.text,
            "prompt_tokens": figures.prompt_tokens,
            "prompt_seconds": figures.prompt_time.as_secs_f64(),
            "generated_tokens": figures.generated_tokens,
            "decode_steps": figures.decode_steps,
            "decode_seconds": figures.decode_time.as_secs_f64(),
            "tokens_per_second": figures.tokens_per_second(),
            "weight_bytes_per_token": figures.weight_bytes_per_token(),
            "resident_bytes": session.artifact.payload_bytes(),
            "stop_reason": figures.stop_reason,
            "read_outside_evidence": session.artifact.outside_evidence,
        });
        let _ = writeln!(stdout, "{report}");
        return Ok(ExitCode::SUCCESS);
    }
    match generation.text.strip_prefix(generation.streamed.as_str()) {
        Some(rest) => {
            let _ = writeln!(stdout, "{rest}");
        }
        // The final decode is not an extension of what was streamed (a byte-fallback
        // tokenizer can rewrite its tail): say so rather than print a garbled mix.
        None => eprintln!(
            "(the streamed text's ending decodes differently in full: {:?})",
            generation.text
        ),
    }
    eprintln!(
        "{} prompt tokens in {:.2} s; {} tokens generated ({}), {:.2} tokens/s; {} bytes of weights read per token",
        figures.prompt_tokens,
        figures.prompt_time.as_secs_f64(),
        figures.generated_tokens,
        match figures.stop_reason {
            StopReason::MaxTokens => "--max-tokens reached",
            StopReason::EndOfSequence => "end of sequence",
            StopReason::ContextFull => "max_position_embeddings reached",
        },
        figures.tokens_per_second(),
        figures.weight_bytes_per_token()
    );
    Ok(ExitCode::SUCCESS)
}
