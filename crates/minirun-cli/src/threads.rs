//! `--threads`: one meaning in every command. It sizes the one worker pool a command's
//! parallel work runs on (hashing files or tiles, packing, comparing, the kernels of a run);
//! the default is every core. The pool is set up once, in `main`, before any work starts.
//!
//! A run's decoding itself runs on one of the pool's workers ([`on_pool`]): from any other
//! thread, each parallel product would be handed to the pool while the caller sleeps until it
//! is done, a wake-up and a sleep per product, and a decode step has a hundred of them.

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug, Clone, Copy, Default)]
pub struct Threads {
    /// Worker threads for this command's parallel work: hashing, packing, comparing, the
    /// kernels of a run (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
}

/// Sets up the process's worker pool with the chosen size.
pub fn init(threads: Threads) -> Result<()> {
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads.threads {
        builder = builder.num_threads(usize::from(n));
    }
    builder
        .build_global()
        .context("cannot start the worker threads")
}

/// Runs `work` on a worker of the pool `init` set up, the calling thread waiting for it: the
/// parallel work `work` starts then splits with the other workers directly.
///
/// `work` holds its worker while it runs, blocked or not; it must not wait for other parallel
/// work started from outside the pool (with one thread, that work would never start).
pub fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| work())
}
