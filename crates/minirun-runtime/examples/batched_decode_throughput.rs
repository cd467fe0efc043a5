//! Aggregate decode speed of several requests at once: N generations one after another (what a
//! server without batching does) against the same N decoded together as one batch (what
//! `minirun serve` does: their prompts as the rows of shared passes, then one step for all,
//! each weight read once per pass), side by side in
//! one process on one artifact, resident or streamed under a budget. Both must give every
//! request the same tokens, which the example checks before it prints the table.
//!
//!     cargo run --release -p minirun-runtime --example batched_decode_throughput -- ARTIFACT \
//!         [--streams 1,4,16] [--tokens 16] [--budget generous|floor|2GiB]
//!
//! ARTIFACT is an unverified, packed artifact, e.g. the one `bench/decode_vs_mlx.sh` leaves in
//! `target/decode-bench/artifact`. The rates count generated tokens over the wall time of the
//! whole work, prompts included.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use minirun_runtime::Model;
use minirun_runtime::{Batch, Event, Request};
use minirun_runtime::{Sampling, generate};
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::step::StepStats;

struct Args {
    artifact: PathBuf,
    streams: Vec<usize>,
    tokens: usize,
    budget: Budget,
}

fn usage() -> ! {
    eprintln!(
        "usage: batched_decode_throughput ARTIFACT [--streams 1,4,16] [--tokens N] [--budget BYTES|PRESET]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let artifact = it.next().map(PathBuf::from).unwrap_or_else(|| usage());
    let mut a = Args {
        artifact,
        streams: vec![1, 4, 16],
        tokens: 16,
        budget: Budget::Generous,
    };
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--tokens" => a.tokens = value.parse().unwrap_or_else(|_| usage()),
            "--budget" => a.budget = value.parse().unwrap_or_else(|_| usage()),
            "--streams" => {
                a.streams = value
                    .split(',')
                    .map(|t| t.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            _ => usage(),
        }
    }
    a
}

/// `count` requests of different prompts and seeds, sampled (so that the sampler's draws are
/// part of what must agree), never stopping early.
fn requests(session: &Session, count: usize, tokens: usize) -> Vec<Request> {
    (0..count)
        .map(|i| Request {
            prompt: session
                .prompt_ids(&format!("Request {i}: tell me about clocks"), false)
                .expect("the prompt tokenizes"),
            max_tokens: tokens,
            sampling: Sampling {
                temperature: 0.8,
                top_p: 0.95,
                seed: i as u64,
            },
            stop: Vec::new(),
        })
        .collect()
}

/// Wall time of the whole work and of its decode steps alone, and every request's tokens.
struct Timed {
    whole: Duration,
    decode: Duration,
    outputs: Vec<Vec<u32>>,
}

fn one_after_another(model: &Model, requests: &[Request]) -> Timed {
    let started = Instant::now();
    let mut decode = Duration::ZERO;
    let outputs = requests
        .iter()
        .map(|r| {
            let (ids, figures) =
                generate(model, &r.prompt, r.max_tokens, r.sampling, &[], |_, _| {})
                    .expect("a generation");
            decode += figures.decode_time;
            ids
        })
        .collect();
    Timed {
        whole: started.elapsed(),
        decode,
        outputs,
    }
}

fn together(model: &Model, requests: &[Request]) -> Timed {
    let started = Instant::now();
    let mut outputs = vec![Vec::new(); requests.len()];
    let mut heard = |id: u64, event: Event| {
        if let Event::Token(t) = event {
            outputs[id as usize].push(t);
        }
        true
    };
    let mut batch = Batch::new(model);
    let mut stats = StepStats::default();
    let arriving = requests.iter().cloned().enumerate();
    let refused = batch.admit_all(
        arriving.map(|(id, r)| (id as u64, r)).collect(),
        &mut stats,
        &mut heard,
    );
    assert!(refused.is_empty(), "a request was refused: {refused:?}");
    let stepping = Instant::now();
    while !batch.is_empty() {
        batch.step(&mut stats, &mut heard).expect("a batched step");
    }
    let decode = stepping.elapsed();
    Timed {
        whole: started.elapsed(),
        decode,
        outputs,
    }
}

/// On a worker of rayon's pool, as `minirun serve` decodes: the products split with the other
/// workers without a hand-off to the pool each.
fn main() {
    rayon::scope(|_| measure());
}

fn measure() {
    let a = args();
    let session = Session::open(&a.artifact, Trust::Unverified).unwrap_or_else(|e| {
        eprintln!("batched_decode_throughput: {e}");
        std::process::exit(1)
    });
    let most = a.streams.iter().copied().max().unwrap_or(1);
    let context = most * (a.tokens + 16);
    let (plan, experts) = session.plan(a.budget, context).unwrap_or_else(|e| {
        eprintln!("batched_decode_throughput: {e}");
        std::process::exit(1)
    });
    let model = session
        .planned_model(&plan, &experts)
        .expect("the model loads");
    for line in session.header().into_iter().chain(plan.describe()) {
        eprintln!("{line}");
    }
    println!(
        "| streams | tokens each | one after another (tok/s) | one batch (tok/s) | batch / one after another | decode steps only: one after another | one batch | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &streams in &a.streams {
        let requests = requests(&session, streams, a.tokens);
        let alone = one_after_another(&model, &requests);
        let batched = together(&model, &requests);
        assert!(
            alone.outputs == batched.outputs,
            "a request got other tokens in the batch than alone"
        );
        let generated: usize = alone.outputs.iter().map(Vec::len).sum();
        // A decode step runs every token but each request's first (the prompt's pass gives it).
        let stepped = generated - alone.outputs.iter().filter(|o| !o.is_empty()).count();
        let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
        println!(
            "| {streams} | {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.1} | {:.2}x |",
            a.tokens,
            rate(generated, alone.whole),
            rate(generated, batched.whole),
            alone.whole.as_secs_f64() / batched.whole.as_secs_f64(),
            rate(stepped, alone.decode),
            rate(stepped, batched.decode),
            alone.decode.as_secs_f64() / batched.decode.as_secs_f64()
        );
    }
}
