//! DeepSeek V4: hyper-connections, sliding-window and compressed attention with sinks, hash and
//! sqrt-softplus routing, clamped SwiGLU; DeepSeek's FP8/FP4 storage.

pub mod config;
mod hyper_connections;
pub mod model;
pub mod published_layout;

pub use config::DeepSeekV4Config;
pub use model::{DeepSeekV4, DeepSeekV4Model};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for DeepSeekV4Config {
    type Model<'a> = DeepSeekV4Model<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "deepseek_v4",
    summary: "DeepSeek V4",
    parse: |json| parsed(DeepSeekV4Config::parse, json),
    chat: ChatFormat::DeepSeekV4,
    published: Some(&published_layout::READER),
};
