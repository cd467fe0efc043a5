//! Dense Qwen3 (Qwen3-0.6B to Qwen3-32B): the Llama model (`models/llama`) with a per-head
//! RMSNorm of queries and keys; this folder reads its config. MLX and Hugging Face layouts.

pub mod config;

use crate::engine::architecture::{ArchitectureRow, parsed};
use minirun_text::ChatFormat;

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "qwen3",
    summary: "Qwen3: Qwen3-0.6B to Qwen3-32B (dense)",
    parse: |json| parsed(config::parse, json),
    chat: ChatFormat::Template,
    published: None,
};
