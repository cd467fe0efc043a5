//! `minirun bench memory`: how many bytes a second this machine's memory delivers to the run's
//! worker threads. A decode step of a resident model reads every weight it uses once, from
//! memory rather than from the CPU's caches when the weights outgrow them, so this rate times
//! nothing else is the fastest any engine can decode there: `minirun bench model` reports the
//! weight bytes a decode token reads, and the two divided give that ceiling in tokens/s.
//!
//! Each pass reads a buffer far larger than the caches once, split evenly between the pool's
//! threads (as a product's rows are), summing its words so that no read can be skipped; the
//! figure is the buffer's bytes over the pass's wall time. The buffer is written before the
//! first pass, so every page is backed by memory, and one untimed pass warms it up.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use minirun_stream::budget::{Budget, human};
use rayon::prelude::*;

#[derive(Args)]
pub struct MemoryArgs {
    /// Bytes read by each pass: far larger than the CPU's last-level cache, so that the reads
    /// come from memory.
    #[arg(long, default_value = "1GiB")]
    size: Budget,
    /// Timed passes, after one warm-up.
    #[arg(long, short = 'r', default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeats: u32,
    #[command(flatten)]
    pub threads: crate::threads::Threads,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Words summed per task: each thread takes whole slices of this many words.
const WORDS_PER_TASK: usize = 1 << 16;

/// The smallest buffer that still says something about memory rather than caches.
const SMALLEST: u64 = 1 << 20;

/// The wrapping sum of every word of `words`, split between the pool's threads: every byte is
/// read, and the sum depends on all of them, so the compiler cannot drop any read.
fn read_all(words: &[u64]) -> u64 {
    words
        .par_chunks(WORDS_PER_TASK)
        .map(|chunk| chunk.iter().fold(0u64, |sum, &w| sum.wrapping_add(w)))
        .reduce(|| 0, u64::wrapping_add)
}

/// A buffer of `bytes` (rounded down to whole words), every page written.
fn filled(bytes: u64) -> Result<Vec<u64>> {
    let words = usize::try_from(bytes / 8)?;
    let mut buffer = Vec::new();
    if buffer.try_reserve_exact(words).is_err() {
        bail!(
            "cannot allocate {} to read: give a smaller --size",
            human(bytes)
        );
    }
    buffer.extend((0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    Ok(buffer)
}

/// Seconds of each timed pass over `words`, after one untimed pass; each pass must sum to
/// what the warm-up did, or memory changed under it.
fn timed_passes(words: &[u64], repeats: usize) -> Result<Vec<f64>> {
    let want = read_all(words);
    let mut seconds = Vec::with_capacity(repeats);
    for pass in 1..=repeats {
        let started = Instant::now();
        let sum = std::hint::black_box(read_all(std::hint::black_box(words)));
        seconds.push(started.elapsed().as_secs_f64());
        if sum != want {
            bail!("pass {pass} read other values than the warm-up: the memory is not reliable");
        }
    }
    Ok(seconds)
}

/// The median (of the two middle rates, their mean) and the largest of `rates`; zero for none.
fn median_and_best(rates: &[f64]) -> (f64, f64) {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = match (sorted.len() % 2, sorted.get(mid)) {
        (_, None) => 0.0,
        (1, Some(&middle)) => middle,
        (_, Some(&upper)) => (sorted[mid - 1] + upper) / 2.0,
    };
    (median, sorted.last().copied().unwrap_or(0.0))
}

pub fn run(args: &MemoryArgs) -> Result<ExitCode> {
    let Budget::Bytes(bytes) = args.size else {
        bail!("--size takes bytes (e.g. 1GiB), not a preset");
    };
    if bytes < SMALLEST {
        bail!(
            "--size {} is too small to measure memory rather than the CPU's caches: give at least 1MiB (the default is 1GiB)",
            human(bytes)
        );
    }
    let words = filled(bytes)?;
    let read = words.len() as u64 * 8;
    let seconds = timed_passes(&words, args.repeats as usize)?;
    let rates: Vec<f64> = seconds.iter().map(|s| read as f64 / s).collect();
    let (median, best) = median_and_best(&rates);
    let threads = rayon::current_num_threads();
    if args.json {
        let doc = serde_json::json!({
            "bytes_per_pass": read, "threads": threads, "seconds": seconds,
            "bytes_per_second": rates, "median_bytes_per_second": median,
            "best_bytes_per_second": best,
        });
        println!("{doc}");
    } else {
        println!(
            "{} read by {threads} thread{}, {} timed pass{} after a warm-up",
            human(read),
            if threads == 1 { "" } else { "s" },
            rates.len(),
            if rates.len() == 1 { "" } else { "es" },
        );
        println!(
            "median {:.1} GB/s, best {:.1} GB/s",
            median / 1e9,
            best / 1e9
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::{filled, median_and_best, read_all, timed_passes};

    #[test]
    fn the_median_is_the_middle_rate_or_the_mean_of_the_two_middle_ones() {
        assert_eq!(median_and_best(&[3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(median_and_best(&[4.0, 1.0, 3.0, 2.0]), (2.5, 4.0));
        assert_eq!(median_and_best(&[5.0]), (5.0, 5.0));
        assert_eq!(median_and_best(&[]), (0.0, 0.0));
    }

    /// Every word counts: the parallel sum is the plain sum, and changing any one word
    /// changes it.
    #[test]
    fn the_pass_reads_every_word() {
        let mut words = filled(3 * 8 * super::WORDS_PER_TASK as u64 + 40).unwrap();
        let plain = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
        assert_eq!(read_all(&words), plain);
        let last = words.len() - 1;
        words[last] ^= 1;
        assert_ne!(read_all(&words), plain);
        assert_eq!(timed_passes(&words, 3).unwrap().len(), 3);
    }
}
