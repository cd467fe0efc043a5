//! The Engram memory: learned rows addressed by hashed n-grams of the last bytes.
//!
//! - [`hash`]: the documented hash (`mulxor-v1`) that says which row each position reads; the
//!   model's own tables and the host-RAM memory are addressed alike;
//! - [`memory`]: the host-RAM table of an `--engram-ram` run, gathered per batch and updated
//!   sparsely (training only);
//! - [`sidecar`]: that table on disk, `<name>.ngram` beside the run's checkpoint.

pub mod hash;
pub mod memory;
pub mod sidecar;

/// At most this many n-gram orders a host-RAM memory holds: the sidecar header has room for
/// eight. Here rather than in [`sidecar`] so that the config can refuse more orders without
/// reaching into training code.
pub const MAX_ORDERS: usize = 8;
