//! Training throughput of a preset, as one JSON line (tokens per second over timed steps after
//! untimed warmup steps, and every step's loss), for `bench/train_throughput.sh` to set beside
//! the reference. Run it with `CANDLE_NUM_THREADS=1` (as the script does) for the threads
//! `dormouse train` uses: candle's element-wise operations on the calling thread.
//!
//! ```sh
//! CANDLE_NUM_THREADS=1 cargo run --release -p dormouse --example train_throughput -- --preset small --batch 8 --seq 256 --steps 10
//! ```

use std::time::Instant;

// The same allocator and settings as `dormouse train`: candle allocates a fresh buffer per op,
// and glibc's malloc hands large ones back to the kernel each time (page faults, zeroing).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use candle_core::Device;
use dormouse::DormouseConfig;
use dormouse::data::Corpus;
use dormouse::train::{TrainSettings, Trainer};

struct Args {
    preset: String,
    batch: usize,
    seq: usize,
    steps: u64,
    warmup_steps: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        preset: "nano".into(),
        batch: 8,
        seq: 256,
        steps: 10,
        warmup_steps: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--preset" => args.preset = value.clone(),
            "--batch" => args.batch = number()? as usize,
            "--seq" => args.seq = number()? as usize,
            "--steps" => args.steps = number()?,
            "--warmup-steps" => args.warmup_steps = number()?,
            _ => {
                return Err(format!(
                    "unknown flag {flag}; flags: --preset --batch --seq --steps --warmup-steps"
                ));
            }
        }
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    // As `dormouse train` does: keep the pages of the buffers every step frees.
    mimalloc_purge::never_purge();
    let args = parse_args()?;
    let cfg = DormouseConfig::preset(&args.preset)?;
    let settings = TrainSettings {
        steps: args.warmup_steps + args.steps,
        batch: args.batch,
        seq: args.seq,
        ..TrainSettings::default()
    };
    let corpus = Corpus::new(
        dormouse::data::EMBEDDED_CORPUS.to_vec(),
        settings.eval_bytes,
        settings.seq,
    )?;
    let mut run = Trainer::new(&cfg, settings, &Device::Cpu)?;
    let ready = started.elapsed().as_secs_f64();
    let mut losses = Vec::new();
    let first = Instant::now();
    losses.push(run.train_step(&corpus)?.loss);
    let first_step_s = first.elapsed().as_secs_f64();
    for _ in 1..args.warmup_steps {
        losses.push(run.train_step(&corpus)?.loss);
    }
    let timed = Instant::now();
    for _ in 0..args.steps {
        losses.push(run.train_step(&corpus)?.loss);
    }
    let seconds = timed.elapsed().as_secs_f64();
    let params: usize = run.varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    let tokens = (args.steps as usize * args.batch * args.seq) as f64;
    println!(
        "{{\"impl\": \"dormouse (candle 0.11)\", \"preset\": \"{}\", \"params\": {params}, \"batch\": {}, \"seq\": {}, \"steps\": {}, \"tokens_per_s\": {:.1}, \"threads\": {}, \"startup_s\": {ready:.3}, \"first_step_s\": {first_step_s:.3}, \"losses\": [{}]}}",
        args.preset,
        args.batch,
        args.seq,
        args.steps,
        tokens / seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        losses
            .iter()
            .map(|l| format!("{l:.7}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Ok(())
}
