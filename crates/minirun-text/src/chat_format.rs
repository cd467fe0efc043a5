//! How an architecture's chats become prompts where the artifact's tokenizer files do not say
//! it all: the architecture's registry row names one [`ChatFormat`], and the text applies it, so
//! that nothing between them matches on which architecture it is.

use crate::{Text, TextError};

/// The chat format an architecture brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// The tokenizer's own: `tokenizer_config.json`'s Jinja template (or none), or, for a
    /// `tiktoken.model` vocabulary, Kimi K3's template built around it.
    Template,
    /// DeepSeek V4's no-thinking template where the tokenizer config has none (its checkpoints
    /// ship `encoding_dsv4.py`, not a Jinja template); the tokenizer must hold V4's control
    /// tokens.
    DeepSeekV4,
    /// gpt-oss's harmony format, rendered by minirun whatever template the tokenizer config
    /// carries; chats show the final channel only.
    Harmony,
}

impl Text {
    /// The text with `format` applied: refused when the vocabulary lacks the control tokens the
    /// format needs (DeepSeek V4's; harmony's are refused when a chat is rendered).
    pub fn with_chat_format(self, format: ChatFormat) -> Result<Text, TextError> {
        match format {
            ChatFormat::Template => Ok(self),
            ChatFormat::DeepSeekV4 => self.with_v4_template(),
            ChatFormat::Harmony => Ok(self.with_harmony()),
        }
    }
}
