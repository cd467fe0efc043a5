//! What runs any architecture: its config read fail-closed ([`config`]), the row an architecture
//! registers ([`architecture`]), the layers run held or streamed ([`layered_model`]) under one
//! decode policy ([`decode_policy`]), and the decoder a session drives ([`decoder`], [`model`]).

pub mod architecture;
pub mod config;
pub mod decode_policy;
pub mod decoder;
pub mod layered_model;
pub mod model;
