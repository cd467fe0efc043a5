//! minirun's runtime: the models that run on the kernels (`minirun-kernels`), straight from an
//! artifact's stored bytes, which `minirun-stream` places and reads.
//!
//! Foldered by role: `engine/` runs any architecture (its config read fail-closed, its layers
//! held or streamed under one decode policy); `blocks/` are the pieces the architectures share
//! (attention variants, routed MoE, MLP, norms, RoPE); [`models`] holds one folder per
//! architecture and [`registry`] one row each; `session/` is the front door a program runs a
//! model through: an artifact opened through its evidence, a plan, a model, tokens.

mod blocks;
mod engine;
pub mod models;
pub mod registry;
mod session;

pub use engine::config::ConfigError;
pub use engine::decode_policy::PREFILL_CHUNK;
pub use engine::decoder::Decoder;
pub use engine::model::{Model, ModelCache};
pub use session::batch::{Batch, Event, Request, StepFailed};
pub use session::generate::{Figures, Sampler, Sampling, StepRecord, StopReason, argmax, generate};
pub use session::request::{PlannedRun, RunRequest};
pub use session::{Generation, IncrementalText, Session, SessionError, TokenEvent, Trust};
