//! minirun's storage side: what of an artifact is where, what is held, what streams, and every
//! read a run makes. It knows no model: a model asks for its tensors through [`weights::Weights`]
//! (the handle the [`plan`] places: resident, held, or streamed), a publisher's reader registers
//! a published layout through the [`artifact`]'s registration API, and both see the errors and
//! the expert-naming types ([`experts`]), nothing more of how the bytes arrive.
//!
//! From the bottom up: [`artifact`] opens an artifact and hands out its tensors and parts;
//! [`budget`] is the memory a run may use; [`plan`] decides what of it holds what;
//! [`weights`] is the handle built from the plan, and [`matrix`] a layer's matrix from it, held
//! or streamed; [`layer_stream`], [`expert_stream`] and
//! [`tables`] read streamed layers, routed experts and the embedding's and head's rows ahead of
//! the compute; [`step`] reports what a step read.

pub mod artifact;
pub mod budget;
pub mod expert_stream;
pub mod experts;
pub mod fetched_experts;
pub mod guessed_experts;
pub mod layer_stream;
pub mod matrix;
pub mod model_weights;
pub mod plan;
pub mod ranking;
pub mod read_clock;
pub mod step;
pub mod tables;
pub mod weights;
