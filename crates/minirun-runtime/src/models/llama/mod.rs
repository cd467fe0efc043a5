//! Llama (Llama 3.x): a dense pre-norm decoder with grouped-query attention and Llama 3.1's
//! RoPE frequency rule; MLX and Hugging Face layouts. Dense Qwen3 (`models/qwen3`) runs on the
//! same model, its q/k norms on.

pub mod config;
pub mod model;

pub use config::LlamaConfig;
pub use model::{Llama, LlamaModel};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for LlamaConfig {
    type Model<'a> = LlamaModel<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "llama",
    summary: "Llama: Llama 3.x (dense)",
    parse: |json| parsed(LlamaConfig::parse, json),
    chat: ChatFormat::Template,
    published: None,
};
