//! Shared pieces of dormouse's programs.

pub mod baselines;
pub mod completions;
pub mod kernel_threads;
