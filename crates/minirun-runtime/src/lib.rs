//! minirun's runtime: kernels that compute straight from an artifact's stored bytes, and the
//! models that run on them.

pub mod artifact;
pub mod config;
pub mod deepseek;
pub mod generate;
pub mod kernels;
pub mod rope;
pub mod session;
pub mod text;
