//! dormouse: a small byte-level language model with an Engram hashed n-gram memory, on
//! candle (CPU).
//!
//! The model and what inference needs:
//! - [`config`]: `DormouseConfig`, its validation and the embedded presets (`configs/`);
//! - [`engram`]: the memory's n-gram hash (`mulxor-v1`), and for `--engram-ram` runs the
//!   host-RAM memory and its `.ngram` sidecar;
//! - [`model`]: the model, one forward function for training and inference, with a KV cache;
//! - [`tensor_shapes`]: the tensors a config's model has, to check a file against;
//! - [`serving`]: loading an export for inference, refusing what cannot be served;
//! - [`fused`]: RMSNorm, RoPE, the causal softmax, SwiGLU and the loss as fused kernels, each
//!   with its backward pass;
//! - [`row_product`]: the matrix product of decoding steps, each row's bits independent of the batch;
//! - [`sample`]: greedy and seeded sampling, and incremental generation with the KV cache;
//! - [`batch`]: several generations decoded together, each with the bytes it gets alone;
//! - [`rng`]: the seeded generator behind every random choice.
//!
//! Training, which inference never reaches into:
//! - [`data`]: the corpus (embedded or read from files), its held-out split and its batches;
//! - [`init`]: a model with every parameter drawn from a seed;
//! - [`optim`]: AdamW, the host memory's sparse Adam, gradient clipping;
//! - [`train`]: the training loop's parts and a resumable run;
//! - [`training_run`]: a run to its last step, with its evaluations, saves and JSONL log;
//! - [`baselines`]: what a trained model must beat (gzip, xz, zstd, order-0 entropy);
//! - [`run_policy`]: what may start a run and what may change when it resumes;
//! - [`checkpoint`]: the training checkpoint container (`DMTRAIN`), read section by section;
//! - [`weights`]: named tensors to and from safetensors, checked against the model's shapes;
//! - [`export`]: a run to one `.dmexp` file (`dormouse export run`).

pub mod baselines;
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod engram;
pub mod export;
pub mod fused;
pub mod init;
pub mod model;
pub mod optim;
pub mod rng;
pub mod row_product;
pub mod run_policy;
pub mod sample;
pub mod serving;
mod step_attention;
pub mod tensor_shapes;
pub mod train;
pub mod training_run;
pub mod weights;

pub use config::{ConfigError, ConfigReadError, DormouseConfig};
pub use model::{Dormouse, KvCache};
