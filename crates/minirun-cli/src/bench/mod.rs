//! `minirun bench storage DIR`: what the storage under an artifact delivers to the streaming
//! reader: throughput and read latency (p50/p95/p99) at queue depths 1 to 8, through the same
//! reads a streamed run makes (one positioned read into a 16 KiB-aligned buffer, `O_DIRECT`
//! where supported, else dropped from the page cache afterwards). With `--buffers N` each
//! reader rotates through N buffers, as a run's reads land in a pool of buffers that stay
//! filled until their experts are computed or cached; on some virtual disks that is slower
//! than reading into one buffer over and over. `--engine io-uring` (or `both`) issues the same
//! reads from one thread through an io_uring ring into registered buffers (`crates/uring-reads`),
//! to measure whether the kernel's asynchronous interface would read faster than threads.
//!
//! `minirun bench model` lives in `bench_model.rs`, `minirun bench memory` in `bench_memory.rs`.

mod memory;
mod model;
pub(crate) mod storage_calibration;
mod timed_passes;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use minirun_format::synthetic::SplitMix64;
use minirun_store::{AlignedBuf, ArtifactFiles, EntryKind, PayloadFile, ReadPath};
use minirun_stream::budget::{Budget, human};
use serde::Serialize;

use crate::bench::storage_calibration as calibration;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Measure the storage under a directory (an artifact, or any folder of large files) as
    /// a streamed run reads it.
    #[command(after_help = "Example:
  minirun bench storage ./DeepSeek-V4-Flash-minirun --read-size 4MiB --seconds 3")]
    Storage(StorageArgs),
    /// Time prompt processing and decoding of an artifact as llama.cpp's llama-bench does: a
    /// warm-up, then the mean and standard deviation of the timed passes.
    #[command(after_help = "Examples:
  minirun bench model ./tiny-minirun --unverified
  minirun bench model ./big-minirun -p 19 -n 32 -r 3 --threads 2 --activations int8 --json

Each pass starts from an empty cache and must reproduce the first pass's bits (the prompt's
last logits; the decoded ids and last logits), or the run is refused. The prompt is
pseudo-random ids (--seed) after the tokenizer's BOS; decoding starts from that first id and
then takes the greedy token of each step.")]
    Model(crate::bench::model::ModelArgs),
    /// Measure how many bytes a second memory delivers to the worker threads: the ceiling of
    /// a decode step that reads each weight once, beside the weight bytes per token that
    /// `minirun bench model` reports.
    #[command(after_help = "Examples:
  minirun bench memory
  minirun bench memory --threads 2 --size 2GiB --json")]
    Memory(crate::bench::memory::MemoryArgs),
}

impl BenchCommand {
    /// The subcommand's `--threads`, where it computes.
    pub fn threads(&self) -> Option<crate::threads::Threads> {
        match self {
            BenchCommand::Storage(_) => None,
            BenchCommand::Model(args) => Some(args.threads),
            BenchCommand::Memory(args) => Some(args.threads),
        }
    }
}

#[derive(Args)]
pub struct StorageArgs {
    /// The directory whose files are read (every regular file in it and in its unit folders).
    #[arg(required_unless_present = "show")]
    dir: Option<PathBuf>,
    /// Print the calibration kept for each device (the best rate of its last measurement, from
    /// which `minirun run` projects read time per token) and stop.
    #[arg(long, conflicts_with = "dir")]
    show: bool,
    /// Do not keep this measurement as its device's calibration.
    #[arg(long)]
    no_save: bool,
    /// Bytes per read: a tile's size (a multiple of 16 KiB).
    #[arg(long, default_value = "1MiB")]
    read_size: Budget,
    /// Seconds each queue depth runs.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Buffers each reader rotates through (1: the same buffer every read, the storage's best
    /// case; a streamed run's reads land in a pool as large as its experts in flight and its
    /// cache, e.g. 24 for eight experts of three tiles). Costs 8 x N x --read-size of memory.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    buffers: u32,
    /// How the reads are issued: `threads` (one positioned read per thread, as `minirun run`
    /// reads), `io-uring` (one thread keeping the queue depth of reads in flight through an
    /// io_uring ring into registered buffers), or `both`, alternating at each depth. Only
    /// `threads` is kept as the device's calibration.
    #[arg(long, value_enum, default_value = "threads")]
    engine: Engine,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// How `minirun bench storage` issues its reads.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Engine {
    Threads,
    IoUring,
    Both,
}

