//! `minirun bench model ARTIFACT`: prompt processing and decoding tokens/s of an artifact, timed
//! as llama.cpp's `llama-bench` times them (a warm-up, then the mean and standard deviation of
//! `--repeats` passes, each from an empty cache; `timed_passes.rs`), so that the
//! two programs compare like for like. The prompt is pseudo-random token ids from `--seed`
//! (after the tokenizer's BOS, where it adds one), as llama-bench's are random.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::bench::timed_passes::{Timings, time_decode, time_prompt};
use anyhow::{Result, bail};
use clap::Args;
use minirun_format::synthetic::SplitMix64;
use minirun_runtime::Decoder;
use minirun_runtime::{RunRequest, Session, Trust};
use minirun_stream::budget::{Budget, human};
use minirun_stream::plan::Mode;

use crate::run::ActivationsArg;

#[derive(Args)]
pub struct ModelArgs {
    /// The artifact directory (written by `minirun pack` or `minirun download`).
    artifact: PathBuf,
    /// Prompt tokens of the prompt test (pp); 0 skips it.
    #[arg(long, short = 'p', default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens of the decode test (tg); 0 skips it.
    #[arg(long, short = 'n', default_value_t = 128)]
    tokens: usize,
    /// Timed passes of each test, after one warm-up.
    #[arg(long, short = 'r', default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeats: u32,
    /// Seed of the prompt's pseudo-random token ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Arithmetic of the products, as `minirun run --activations`.
    #[arg(long, value_enum, default_value_t = ActivationsArg::F32)]
    activations: ActivationsArg,
    /// Memory the run may use, as `minirun run --budget` (default: generous, everything
    /// resident, refused if that is more than the memory available).
    #[arg(long, value_name = "BYTES|PRESET")]
    budget: Option<Budget>,
    #[command(flatten)]
    reads: crate::run::expert_reads::ExpertReads,
    /// Run without verification evidence (the report says so).
    #[arg(long)]
    unverified: bool,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The prompt of the pp test: the tokenizer's BOS where it adds one, then ids drawn uniformly
/// from the tokenizer's vocabulary.
fn prompt_ids(session: &Session, tokens: usize, seed: u64) -> Result<Vec<u32>> {
    let vocab = session.text.vocab_size() as u64;
    if vocab == 0 {
        bail!("the artifact's tokenizer has no ids to make a prompt from");
    }
    let mut ids = session.prompt_ids("", false)?;
    ids.truncate(tokens);
    let mut rng = SplitMix64::new(seed);
    while ids.len() < tokens {
        let draw = rng.next().unwrap_or(0);
        ids.push(u32::try_from(draw % vocab).unwrap_or(0));
    }
    Ok(ids)
}

pub fn run(args: &ModelArgs) -> Result<ExitCode> {
    if args.prompt_tokens == 0 && args.tokens == 0 {
        bail!("--prompt-tokens and --tokens are both 0: there is nothing to time");
    }
    let trust = match args.unverified {
        true => Trust::Unverified,
        false => Trust::Verified(minirun_store::SealKey::existing_for_user()?),
    };
    let mut session = Session::open(&args.artifact, trust)?;
    let context = args.prompt_tokens.max(args.tokens);
    let request = RunRequest {
        activations: args.activations.into(),
        ..args.reads.request(args.budget, context)
    };
    let run = session.plan_request(&request)?;
    let (plan, model) = (&run.plan, session.run_model(&run)?);
    let most = model.max_positions();
    if context > most {
        bail!(
            "a test of {context} tokens needs more positions than the model's max_position_embeddings ({most}): give --prompt-tokens and --tokens of at most {most}"
        );
    }
    let repeats = args.repeats as usize;
    let threads = rayon::current_num_threads();
    if !args.json {
        let mark = if args.unverified { "[UNVERIFIED] " } else { "" };
        for line in session.header().into_iter().chain(plan.describe()) {
            eprintln!("{mark}{line}");
        }
        println!(
            "{} ({}), {} thread{}, {} activations; mean ± sd of {repeats} pass{} after a warm-up",
            args.artifact.display(),
            human(session.artifact.payload_bytes()),
            threads,
            if threads == 1 { "" } else { "s" },
            match args.activations {
                ActivationsArg::F32 => "f32",
                ActivationsArg::Int8 => "int8",
            },
            if repeats == 1 { "" } else { "es" },
        );
        println!("| test | tokens/s | weights a token | weights read |");
        println!("|---|---:|---:|---:|");
    }
    // Each row is printed as its test ends: a long prompt test shows before decoding starts.
    let shown = |t: &Timings| {
        if !args.json {
            println!(
                "| {} | {:.2} ± {:.2} | {} | {:.1} GB/s |",
                t.test,
                t.mean_rate(),
                t.stdev_rate(),
                human(t.weight_bytes_per_token()),
                t.weight_bytes_per_second() / 1e9,
            );
        }
    };
    let mut tests: Vec<Timings> = Vec::new();
    if args.prompt_tokens > 0 {
        let prompt = prompt_ids(&session, args.prompt_tokens, args.seed)?;
        let timings = time_prompt(&model, &prompt, repeats)?;
        shown(&timings);
        tests.push(timings);
    }
    if args.tokens > 0 {
        let first = prompt_ids(&session, 1, args.seed)?
            .first()
            .copied()
            .unwrap_or_default();
        let timings = time_decode(&model, first, args.tokens, repeats)?;
        shown(&timings);
        tests.push(timings);
    }
    if args.json {
        let rows: Vec<serde_json::Value> = tests
            .iter()
            .map(|t| {
                serde_json::json!({
                    "test": t.test, "tokens": t.tokens, "seconds": t.seconds,
                    "tokens_per_second": t.rates(), "mean_tokens_per_second": t.mean_rate(),
                    "stdev_tokens_per_second": t.stdev_rate(),
                    "weight_bytes_per_token": t.weight_bytes_per_token(),
                    "weight_bytes_per_second": t.weight_bytes_per_second(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "artifact": args.artifact.display().to_string(), "verified": !args.unverified,
            "threads": threads, "activations": session.artifact.activations(), "repeats": repeats,
            "resident": plan.mode == Mode::Resident, "budget": plan.budget, "tests": rows,
        });
        println!("{doc}");
    }
    Ok(ExitCode::SUCCESS)
}
