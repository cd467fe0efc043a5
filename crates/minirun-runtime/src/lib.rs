//! minirun's runtime: the models that run on the kernels (`minirun-kernels`), straight from an
//! artifact's stored bytes.
//!
//! From the bottom up: [`artifact`] opens an artifact and hands out its tensors; [`weights`]
//! is the handle a model asks for them through, placed by the [`plan`]; [`blocks`] are the
//! pieces the architectures share; [`layered_model`] runs any architecture's layers, held or
//! streamed, under one decode policy ([`decode_policy`]); [`models`] holds one folder per
//! architecture and [`registry`] one row each; [`session`] and [`generate`] run them.

pub mod architecture;
pub mod artifact;
pub mod batch;
pub mod blocks;
pub mod budget;
pub mod config;
pub mod decode_policy;
pub mod decoder;
pub mod expert_stream;
pub mod experts;
pub mod fetched_experts;
pub mod generate;
pub mod guessed_experts;
pub mod layer_stream;
pub mod layered_model;
pub mod model;
pub mod model_weights;
pub mod models;
pub mod plan;
pub mod read_clock;
pub mod registry;
pub mod session;
pub mod step;
pub mod weights;
