//! `minirun run`: decode from an artifact, fully resident.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use minirun_runtime::artifact::{Access, Artifact};
use minirun_runtime::config::DeepSeekV3Config;
use minirun_runtime::deepseek::DeepSeekV3;
use minirun_runtime::generate::{Sampling, StopReason, generate};
use minirun_runtime::text::Text;
use minirun_store::{HeldEvidence, StoreError};

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
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object (prompt ids, generated ids, text, figures) instead of streaming.
    #[arg(long)]
    json: bool,
}

fn access(args: &RunArgs) -> Result<Access> {
    if args.unverified {
        return Ok(Access::Unverified);
    }
    match HeldEvidence::load(&args.artifact) {
        Ok(held) => Ok(Access::Verified(Box::new(held))),
        Err(StoreError::NoEvidence { .. }) => bail!(
            "{} has no verification evidence, so its bytes are not known to be the published ones.\n\
             Verify it first: `minirun verify {0} --repo OWNER/NAME --revision SHA` (against the publisher) or \
             `minirun verify {0}` (offline, against its own manifests); or run it anyway with --unverified.",
            args.artifact.display()
        ),
        Err(e) => Err(e).context("the verification evidence does not hold"),
    }
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
    if let Some(threads) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build_global()
            .ok();
    }
    let artifact = Artifact::open(&args.artifact, access(args)?)?;
    let config = DeepSeekV3Config::parse(&artifact.config_json)?;
    let text = Text::new(
        artifact.tokenizer_json.as_deref(),
        artifact.tokenizer_config_json.as_deref(),
    )?;
    let prompt_text = if args.chat {
        text.chat_prompt(&args.prompt)?
    } else {
        args.prompt.clone()
    };
    // A rendered chat template carries its own BOS; a raw prompt gets the tokenizer's.
    let prompt = text.encode(&prompt_text, !args.chat)?;
    let mut stop = config.eos_token_ids.clone();
    stop.extend(text.eos_id());
    if args.ignore_eos {
        stop.clear();
    }
    let mut header = vec![
        format!("artifact {}", args.artifact.display()),
        format!(
            "deepseek_v3: {} layers, {} routed experts ({} per token), vocab {}",
            config.num_hidden_layers,
            config.n_routed_experts,
            config.num_experts_per_tok,
            config.vocab_size
        ),
        format!("{} bytes of weights resident", artifact.payload_bytes()),
        artifact.provenance.clone(),
    ];
    if !artifact.outside_evidence.is_empty() {
        header.push(format!(
            "read outside the evidence (not verified): {}",
            artifact.outside_evidence.join(", ")
        ));
    }
    let model = DeepSeekV3::load(&artifact, config)?;
    if !args.json {
        for line in &header {
            let mark = if args.unverified { "[UNVERIFIED] " } else { "" };
            eprintln!("{mark}{line}");
        }
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut shown = String::new();
    let mut so_far = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let (generated, figures) =
        generate(&model, &prompt, args.max_tokens, sampling, &stop, |token| {
            if args.json {
                return;
            }
            so_far.push(token);
            // Print only text that extends what is shown: a decode ending in a replacement
            // character may be half of a multi-byte character, and a byte-fallback tokenizer
            // can rewrite a tail it decoded before.
            if let Ok(now) = text.decode(&so_far)
                && !now.ends_with('\u{FFFD}')
                && let Some(new) = now.strip_prefix(shown.as_str())
            {
                let _ = write!(stdout, "{new}");
                let _ = stdout.flush();
                shown = now;
            }
        })?;
    let output = text.decode(&generated)?;
    if args.json {
        let report = serde_json::json!({
            "artifact": args.artifact.display().to_string(),
            "verified": !args.unverified,
            "provenance": artifact.provenance,
            "prompt_token_ids": prompt,
            "generated_token_ids": generated,
            "text": output,
            "prompt_tokens": figures.prompt_tokens,
            "prompt_seconds": figures.prompt_time.as_secs_f64(),
            "generated_tokens": figures.generated_tokens,
            "decode_steps": figures.decode_steps,
            "decode_seconds": figures.decode_time.as_secs_f64(),
            "tokens_per_second": figures.tokens_per_second(),
            "weight_bytes_per_token": figures.weight_bytes_per_token(),
            "resident_bytes": artifact.payload_bytes(),
            "stop_reason": figures.stop_reason,
            "read_outside_evidence": artifact.outside_evidence,
        });
        let _ = writeln!(stdout, "{report}");
    } else {
        match output.strip_prefix(shown.as_str()) {
            Some(rest) => {
                let _ = writeln!(stdout, "{rest}");
            }
            // The final decode is not an extension of what was streamed (a byte-fallback
            // tokenizer can rewrite its tail): say so rather than print a garbled mix.
            None => {
                eprintln!("(the streamed text's ending decodes differently in full: {output:?})")
            }
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
    }
    Ok(ExitCode::SUCCESS)
}
