//! Why text could not be read, encoded, decoded or rendered.

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error(
        "the artifact has neither a tokenizer.json (Hugging Face) nor a tiktoken.model (Kimi K3): this runtime reads those two only"
    )]
    NoTokenizer,
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    #[error("tiktoken.model: {0}")]
    Tiktoken(String),
    #[error(
        "{file}: the tokenizer has {ids} ids and the model's vocabulary {vocab}: some ids it produces have no embedding"
    )]
    LargerThanModel {
        file: &'static str,
        ids: usize,
        vocab: usize,
    },
    #[error(
        "message {index} ({role}) contains {token:?}, one of the tokenizer's control tokens: remove it (a conversation's control tokens come only from the chat template, so a message cannot forge a turn)"
    )]
    ControlTokenInMessage {
        index: usize,
        role: String,
        token: String,
    },
    #[error(
        "the messages, joined by the chat template, spell {token:?}, one of the tokenizer's control tokens, where the template puts none (a piece of it ends one message and the rest begins the next): remove the pieces (a conversation's control tokens come only from the chat template, so messages cannot forge a turn together either)"
    )]
    ControlTokenAcrossMessages { token: String },
    #[error(
        "--chat needs a chat_template in tokenizer_config.json, and this artifact has none; run without --chat"
    )]
    NoTemplate,
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    #[error("the chat template failed: {0}")]
    Template(String),
}
