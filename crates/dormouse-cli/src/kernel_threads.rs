//! One thread per matrix product for the inference commands (`generate`, `serve`).
//!
//! Decoding runs one byte at a time, so every matrix product is tiny, and candle splits each
//! across all cores anyway: on `small`, `dormouse generate` makes 608 bytes/s with single-threaded
//! kernels against 343 with two threads per product. candle reads its thread count only from
//! the environment (`RAYON_NUM_THREADS`), once, so the way to set it for our own process is to
//! re-execute the program with the variable set before anything else runs. `exec` replaces the
//! process image in place: same PID, same signals, same stdio.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The variable candle (and rayon) read their thread count from.
pub const THREADS_VARIABLE: &str = "RAYON_NUM_THREADS";

/// Re-executes the running program, with the same arguments, with `RAYON_NUM_THREADS=1` unless
/// the variable is already set (the user's own choice is kept). Returns only if it is set or the
/// exec failed; call it in `main` before anything starts a thread pool (parsing the arguments
/// does not).
pub fn single_threaded_kernels() {
    if std::env::var_os(THREADS_VARIABLE).is_some() {
        return;
    }
    let Ok(program) = std::env::current_exe() else {
        return;
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let error = Command::new(program)
        .args(args)
        .env(THREADS_VARIABLE, "1")
        .exec();
    eprintln!("note: could not re-execute with {THREADS_VARIABLE}=1 ({error}); continuing");
}
