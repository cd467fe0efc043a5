//! How many threads candle's kernels use, set for our own process.
//!
//! candle reads its thread counts only from the environment, once, so the way to set them for
//! our own process is to re-execute the program with the variable set before anything else
//! runs. `exec` replaces the process image in place: same PID, same signals, same stdio. A
//! variable the user already set is kept.
//!
//! - **Decoding** (`generate`, `serve`) runs one byte at a time, so every matrix product is
//!   tiny, and candle splits each across all cores anyway: on `small`, `dormouse generate`
//!   makes 608 bytes/s with single-threaded kernels against 343 with two threads per product.
//!   `RAYON_NUM_THREADS=1` makes every kernel single-threaded.
//! - **Training** keeps every core for the matrix products (gemm, through rayon), but runs
//!   candle's element-wise operations on the calling thread (`CANDLE_NUM_THREADS=1`). Those
//!   have a pool of their own whose workers spin between operations: on 2 cores a spinning
//!   worker took 30% of the samples of a `nano` run and competed with gemm's threads for the
//!   second core (the `train_throughput` example, with and without it alternated: 1.01-1.28x
//!   tokens/s without the pool). Element-wise
//!   results do not depend on the thread that computes them, so the losses are the same.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The variable candle (and rayon) read their thread count from.
pub const THREADS_VARIABLE: &str = "RAYON_NUM_THREADS";

/// The variable candle reads the size of its element-wise pool from (default: the rayon count).
pub const ELEMENTWISE_THREADS_VARIABLE: &str = "CANDLE_NUM_THREADS";

/// Re-executes with `RAYON_NUM_THREADS=1` (see the module docs). Returns only if the variable
/// is set or the exec failed; call it in `main` before anything starts a thread pool (parsing
/// the arguments does not).
pub fn single_threaded_kernels() {
    reexecute_with(THREADS_VARIABLE, "1");
}

/// Re-executes with `CANDLE_NUM_THREADS=1` (see the module docs), as
/// [`single_threaded_kernels`] does.
pub fn elementwise_on_calling_thread() {
    reexecute_with(ELEMENTWISE_THREADS_VARIABLE, "1");
}

fn reexecute_with(variable: &str, value: &str) {
    if std::env::var_os(variable).is_some() {
        return;
    }
    let Ok(program) = std::env::current_exe() else {
        return;
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let error = Command::new(program).args(args).env(variable, value).exec();
    eprintln!("note: could not re-execute with {variable}={value} ({error}); continuing");
}
