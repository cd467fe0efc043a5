//! `mmap-baseline`: decodes an artifact with minirun's own model and kernels, every tile
//! container memory-mapped whole instead of read, so that the kernel's page cache decides which
//! weights are in memory. Under a memory cgroup smaller than the model this is how mmap-based
//! runtimes (llama.cpp's default) run a model that does not fit: the baseline minirun's
//! streaming is measured against (`bench/stream_under_budget.sh`). Not a product: the mapped
//! bytes are not checked against evidence, so it only opens artifacts unverified.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use minirun_runtime::Sampling;
use minirun_runtime::{Session, Trust};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "mmap-baseline",
    about = "Decode an artifact (unverified) from memory-mapped weights, greedy, and print one JSON line of figures",
    after_help = "Example, inside a 1 GiB memory cgroup (as bench/stream_under_budget.sh runs it):\n  mmap-baseline target/stream-bench/artifact --prompt \"The clockmaker opened the\" --max-tokens 16"
)]
struct Args {
    /// The artifact folder (as `minirun run` takes it; opened without evidence).
    artifact: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Arithmetic of the products, as `minirun run --activations`: the streamed runs a
    /// benchmark checks against this one must use the same.
    #[arg(long, value_enum, default_value_t = ActivationsArg::F32)]
    activations: ActivationsArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ActivationsArg {
    F32,
    Int8,
}

impl From<ActivationsArg> for minirun_kernels::Activations {
    fn from(a: ActivationsArg) -> Self {
        match a {
            ActivationsArg::F32 => minirun_kernels::Activations::F32,
            ActivationsArg::Int8 => minirun_kernels::Activations::Int8,
        }
    }
}

/// Maps `path` read-only.
#[allow(unsafe_code)]
fn map(path: &Path) -> std::io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
    let file = File::open(path)?;
    // SAFETY: the map is read-only and private to this process; the benchmark owns the
    // artifact and nothing writes or truncates its files while it runs. (A file changed under
    // a map is exactly why minirun itself reads through evidence instead.)
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(Box::new(map))
}

fn run(args: &Args) -> Result<()> {
    let mut session = Session::open(&args.artifact, Trust::Unverified)
        .with_context(|| format!("cannot open {}", args.artifact.display()))?;
    session.artifact.map_containers_unverified(Box::new(map))?;
    session.artifact.set_activations(args.activations.into());
    let prompt = session.prompt_ids(&args.prompt, false)?;
    let model = session.model()?;
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let generation = session.generate(&model, &prompt, args.max_tokens, greedy, &[], |_| {})?;
    let figures = &generation.figures;
    let report = serde_json::json!({
        "baseline": "mmap",
        "activations": session.artifact.activations(),
        "prompt_token_ids": generation.prompt_ids,
        "generated_token_ids": generation.generated_ids,
        "logits_sha256": figures.logits_sha256_hex(),
        "decode_steps": figures.decode_steps,
        "decode_seconds": figures.decode_time.as_secs_f64(),
        "tokens_per_second": figures.tokens_per_second(),
        "peak_rss_bytes": minirun_stream::budget::peak_rss(),
    });
    println!("{report}");
    Ok(())
}

fn main() -> ExitCode {
    // As `minirun run` does, so that both are held to a memory limit in the same pages.
    let _ = minirun_stream::budget::count_only_used_pages();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmap-baseline: {e:#}");
            ExitCode::FAILURE
        }
    }
}
