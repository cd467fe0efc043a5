//! `minirun run`: decode from an artifact under a memory budget, resident or with its routed
//! experts streamed from storage.

pub(crate) mod expert_reads;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use minirun_kernels::Activations;
use minirun_runtime::Decoder;
use minirun_runtime::{Figures, Sampling, StepRecord, StopReason};
use minirun_runtime::{RunRequest, Session, TokenEvent, Trust};
use minirun_stream::budget::{Budget, human};
use minirun_stream::plan::{Layers, Mode, Plan};

use crate::bench::storage_calibration as calibration;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ActivationsArg {
    F32,
    Int8,
}

impl From<ActivationsArg> for Activations {
    fn from(arg: ActivationsArg) -> Activations {
        match arg {
            ActivationsArg::F32 => Activations::F32,
            ActivationsArg::Int8 => Activations::Int8,
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// The artifact directory (written by `minirun pack` or `minirun download`).
    artifact: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Render the prompt as one user message with the artifact's chat template, and print the
    /// reply as the chat shows it (gpt-oss: harmony, its final channel only).
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
    /// Memory the run may use: bytes with a unit (2GiB, 500MB, 1.5GB) or a preset: floor (the
    /// least it can run in), balanced (halfway to everything resident), generous (everything
    /// resident). Below the floor the run is refused before reading a weight, naming each term.
    /// Default: generous, refused if that is more than the memory available.
    #[arg(long, value_name = "BYTES|PRESET")]
    budget: Option<Budget>,
    /// Stream every layer's attention, router and shared experts (or dense MLP) from storage
    /// each step, even where the budget would hold them, and plan the floor for that: what a
    /// model with more layers than any budget holds does at its floor. For measuring a cut of
    /// such a model (a few of its layers at their real size) as the whole model runs.
    #[arg(long)]
    stream_every_layer: bool,
    #[command(flatten)]
    reads: crate::run::expert_reads::ExpertReads,
    /// Arithmetic of the products: f32 (exact: every weight decoded to f32) or int8 (affine
    /// 4- and 8-bit and MXFP4 matrices take their input quantized to 8 bits per group and sum
    /// in integers: faster, deterministic, not the f32 path's bits; other formats stay f32).
    #[arg(long, value_enum, default_value_t = ActivationsArg::F32)]
    activations: ActivationsArg,
    /// Write one JSON line per decode step (wall and I/O seconds, expert bytes read, cache hits
    /// and misses) to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
    /// Print one JSON object (prompt ids, generated ids, text, figures) instead of streaming.
    #[arg(long)]
    json: bool,
}

/// The run `args` ask for, with a context of the prompt and the tokens to generate.
fn request(args: &RunArgs, prompt_tokens: usize) -> RunRequest {
    let context = prompt_tokens + args.max_tokens;
    RunRequest {
        layers: match args.stream_every_layer {
            true => Layers::StreamEvery,
            false => Layers::HoldWhatFits,
        },
        activations: args.activations.into(),
        ..args.reads.request(args.budget, context)
    }
}

/// A streamed plan's reads per token at the rate `minirun bench storage` measured on the
/// artifact's device; none without a calibration, or for a resident run, which reads nothing
/// per token.
pub(crate) struct Projection {
    pub calibration: Option<calibration::Calibration>,
    pub bytes_per_token: u64,
    why_none: Option<String>,
}

impl Projection {
    pub(crate) fn of(plan: &Plan, artifact: &std::path::Path) -> Projection {
        match plan.mode {
            Mode::Streamed => Projection::with(plan, calibration::for_artifact(artifact)),
            Mode::Resident => Projection::with(plan, Ok(None)),
        }
    }

    /// The projection of `plan` at the calibration `found` for its device (looked up once for
    /// several plans of one artifact).
    pub(crate) fn with(
        plan: &Plan,
        found: Result<Option<calibration::Calibration>, String>,
    ) -> Projection {
        let streamed = plan.mode == Mode::Streamed;
        let bytes_per_token = plan.read_per_token();
        let (calibration, why_none) = match (found, streamed) {
            (_, false) => (None, None),
            (Ok(Some(c)), true) => (Some(c), None),
            (Ok(None), true) => (
                None,
                Some(
                    "this device has no storage calibration: `minirun bench storage DIR` makes one"
                        .into(),
                ),
            ),
            (Err(why), true) => (None, Some(why)),
        };
        Projection {
            calibration,
            bytes_per_token,
            why_none,
        }
    }

    /// Seconds a token's reads take at the calibrated rate.
    pub(crate) fn seconds(&self) -> Option<f64> {
        self.calibration
            .as_ref()
            .map(|c| calibration::projected_read_seconds(self.bytes_per_token, c))
    }

    pub(crate) fn describe(&self) -> Option<String> {
        match (&self.calibration, self.seconds(), &self.why_none) {
            (Some(c), Some(seconds), _) => Some(format!(
                "projected reads: {seconds:.3} s/token ({} a token at the {:.2} GB/s `minirun bench storage` measured here at queue depth {})",
                human(self.bytes_per_token),
                c.bytes_per_second / 1e9,
                c.queue_depth
            )),
            (_, _, Some(why)) => Some(format!("no projection of read time: {why}")),
            _ => None,
        }
    }
}

/// One line, rewritten in place, while a streamed run decodes on a terminal.
fn live_line(step: &StepRecord, expert_memory: Option<(u64, u64)>, budget: u64) {
    let (held, peak) = expert_memory.unwrap_or((0, 0));
    eprint!(
        "\r\x1b[2Kpos {} | {:.1} ms/token ({:.1} ms waiting, storage busy {:.1} ms) | read {} | cache {} hit / {} miss | experts {} (peak {}) of budget {}",
        step.position,
        step.seconds * 1e3,
        step.io_seconds * 1e3,
        step.read_busy_seconds * 1e3,
        human(step.expert_read_bytes + step.layer_read_bytes + step.table_read_bytes),
        step.expert_cache_hits,
        step.expert_cache_misses,
        human(held),
        human(peak),
        human(budget)
    );
}

fn write_trace(path: &std::path::Path, figures: &Figures) -> Result<()> {
    let mut text = String::new();
    for step in &figures.steps {
        text.push_str(&serde_json::to_string(step)?);
        text.push('\n');
    }
    atomic_file::write_bytes(path, text.as_bytes())
        .with_context(|| format!("cannot write the trace {}", path.display()))
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
        false => Trust::Verified(minirun_store::SealKey::existing_for_user()?),
    };
    let mut session = Session::open(&args.artifact, trust)?;
    let prompt = session.prompt_ids(&args.prompt, args.chat)?;
    let stop = match args.ignore_eos {
        true => Vec::new(),
        false => session.stop_ids(),
    };
    let run = session.plan_request(&request(args, prompt.len()))?;
    let (plan, model) = (&run.plan, session.run_model(&run)?);
    let projection = Projection::of(plan, &args.artifact);
    if !args.json {
        let mark = if args.unverified { "[UNVERIFIED] " } else { "" };
        let lines = session.header().into_iter().chain(plan.describe());
        for line in lines.chain(projection.describe()) {
            eprintln!("{mark}{line}");
        }
    }
    let live = !args.json && plan.mode == Mode::Streamed && std::io::stderr().is_terminal();
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut stdout = std::io::stdout().lock();
    let on_token = |event: TokenEvent<'_>| {
        if let (Some(step), true) = (event.step, live) {
            live_line(step, model.expert_memory(), plan.budget);
        }
        if let (Some(new), false) = (event.text, args.json) {
            if live {
                eprint!("\r\x1b[2K");
            }
            let _ = write!(stdout, "{new}");
            let _ = stdout.flush();
        }
    };
    let (tokens, sampling) = (args.max_tokens, sampling);
    let generation = match args.chat {
        true => session.generate_reply(&model, &prompt, tokens, sampling, &stop, on_token)?,
        false => session.generate(&model, &prompt, tokens, sampling, &stop, on_token)?,
    };
    if live {
        eprint!("\r\x1b[2K");
    }
    let figures = &generation.figures;
    if let Some(path) = &args.trace {
        write_trace(path, figures)?;
    }
    let (experts_held, experts_peak) = model.expert_memory().unwrap_or((0, 0));
    let io = &figures.decode_io;
    if args.json {
        let report = serde_json::json!({
            "artifact": args.artifact.display().to_string(),
            "verified": !args.unverified,
            "provenance": session.artifact.provenance,
            "prompt_token_ids": generation.prompt_ids,
            "generated_token_ids": generation.generated_ids,
            "logits_sha256": figures.logits_sha256_hex(),
            "text": generation.text,
            "prompt_tokens": figures.prompt_tokens,
            "prompt_seconds": figures.prompt_time.as_secs_f64(),
            "generated_tokens": figures.generated_tokens,
            "decode_steps": figures.decode_steps,
            "decode_seconds": figures.decode_time.as_secs_f64(),
            "tokens_per_second": figures.tokens_per_second(),
            "weight_bytes_per_token": figures.weight_bytes_per_token(),
            "resident_bytes": session.artifact.payload_bytes(),
            "plan": plan,
            "activations": session.artifact.activations(),
            "expert_read_bytes_per_token": figures.expert_read_bytes_per_token(),
            "layer_read_bytes_per_token": figures.layer_read_bytes_per_token(),
            "table_read_bytes_per_token": figures.table_read_bytes_per_token(),
            "decode_io_seconds": io.io_time.as_secs_f64(),
            "decode_read_busy_seconds": io.read_busy.as_secs_f64(),
            "decode_outside_layers_seconds": io.outside_layers.as_secs_f64(),
            "expert_cache_hits": io.expert_cache_hits,
            "expert_cache_misses": io.expert_cache_misses,
            "expert_guessed": io.expert_guessed,
            "expert_guess_right": io.expert_guess_right,
            "expert_guess_hits": io.expert_guess_hits,
            "expert_guess_read_bytes": io.expert_guess_read_bytes,
            "expert_guess_wasted_bytes": io.expert_guess_wasted_bytes(),
            "direct_reads": io.direct_reads,
            "buffered_reads": io.buffered_reads,
            "expert_bytes_held": experts_held,
            "expert_bytes_peak": experts_peak,
            "layer_pool_peak_bytes": model.layer_pool_peak(),
            "peak_rss_bytes": minirun_stream::budget::peak_rss(),
            "stop_reason": figures.stop_reason,
            "projected_read_seconds_per_token": projection.seconds(),
            "storage_calibration": projection.calibration,
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
    if plan.mode == Mode::Streamed {
        eprintln!(
            "streamed: {} of routed experts read per token (the plan's {} without cache hits), {} of streamed layers' attention, routers and shared experts (the plan's {}), {} of the embedding's and head's rows (the plan's {}); {:.2} s of {:.2} s decoding waited for reads, while storage was busy for {:.2} s; expert cache {} hits / {} misses; {} experts read ahead on a guess, {} of them chosen, {} read for none; {} direct (O_DIRECT) and {} buffered (then dropped from the page cache) reads; resident {} + experts peak {} + streamed matrices peak {} within budget {}; process peak RSS {}",
            human(figures.expert_read_bytes_per_token()),
            human(plan.uncached_read_per_token),
            human(figures.layer_read_bytes_per_token()),
            human(plan.layer_read_per_token),
            human(figures.table_read_bytes_per_token()),
            human(plan.table_read_per_token),
            io.io_time.as_secs_f64(),
            figures.decode_time.as_secs_f64(),
            io.read_busy.as_secs_f64(),
            io.expert_cache_hits,
            io.expert_cache_misses,
            io.expert_guessed,
            io.expert_guess_hits,
            human(io.expert_guess_wasted_bytes()),
            io.direct_reads,
            io.buffered_reads,
            human(session.artifact.payload_bytes()),
            human(experts_peak),
            human(model.layer_pool_peak()),
            human(plan.budget),
            minirun_stream::budget::peak_rss().map_or("unknown".to_string(), human)
        );
    }
    Ok(ExitCode::SUCCESS)
}
