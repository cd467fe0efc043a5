//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): grouped-query attention with q/k norms, softmax
//! top-k routing, dense layers where the config says; MLX and Hugging Face layouts.

pub mod config;
pub mod model;

pub use config::Qwen3MoeConfig;
pub use model::{Qwen3Moe, Qwen3MoeModel};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for Qwen3MoeConfig {
    type Model<'a> = Qwen3MoeModel<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "qwen3_moe",
    summary: "Qwen3-MoE: Qwen3-30B-A3B, Qwen3-235B-A22B",
    parse: |json| parsed(Qwen3MoeConfig::parse, json),
    chat: ChatFormat::Template,
    published: None,
};
