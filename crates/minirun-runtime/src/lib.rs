//! minirun's runtime: kernels that compute straight from an artifact's stored bytes, and the
//! models that run on them.

pub mod artifact;
pub mod batch;
pub mod budget;
pub mod config;
pub mod deepseek;
pub mod deepseek_v4;
pub mod deepseek_v4_config;
pub mod experts;
pub mod generate;
pub mod kernels;
pub mod kimi_k3;
pub mod kimi_k3_config;
pub mod kimi_text;
pub mod layer_stream;
pub mod layers;
pub mod model;
pub mod model_bench;
pub mod plan;
pub mod read_clock;
pub mod rope;
pub mod session;
mod shared_rows;
pub mod text;
