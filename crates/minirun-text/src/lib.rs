//! minirun's text: an artifact's tokenizer (Hugging Face `tokenizer.json`, or Kimi K3's
//! `tiktoken.model`) and its chat template, turning prompts into ids and ids into text.

mod chat_format;
mod error;
pub mod harmony;
mod text;
pub mod tiktoken;

pub use chat_format::ChatFormat;
pub use error::TextError;
pub use text::*;
