//! Prompt processing speed: a prompt run through the model in chunks of positions (`prefill`,
//! what `minirun run` does) against the same prompt one token at a time (`step`, what it did
//! before), side by side in one process on one resident artifact. Both must leave the same
//! logit bits, which the example checks before it prints the table.
//!
//!     cargo run --release -p minirun-runtime --example prefill_throughput -- ARTIFACT \
//!         [--tokens 64] [--threads 1,2] [--repeats 3] [--activations f32|int8] [--prefill-only]
//!
//! `--prefill-only` runs `--repeats` prefills and nothing else, and prints their mean rate: a
//! steady load to profile (`perf stat`, `perf record`) without the stepping.
//!
//! ARTIFACT is an unverified, packed artifact, e.g. the one `bench/decode_vs_mlx.sh` leaves
//! in `target/decode-bench/artifact`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use minirun_kernels::Activations;
use minirun_runtime::Decoder;
use minirun_runtime::models::deepseek_v3::DeepSeekV3;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::step::StepStats;

struct Args {
    artifact: PathBuf,
    tokens: usize,
    threads: Vec<usize>,
    repeats: usize,
    activations: Activations,
    prefill_only: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: prefill_throughput ARTIFACT [--tokens N] [--threads 1,2] [--repeats N] [--activations f32|int8] [--prefill-only]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let artifact = it.next().map(PathBuf::from).unwrap_or_else(|| usage());
    let mut a = Args {
        artifact,
        tokens: 64,
        threads: vec![1, 2],
        repeats: 3,
        activations: Activations::F32,
        prefill_only: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--prefill-only" {
            a.prefill_only = true;
            continue;
        }
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--tokens" => a.tokens = value.parse().unwrap_or_else(|_| usage()),
            "--repeats" => a.repeats = value.parse().unwrap_or_else(|_| usage()),
            "--activations" => {
                a.activations = match value.as_str() {
                    "f32" => Activations::F32,
                    "int8" => Activations::Int8,
                    _ => usage(),
                }
            }
            "--threads" => {
                a.threads = value
                    .split(',')
                    .map(|t| t.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            _ => usage(),
        }
    }
    a
}

/// The best of `repeats` timings of `run`, and its logits.
fn best(repeats: usize, run: impl Fn() -> Vec<f32>) -> (Duration, Vec<f32>) {
    let mut fastest = Duration::MAX;
    let mut logits = Vec::new();
    for _ in 0..repeats.max(1) {
        let started = Instant::now();
        logits = run();
        fastest = fastest.min(started.elapsed());
    }
    (fastest, logits)
}

fn main() {
    let a = args();
    let mut artifact = Artifact::open(&a.artifact, Access::Unverified).unwrap_or_else(|e| {
        eprintln!("prefill_throughput: {e}");
        std::process::exit(1)
    });
    artifact.set_activations(a.activations);
    let config = DeepSeekV3Config::parse(&artifact.config_json).expect("a DeepSeek-V3 config");
    let model = DeepSeekV3::load(&artifact, config.clone()).expect("the model loads");
    let prompt: Vec<u32> = (0..a.tokens)
        .map(|i| ((i * 7919 + 13) % config.vocab_size) as u32)
        .collect();
    println!(
        "| threads | prompt tokens | one at a time (tok/s) | prefill (tok/s) | prefill / one at a time |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for &threads in &a.threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        if a.prefill_only {
            let started = Instant::now();
            for _ in 0..a.repeats.max(1) {
                pool.install(|| {
                    model
                        .prefill(&prompt, &mut model.new_cache(), &mut StepStats::default())
                        .expect("a prefill")
                });
            }
            let tokens = (a.repeats.max(1) * prompt.len()) as f64;
            let rate = tokens / started.elapsed().as_secs_f64();
            println!("| {threads} | {} | | {rate:.1} (mean) | |", prompt.len());
            continue;
        }
        let (stepped, stepped_logits) = pool.install(|| {
            best(a.repeats, || {
                let mut cache = model.new_cache();
                let mut last = Vec::new();
                for &t in &prompt {
                    last = model
                        .step(t, &mut cache, &mut StepStats::default())
                        .expect("a step");
                }
                last
            })
        });
        let (batched, batched_logits) = pool.install(|| {
            best(a.repeats, || {
                model
                    .prefill(&prompt, &mut model.new_cache(), &mut StepStats::default())
                    .expect("a prefill")
            })
        });
        let same = stepped_logits
            .iter()
            .zip(&batched_logits)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "prefill and stepping gave different logit bits");
        let rate = |d: Duration| prompt.len() as f64 / d.as_secs_f64();
        println!(
            "| {threads} | {} | {:.1} | {:.1} | {:.2}x |",
            prompt.len(),
            rate(stepped),
            rate(batched),
            stepped.as_secs_f64() / batched.as_secs_f64()
        );
    }
}
