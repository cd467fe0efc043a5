//! Text in and out: the artifact's `tokenizer.json` (the `tokenizers` crate) and the chat
//! template of its `tokenizer_config.json` (rendered with `minijinja`, with Python string
//! methods as Hugging Face templates use them); or, without a `tokenizer.json`, Kimi K3's
//! `tiktoken.model` and its chat template ([`crate::kimi_text`]).

use serde_json::Value;

use crate::error::TextError;
use crate::harmony::{self, HarmonyIds};
use crate::tiktoken::KimiText;

pub struct Text {
    inner: Inner,
}

enum Inner {
    HuggingFace {
        tokenizer: Box<tokenizers::Tokenizer>,
        config: Option<Value>,
        /// DeepSeek V4's template, when the tokenizer config carries none (the publisher
        /// compiles it into its app rather than shipping one).
        v4_template: bool,
        /// gpt-oss's harmony format (its prompt, stops and final-channel replies): its control
        /// ids, looked up once, or the control tokens the vocabulary lacks.
        harmony: Option<Result<HarmonyIds, Vec<&'static str>>>,
    },
    Kimi(Box<KimiText>),
}

/// DeepSeek V4's control tokens (full-width bars, U+2581 for the spaces).
pub const V4_BOS: &str = "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>";
pub const V4_EOS: &str = "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>";
pub const V4_USER: &str = "<\u{ff5c}User\u{ff5c}>";
pub const V4_ASSISTANT: &str = "<\u{ff5c}Assistant\u{ff5c}>";
pub const V4_END_THINK: &str = "</think>";

/// DeepSeek V4's no-thinking chat: the BOS; a system message's content; `<｜User｜>` and a
/// user's; an assistant's content and the EOS; after a user message that an assistant's follows
/// (or that is last, where the reply starts) `<｜Assistant｜></think>`. Empty contents are left
/// out.
pub fn v4_chat(messages: &[(String, String)]) -> String {
    let mut out = V4_BOS.to_string();
    for (i, (role, content)) in messages.iter().enumerate() {
        match role.as_str() {
            "user" => {
                out.push_str(V4_USER);
                out.push_str(content);
                let next = messages.get(i + 1).map(|(r, _)| r.as_str());
                if matches!(next, None | Some("assistant")) {
                    out.push_str(V4_ASSISTANT);
                    out.push_str(V4_END_THINK);
                }
            }
            "assistant" if !content.is_empty() => {
                out.push_str(content);
                out.push_str(V4_EOS);
            }
            _ => out.push_str(content),
        }
    }
    out
}

/// A special token in tokenizer_config.json: a string, or an object with `content`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Refuses a message whose content spells one of the tokenizer's special (control) tokens: the
/// rendered conversation is encoded as one text, in which such a spelling would become the
/// control token itself, so a user could close their turn and write the assistant's.
fn refuse_control_tokens(
    tokenizer: &tokenizers::Tokenizer,
    messages: &[(String, String)],
) -> Result<(), TextError> {
    let decoder = tokenizer.get_added_tokens_decoder();
    let controls: Vec<&str> = decoder
        .values()
        .filter(|t| t.special && !t.content.is_empty())
        .map(|t| t.content.as_str())
        .collect();
    for (index, (role, content)) in messages.iter().enumerate() {
        if let Some(token) = controls.iter().find(|c| content.contains(**c)) {
            return Err(TextError::ControlTokenInMessage {
                index,
                role: role.clone(),
                token: token.to_string(),
            });
        }
    }
    Ok(())
}

impl Text {
    /// Refuses a conversation whose encoding `ids` holds more of any control token than the
    /// template alone puts there: the same conversation rendered with every message's content
    /// replaced by a neutral word is what the template puts. Each message alone holds no control
    /// spelling ([`refuse_control_tokens`]), but the template joins them, and the end of one
    /// message and the start of the next can spell one where the template puts nothing between.
    fn refuse_controls_formed(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        messages: &[(String, String)],
        ids: &[u32],
    ) -> Result<(), TextError> {
        let neutral: Vec<(String, String)> = messages
            .iter()
            .map(|(role, _)| (role.clone(), "x".to_string()))
            .collect();
        let template_ids = self.encode(&self.render_chat(&neutral)?, false)?;
        let count = |ids: &[u32], id: u32| ids.iter().filter(|&&i| i == id).count();
        for (&id, token) in tokenizer.get_added_tokens_decoder().iter() {
            if token.special && count(ids, id) > count(&template_ids, id) {
                return Err(TextError::ControlTokenAcrossMessages {
                    token: token.content.clone(),
                });
            }
        }
        Ok(())
    }

