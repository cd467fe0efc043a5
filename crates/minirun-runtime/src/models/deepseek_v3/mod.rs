//! DeepSeek-V3 (DeepSeek V3/R1): multi-head latent attention, group-limited sigmoid routing,
//! shared experts; MLX and Hugging Face layouts.

pub mod config;
pub mod model;

pub use config::DeepSeekV3Config;
pub use model::{DeepSeekV3, DeepSeekV3Model};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for DeepSeekV3Config {
    type Model<'a> = DeepSeekV3Model<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "deepseek_v3",
    summary: "DeepSeek V3/R1",
    parse: |json| parsed(DeepSeekV3Config::parse, json),
    chat: ChatFormat::Template,
    published: None,
};
