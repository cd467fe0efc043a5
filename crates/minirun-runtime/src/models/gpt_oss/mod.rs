//! gpt-oss (gpt-oss-20b, gpt-oss-120b): attention sinks, sliding and full attention by layer,
//! YaRN, biased MXFP4 experts with gpt-oss's SwiGLU; OpenAI's and MLX's layouts; the harmony
//! chat format.

pub mod config;
pub mod model;

pub use config::GptOssConfig;
pub use model::{GptOss, GptOssModel};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for GptOssConfig {
    type Model<'a> = GptOssModel<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "gpt_oss",
    summary: "gpt-oss: gpt-oss-20b, gpt-oss-120b",
    parse: |json| parsed(GptOssConfig::parse, json),
    chat: ChatFormat::Harmony,
    published: None,
};
