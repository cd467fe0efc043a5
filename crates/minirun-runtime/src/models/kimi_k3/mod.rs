//! Kimi K3: Kimi Delta Attention and NoPE MLA with an output gate, attention residuals, a latent
//! mixture of experts, SiTU; mlx-lm's and the upstream names, and its published layout.

pub mod config;
pub mod model;
mod naming;
pub mod published_layout;

pub use config::KimiK3Config;
pub use model::{KimiK3, KimiK3Model};

use crate::engine::architecture::{ArchitectureRow, Family, parsed};
use minirun_text::ChatFormat;

impl Family for KimiK3Config {
    type Model<'a> = KimiK3Model<'a>;
}

pub static ROW: ArchitectureRow = ArchitectureRow {
    model_type: "kimi_k3",
    summary: "Kimi K3",
    parse: |json| parsed(KimiK3Config::parse, json),
    chat: ChatFormat::Template,
    published: Some(&published_layout::READER),
};
