//! The blocks the architectures share, each fixing its operations and their order so that a
//! model built from them gives the same bits at any batch size and whether its weights were
//! held or read just now: the pre-norm layer and the model's ends, the tables outside the layers
//! (embedding and head, held or read by rows), products counted in a step's figures, norms, the
//! gated MLP, routed mixture of experts, multi-head latent attention, grouped-query attention (over a plain cache, and
//! with its projections, norms and rotation as Llama and Qwen3 compute it), and rotary
//! position embedding.

pub mod grouped_attention;
pub mod latent_attention;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod pre_norm;
pub mod products;
pub mod rope;
pub mod rotary_gqa;
pub mod shared_rows;
pub mod tables;
