//! When mimalloc returns freed memory to the kernel, set from Rust without `unsafe`.
//!
//! mimalloc "purges" memory a program has freed (hands its pages back to the kernel) after a
//! delay. A training step allocates and frees the same activation-sized buffers every step,
//! and under mimalloc's default the kernel took them back and zeroed them again on the next
//! step's first touch: 21,318 page faults in 10 steps of `small`, against 588 with purging
//! off (`perf stat -e page-faults` of `train_throughput --preset small --steps 10`). A
//! process whose working set is steady can keep the pages instead: [`never_purge`]. A process
//! held to a memory budget hands them back at once instead: [`purge_at_once`].
//!
//! The setting acts on the mimalloc this crate links (the one `mimalloc::MiMalloc` uses: the
//! two crates share one `libmimalloc-sys`), and only matters where that is the global
//! allocator; elsewhere it sets an option nothing reads.

/// `mi_option_purge_delay`'s position in mimalloc's option list (15 in v2 and in v3, which
/// keep deprecated options as placeholders so that positions never move).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc never to hand freed memory back to the kernel, from now on: the process
/// keeps its peak memory in exchange for no page faults on reuse. Call it before the
/// process's other threads start allocating (mimalloc's option setter is not thread safe).
#[allow(unsafe_code)]
pub fn never_purge() {
    // SAFETY: sets one integer option of the linked mimalloc; `-1` is its documented "no
    // purging at all".
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
}

/// Tells mimalloc to hand freed memory back to the kernel as soon as it is freed, from now on:
/// a process held to a memory budget whose large buffers come and go (a streamed run reading a
/// model's matrices one after another) stays within it. Under mimalloc v3's default delay of a
/// second, the buffers of matrices let go stayed mapped beside the ones read after them: a run
/// at Kimi K3's geometry with a 1.23 GiB budget peaked at 2.1 GiB of RSS, and at 1.3 GiB with
/// this. Call it before the process's other threads start allocating.
#[allow(unsafe_code)]
pub fn purge_at_once() {
    // SAFETY: sets one integer option of the linked mimalloc; `0` is "purge on free".
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

/// The purge delay mimalloc uses now, in milliseconds (`-1`: never).
#[allow(unsafe_code)]
// C's `long` is 64 bits here and 32 on other targets.
#[allow(clippy::useless_conversion)]
pub fn purge_delay_ms() -> i64 {
    // SAFETY: reads one integer option of the linked mimalloc.
    i64::from(unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) })
}