    /// A Hugging Face tokenizer (with its tokenizer_config.json) when there is a
    /// `tokenizer.json`, else Kimi K3's from a `tiktoken.model`.
    pub fn new(
        tokenizer_json: Option<&str>,
        tokenizer_config_json: Option<&str>,
    ) -> Result<Text, TextError> {
        Text::open(tokenizer_json, tokenizer_config_json, None)
    }

    pub fn open(
        tokenizer_json: Option<&str>,
        tokenizer_config_json: Option<&str>,
        tiktoken_model: Option<&[u8]>,
    ) -> Result<Text, TextError> {
        let inner = match (tokenizer_json, tiktoken_model) {
            (Some(json), _) => Inner::HuggingFace {
                tokenizer: Box::new(
                    tokenizers::Tokenizer::from_bytes(json.as_bytes())
                        .map_err(|e| TextError::Tokenizer(e.to_string()))?,
                ),
                config: tokenizer_config_json
                    .map(|t| serde_json::from_str(t).map_err(|e| TextError::Config(e.to_string())))
                    .transpose()?,
                v4_template: false,
                harmony: None,
            },
            (None, Some(model)) => Inner::Kimi(Box::new(KimiText::parse(model)?)),
            (None, None) => return Err(TextError::NoTokenizer),
        };
        Ok(Text { inner })
    }

    /// DeepSeek V4's built-in chat template and stops, where the tokenizer config has no
    /// template of its own. The tokenizer must hold V4's five control tokens.
    pub fn with_v4_template(mut self) -> Result<Text, TextError> {
        if let Inner::HuggingFace {
            config,
            v4_template,
            ..
        } = &mut self.inner
        {
            let own = config
                .as_ref()
                .and_then(|c| c.get("chat_template"))
                .is_some();
            *v4_template = !own;
        }
        let missing: Vec<&str> = [V4_BOS, V4_EOS, V4_USER, V4_ASSISTANT, V4_END_THINK]
            .into_iter()
            .filter(|t| self.token_id(t).is_none())
            .collect();
        match (&self.inner, missing.is_empty()) {
            (
                Inner::HuggingFace {
                    v4_template: true, ..
                },
                false,
            ) => Err(TextError::Tokenizer(format!(
                "it lacks DeepSeek V4's control tokens {missing:?}, which the V4 chat template needs: not V4's tokenizer"
            ))),
            _ => Ok(self),
        }
    }

    /// gpt-oss's chat format, harmony, rendered by minirun (see [`harmony`]) whatever template
    /// the tokenizer config carries: OpenAI's stamps the day it renders into the prompt.
    pub fn with_harmony(mut self) -> Text {
        let ids = HarmonyIds::find(|t| self.token_id(t));
        if let Inner::HuggingFace { harmony, .. } = &mut self.inner {
            *harmony = Some(ids);
        }
        self
    }

    /// Harmony's control token ids, when the format is harmony: refused, naming what the
    /// vocabulary lacks, when it does not hold them all.
    fn harmony_ids(&self) -> Option<Result<HarmonyIds, TextError>> {
        match &self.inner {
            Inner::HuggingFace {
                harmony: Some(ids), ..
            } => Some(ids.clone().map_err(|missing| {
                TextError::Tokenizer(format!(
                    "it lacks harmony's control tokens {missing:?}, which gpt-oss's chat format needs: not gpt-oss's o200k tokenizer"
                ))
            })),
            _ => None,
        }
    }

    /// What a chat shows of the reply `ids`: with harmony, the final channel's content only;
    /// otherwise every id.
    pub fn reply_ids(&self, ids: &[u32]) -> Vec<u32> {
        match self.harmony_ids() {
            Some(Ok(controls)) => {
                controls.final_channel(ids, |header| self.decode(header).unwrap_or_default())
            }
            _ => ids.to_vec(),
        }
    }

