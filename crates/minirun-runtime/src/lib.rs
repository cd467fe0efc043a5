//! minirun's runtime: kernels that compute straight from an artifact's stored bytes, and the
//! models that run on them.

pub mod kernels;
