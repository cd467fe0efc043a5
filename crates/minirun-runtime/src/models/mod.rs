//! One folder per architecture: `config.rs` reads its `config.json` fail-closed, `model.rs`
//! builds its layers from a [`minirun_stream::weights::Weights`] handle and runs rows through them, and
//! `mod.rs` holds its row of [`crate::registry::ARCHITECTURES`].

pub mod deepseek_v3;
pub mod deepseek_v4;
pub mod gpt_oss;
pub mod kimi_k3;
pub mod llama;
pub mod qwen3;
pub mod qwen3_moe;