impl Engine {
    /// The engines measured at `depth`, in the order they run: alternated from depth to depth,
    /// so that a device whose rate drifts favours neither.
    fn order(self, depth: usize) -> Vec<Engine> {
        match (self, depth % 2) {
            (Engine::Both, 1) => vec![Engine::Threads, Engine::IoUring],
            (Engine::Both, _) => vec![Engine::IoUring, Engine::Threads],
            (one, _) => vec![one],
        }
    }
}

#[derive(Serialize)]
struct DepthResult {
    queue_depth: usize,
    reads: usize,
    bytes: u64,
    seconds: f64,
    gb_per_second: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
}

pub fn run(command: &BenchCommand) -> Result<ExitCode> {
    match command {
        BenchCommand::Storage(args) => storage(args),
        BenchCommand::Model(args) => crate::threads::on_pool(|| crate::bench::model::run(args)),
        BenchCommand::Memory(args) => crate::threads::on_pool(|| crate::bench::memory::run(args)),
    }
}

fn storage(args: &StorageArgs) -> Result<ExitCode> {
    let Some(dir) = &args.dir else {
        return show_calibrations();
    };
    let Budget::Bytes(read_size) = args.read_size else {
        bail!("--read-size takes bytes (e.g. 1MiB), not a preset");
    };
    if read_size % 16384 != 0 {
        bail!("--read-size must be a multiple of 16 KiB (a tile's alignment)");
    }
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be a positive number");
    }
    let buffers = args.buffers as usize;
    let memory = (8 * u64::from(args.buffers)).saturating_mul(read_size);
    if let Some(available) = minirun_stream::budget::available_memory()
        && memory > available / 2
    {
        bail!(
            "--buffers {} x --read-size {} at queue depth 8 needs {}, more than half of the {} available: give fewer --buffers",
            args.buffers,
            human(read_size),
            human(memory),
            human(available)
        );
    }
    if args.engine != Engine::Threads && 8 * buffers > uring_reads::MAX_BUFFERS {
        bail!(
            "--engine io-uring registers 8 x --buffers buffers at queue depth 8, at most {}: give --buffers {} or fewer",
            uring_reads::MAX_BUFFERS,
            uring_reads::MAX_BUFFERS / 8
        );
    }
    let files = ArtifactFiles::unverified(dir)?;
    let targets = large_files(&files, read_size)?;
    if targets.is_empty() {
        bail!(
            "{} holds no file of at least {} to read: point it at an artifact or a folder of large files",
            dir.display(),
            human(read_size)
        );
    }
    let direct = targets.iter().all(|f| f.supports_direct());
    let total: u64 = targets.iter().map(PayloadFile::len).sum();
    let mut warnings = Vec::new();
    if !direct {
        warnings.push(format!(
            "O_DIRECT is not available here: reads go through the page cache (dropped after each read); \
             if the {} of files are cached already, the figures describe memory, not storage",
            human(total)
        ));
    }
    if args.engine != Engine::Threads && !direct {
        bail!(
            "--engine io-uring reads with O_DIRECT, which the filesystem under {} does not take: measure with --engine threads",
            dir.display()
        );
    }
    let targets = Arc::new(targets);
    let (mut results, mut ring_results) = (Vec::new(), Vec::new());
    for depth in 1..=8 {
        for engine in args.engine.order(depth) {
            match engine {
                Engine::IoUring => ring_results.push(measure_ring(
                    &targets,
                    read_size,
                    buffers,
                    depth,
                    args.seconds,
                )?),
                _ => results.push(measure(&targets, read_size, buffers, depth, args.seconds)?),
            }
        }
    }
    if args.engine == Engine::IoUring && !args.no_save {
        warnings.push(
            "not kept as this device's calibration: `minirun run` reads with threads (measure with --engine threads or both)"
                .into(),
        );
    }
    let calibration = match (direct, args.no_save) {
        (true, false) => keep_calibration(dir, read_size, &results)?,
        (false, false) => {
            warnings.push(
                "not kept as this device's calibration: the reads went through the page cache"
                    .into(),
            );
            None
        }
        (_, true) => None,
    };
    if args.json {
        let ring = (args.engine != Engine::Threads).then_some(&ring_results);
        let doc = serde_json::json!({ "dir": dir.display().to_string(), "files": targets.len(),
            "bytes": total, "read_size": read_size, "buffers": buffers, "direct": direct, "warnings": warnings,
            "depths": results, "io_uring_depths": ring, "calibration": calibration });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} files, {} in {}; {} reads of {} at random 16 KiB-aligned offsets, each reader rotating through {} buffer{}",
        targets.len(),
        human(total),
        dir.display(),
        if direct { "O_DIRECT" } else { "buffered" },
        human(read_size),
        buffers,
        if buffers == 1 { "" } else { "s" },
    );
    println!("| engine | queue depth | reads | GB/s | p50 ms | p95 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let rows = results.iter().map(|r| ("threads", r));
    for (engine, r) in rows.chain(ring_results.iter().map(|r| ("io_uring", r))) {
        println!(
            "| {engine} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.queue_depth, r.reads, r.gb_per_second, r.p50_ms, r.p95_ms, r.p99_ms
        );
    }
    if let Some(kept) = &calibration {
        println!(
            "kept as the calibration of {}: {:.3} GB/s at queue depth {} (in {}); `minirun run` projects read time per token from it",
            kept.device,
            kept.calibration.bytes_per_second / 1e9,
            kept.calibration.queue_depth,
            kept.store,
        );
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Keeps the best depth of `results` as the calibration of the device holding `dir`; what was
/// kept, where, or `None` where there is no place for it (said on stderr).
fn keep_calibration(
    dir: &std::path::Path,
    read_size: u64,
    results: &[DepthResult],
) -> Result<Option<calibration::Kept>> {
    let Some(best) = results
        .iter()
        .max_by(|a, b| a.gb_per_second.total_cmp(&b.gb_per_second))
    else {
        return Ok(None);
    };
    let Some(store) = calibration::store_path() else {
        eprintln!("warning: not kept as a calibration: neither XDG_STATE_HOME nor HOME is set");
        return Ok(None);
    };
    let device = calibration::device_of(dir)?;
    let kept = calibration::Calibration {
        read_size,
        queue_depth: best.queue_depth,
        bytes_per_second: best.bytes as f64 / best.seconds,
        measured_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    calibration::save(&store, &device, kept.clone())?;
    Ok(Some(calibration::Kept {
        device,
        store: store.display().to_string(),
        calibration: kept,
    }))
}

/// `minirun bench storage --show`.
fn show_calibrations() -> Result<ExitCode> {
    let store = calibration::store_path()
        .context("neither XDG_STATE_HOME nor HOME is set: there is no calibration store")?;
    let devices = calibration::all(&store)?;
    if devices.is_empty() {
        println!(
            "no storage calibrated yet (the store is {}): run `minirun bench storage DIR` on a folder of the device",
            store.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!("calibrations in {}:", store.display());
    println!("| device | GB/s | queue depth | read size | measured |");
    println!("|---|---:|---:|---:|---|");
    for (device, c) in &devices {
        println!(
            "| {device} | {:.3} | {} | {} | {:.1} h ago |",
            c.bytes_per_second / 1e9,
            c.queue_depth,
            human(c.read_size),
            now.saturating_sub(c.measured_at) as f64 / 3600.0
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Every regular file of the directory and its subdirectories (one level: units) at least one
/// read long, opened for streaming.
fn large_files(files: &ArtifactFiles, read_size: u64) -> Result<Vec<PayloadFile>> {
    let root = files.root();
    let mut names: Vec<String> = Vec::new();
    let mut dirs = vec![String::new()];
    dirs.extend(
        root.subdirectories()?
            .into_iter()
            .filter(|d| !d.starts_with('.')),
    );
    for dir in dirs {
        let listing = std::fs::read_dir(root.path().join(&dir))
            .with_context(|| format!("cannot list {}", root.path().join(&dir).display()))?;
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            if root.entry_kind(&path)? == EntryKind::File {
                names.push(path);
            }
        }
    }
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let file = files.open_streamed(&name)?;
        if file.len() >= read_size {
            out.push(file);
        }
    }
    Ok(out)
}

/// `count` buffers with every page written once, so the reads measure storage, not the first
/// touch of fresh memory.
fn touched_buffers(count: usize, len: usize) -> Vec<AlignedBuf> {
    (0..count)
        .map(|_| {
            let mut buf = AlignedBuf::new(len);
            buf.as_mut_slice().fill(1);
            buf
        })
        .collect()
}

fn measure(
    files: &Arc<Vec<PayloadFile>>,
    read_size: u64,
    buffers: usize,
    depth: usize,
    seconds: f64,
) -> Result<DepthResult> {
    let deadline = Duration::from_secs_f64(seconds);
    let pools: Vec<Vec<AlignedBuf>> = (0..depth)
        .map(|_| touched_buffers(buffers, read_size as usize))
        .collect();
    let started = Instant::now();
    let per_worker: Vec<Result<Vec<Duration>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = pools
            .into_iter()
            .enumerate()
            .map(|(worker, mut pool)| {
                let files = Arc::clone(files);
                scope.spawn(move || -> Result<Vec<Duration>> {
                    let mut rng = SplitMix64::new(worker as u64 * 7919 + depth as u64);
                    let mut latencies = Vec::new();
                    while started.elapsed() < deadline {
                        let buf = &mut pool[latencies.len() % buffers];
                        let (file, offset) = random_read(&mut rng, &files, read_size);
                        let t = Instant::now();
                        let path = files[file].read_into(offset, buf)?;
                        latencies.push(t.elapsed());
                        debug_assert!(matches!(
                            path,
                            ReadPath::Direct | ReadPath::BufferedDontNeed
                        ));
                    }
                    Ok(latencies)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a reader thread panicked"))
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies: Vec<Duration> = Vec::new();
    for w in per_worker {
        latencies.extend(w?);
    }
    Ok(summary(latencies, read_size, depth, elapsed))
}

/// A random read of `read_size` bytes: which of `files`, at which 16 KiB-aligned offset.
fn random_read(rng: &mut SplitMix64, files: &[PayloadFile], read_size: u64) -> (usize, u64) {
    let r = rng.next().unwrap_or(0);
    let index = (r % files.len() as u64) as usize;
    let slots = (files[index].len() - read_size) / 16384 + 1;
    (index, (r >> 20) % slots * 16384)
}

/// The reads of one queue depth through an io_uring ring: one thread keeps `depth` reads in
/// flight into `depth` x `buffers` registered buffers (each of the `depth` lanes rotating
/// through its own `buffers`), at the same random offsets as the threads' reads, through the
/// files' `O_DIRECT` handles.
fn measure_ring(
    files: &[PayloadFile],
    read_size: u64,
    buffers: usize,
    depth: usize,
    seconds: f64,
) -> Result<DepthResult> {
    let direct: Vec<&std::fs::File> = files
        .iter()
        .map(|f| {
            f.direct_file()
                .with_context(|| format!("{} cannot be read with O_DIRECT", f.path()))
        })
        .collect::<Result<_>>()?;
    let total = depth * buffers;
    let mut ring = uring_reads::FixedReads::new(total, read_size as usize)?;
    let mut rng = SplitMix64::new(depth as u64 * 104_729 + 1);
    let mut submitted = vec![Instant::now(); total];
    let deadline = Duration::from_secs_f64(seconds);
    let started = Instant::now();
    for (slot, at) in submitted.iter_mut().enumerate().take(depth) {
        let (file, offset) = random_read(&mut rng, files, read_size);
        *at = Instant::now();
        ring.submit(slot, direct[file], offset)?;
    }
    let mut latencies = Vec::new();
    while ring.in_flight() > 0 {
        let done = ring.complete()?;
        if done.bytes as u64 != read_size {
            bail!("a read of {read_size} bytes returned {}", done.bytes);
        }
        latencies.push(submitted[done.slot].elapsed());
        if started.elapsed() < deadline {
            let slot = (done.slot + depth) % total;
            let (file, offset) = random_read(&mut rng, files, read_size);
            submitted[slot] = Instant::now();
            ring.submit(slot, direct[file], offset)?;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(summary(latencies, read_size, depth, elapsed))
}

/// Throughput and latency percentiles of one depth's reads.
fn summary(
    mut latencies: Vec<Duration>,
    read_size: u64,
    depth: usize,
    elapsed: f64,
) -> DepthResult {
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let bytes = latencies.len() as u64 * read_size;
    DepthResult {
        queue_depth: depth,
        reads: latencies.len(),
        bytes,
        seconds: elapsed,
        gb_per_second: bytes as f64 / elapsed / 1e9,
        p50_ms: pct(0.50),
        p95_ms: pct(0.95),
        p99_ms: pct(0.99),
    }
}
