//! `--threads`: one meaning in every command. It sizes the one worker pool a command's
//! parallel work runs on (hashing files or tiles, packing, comparing, the kernels of a run);
//! the default is every core. The pool is set up once, in `main`, before any work starts.

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
