//! Text in and out: the artifact's `tokenizer.json` (the `tokenizers` crate) and the chat
//! template of its `tokenizer_config.json` (rendered with `minijinja`, with Python string
//! methods as Hugging Face templates use them).

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("the artifact has no tokenizer.json: this runtime reads Hugging Face tokenizers only")]
    NoTokenizer,
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    #[error(
        "--chat needs a chat_template in tokenizer_config.json, and this artifact has none; run without --chat"
    )]
    NoTemplate,
    #[error("tokenizer_config.json: {0}")]
    Config(String),
    #[error("the chat template failed: {0}")]
    Template(String),
}

pub struct Text {
    tokenizer: tokenizers::Tokenizer,
    config: Option<Value>,
}

/// A special token in tokenizer_config.json: a string, or an object with `content`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl Text {
    pub fn new(
        tokenizer_json: Option<&str>,
        tokenizer_config_json: Option<&str>,
    ) -> Result<Text, TextError> {
        let json = tokenizer_json.ok_or(TextError::NoTokenizer)?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let config = tokenizer_config_json
            .map(|t| serde_json::from_str(t).map_err(|e| TextError::Config(e.to_string())))
            .transpose()?;
        Ok(Text { tokenizer, config })
    }

    /// Token ids of `text`; `special` adds what the tokenizer's post-processor adds (a BOS).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TextError> {
        let encoding = self
            .tokenizer
            .encode(text, special)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// The id of a token given by its text, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The EOS token named by tokenizer_config.json, as an id.
    pub fn eos_id(&self) -> Option<u32> {
        token_text(self.config.as_ref()?.get("eos_token")).and_then(|t| self.token_id(&t))
    }

    /// One user message rendered with the chat template, ready for the assistant's reply.
    pub fn chat_prompt(&self, user: &str) -> Result<String, TextError> {
        self.render_chat(&[("user".to_string(), user.to_string())])
    }

    /// `(role, content)` messages rendered with the chat template and the generation prompt.
    pub fn render_chat(&self, messages: &[(String, String)]) -> Result<String, TextError> {
        let config = self.config.as_ref().ok_or(TextError::NoTemplate)?;
        let template = config
            .get("chat_template")
            .and_then(Value::as_str)
            .ok_or(TextError::NoTemplate)?;
        // Hugging Face renders chat templates with trim_blocks, lstrip_blocks and loop controls.
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    message,
                ))
            },
        );
        env.add_template("chat", template)
            .map_err(|e| TextError::Template(e.to_string()))?;
        let context = minijinja::context! {
            messages => messages
                .iter()
                .map(|(role, content)| minijinja::context! { role => role, content => content })
                .collect::<Vec<_>>(),
            add_generation_prompt => true,
            bos_token => token_text(config.get("bos_token")).unwrap_or_default(),
            eos_token => token_text(config.get("eos_token")).unwrap_or_default(),
        };
        env.get_template("chat")
            .and_then(|t| t.render(context))
            .map_err(|e| TextError::Template(e.to_string()))
    }
}
