//! dormouse: a small byte-level language model with an Engram hashed n-gram memory, on
//! candle (CPU).
//!
//! - [`config`]: `DormouseConfig`, its validation and the embedded presets;
//! - [`engram`]: the documented n-gram hash (`mulxor-v1`) that addresses the memory;
//! - [`model`]: the model, one forward function for training and inference, with a KV cache;
//! - [`checkpoint`]: the training checkpoint container (`DMTRAIN`), read section by section;
//! - [`weights`]: named tensors to and from safetensors, checked against the model's shapes;
//! - [`train`]: the training loop's parts (corpus split, seeded init, AdamW, schedule, EMA,
//!   held-out BPB) and a resumable run;
//! - [`ngram`]: the host-RAM memory of an `--engram-ram` run and its `.ngram` sidecar;
//! - [`export`]: a run to one `.dmexp` file (`export run`);
//! - [`serving`]: loading an export for inference, refusing what cannot be served;
//! - [`sample`]: greedy and seeded sampling, and incremental generation with the KV cache.

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod engram;
pub mod export;
pub mod model;
pub mod ngram;
pub mod sample;
pub mod serving;
pub mod train;
pub mod weights;

pub use config::{ConfigError, ConfigReadError, DormouseConfig};
pub use model::{Dormouse, KvCache};