    /// The artifact file the tokenizer was read from.
    pub fn file_name(&self) -> &'static str {
        match &self.inner {
            Inner::HuggingFace { .. } => "tokenizer.json",
            Inner::Kimi(_) => "tiktoken.model",
        }
    }

    /// Refuses a tokenizer that can produce ids the model has no embedding for.
    pub fn check_fits(&self, vocab: usize) -> Result<(), TextError> {
        match self.vocab_size() <= vocab {
            true => Ok(()),
            false => Err(TextError::LargerThanModel {
                file: self.file_name(),
                ids: self.vocab_size(),
                vocab,
            }),
        }
    }

    /// The number of ids the tokenizer can produce.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::HuggingFace { tokenizer, .. } => tokenizer.get_vocab_size(true),
            Inner::Kimi(kimi) => kimi.vocab_size(),
        }
    }

    /// The most bytes of text one token stands for, where the tokenizer can say so exactly:
    /// Kimi K3's tiktoken vocabulary, where every byte of the text lands in exactly one token,
    /// so `n` bytes are at least `n / longest` tokens. `None` for a tokenizer.json, whose
    /// normalizer may drop text before it is split.
    pub fn longest_token_bytes(&self) -> Option<usize> {
        match &self.inner {
            Inner::HuggingFace { .. } => None,
            Inner::Kimi(kimi) => Some(kimi.longest_token_bytes()),
        }
    }

    /// Token ids of `text`; `special` adds what a Hugging Face tokenizer's post-processor adds
    /// (a BOS). Kimi K3's tokenizer adds nothing.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, TextError> {
        match &self.inner {
            Inner::HuggingFace { tokenizer, .. } => {
                let encoding = tokenizer
                    .encode(text, special)
                    .map_err(|e| TextError::Tokenizer(e.to_string()))?;
                Ok(encoding.get_ids().to_vec())
            }
            Inner::Kimi(kimi) => kimi.encode(text),
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        match &self.inner {
            Inner::HuggingFace { tokenizer, .. } => tokenizer
                .decode(ids, false)
                .map_err(|e| TextError::Tokenizer(e.to_string())),
            Inner::Kimi(kimi) => kimi.decode(ids),
        }
    }

    /// The id of a token given by its text, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::HuggingFace { tokenizer, .. } => tokenizer.token_to_id(token),
            Inner::Kimi(kimi) => kimi.special_id(token),
        }
    }

    /// The ids that end a reply: tokenizer_config.json's EOS, or Kimi K3's `[EOS]`,
    /// `<|end_of_msg|>` and `<|close|>`, or with V4's built-in template its five controls.
    pub fn stop_ids(&self) -> Vec<u32> {
        match &self.inner {
            Inner::HuggingFace {
                v4_template: true, ..
            } => [V4_BOS, V4_EOS, V4_USER, V4_ASSISTANT, V4_END_THINK]
                .into_iter()
                .filter_map(|t| self.token_id(t))
                .collect(),
            Inner::HuggingFace {
                config, harmony, ..
            } => {
                let eos = config
                    .as_ref()
                    .and_then(|c| token_text(c.get("eos_token")))
                    .and_then(|t| self.token_id(&t));
                let ends = match harmony {
                    Some(_) => vec![harmony::RETURN, harmony::CALL],
                    None => vec![],
                };
                let mut ids: Vec<u32> = eos.into_iter().collect();
                for id in ends.into_iter().filter_map(|t| self.token_id(t)) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ids
            }
            Inner::Kimi(kimi) => kimi.stop_ids(),
        }
    }

    /// One user message in the chat template, ready for the assistant's reply, as ids.
    pub fn chat_ids(&self, user: &str) -> Result<Vec<u32>, TextError> {
        self.conversation_ids(&[("user".to_string(), user.to_string())])
    }

    /// `(role, content)` messages in the chat template, ready for the assistant's reply, as ids.
    pub fn conversation_ids(&self, messages: &[(String, String)]) -> Result<Vec<u32>, TextError> {
        match &self.inner {
            Inner::HuggingFace { tokenizer, .. } => {
                refuse_control_tokens(tokenizer, messages)?;
                let ids = self.encode(&self.render_chat(messages)?, false)?;
                self.refuse_controls_formed(tokenizer, messages, &ids)?;
                Ok(ids)
            }
            Inner::Kimi(kimi) => kimi.chat_ids(messages),
        }
    }

    /// `(role, content)` messages rendered with the chat template and the generation prompt.
    pub fn render_chat(&self, messages: &[(String, String)]) -> Result<String, TextError> {
        let (config, v4_template) = match &self.inner {
            Inner::HuggingFace {
                config,
                v4_template,
                ..
            } => (config, *v4_template),
            Inner::Kimi(_) => {
                return Err(TextError::Template(
                    "Kimi K3's chat template is built in and gives ids, not text".into(),
                ));
            }
        };
        if v4_template {
            return Ok(v4_chat(messages));
        }
        if let Some(controls) = self.harmony_ids() {
            controls?;
            return harmony::harmony_chat(messages).map_err(TextError::Template);
        }
        let config = config.as_ref().ok_or(TextError::NoTemplate)?;
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
