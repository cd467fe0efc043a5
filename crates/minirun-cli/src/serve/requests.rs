//! The OpenAI requests `minirun serve` takes, `/v1/completions` and `/v1/chat/completions`,
//! validated into one [`Ask`]: what to tokenize, how many tokens, how to sample, where to stop.
//! A field the server cannot honour (n > 1, a role no template knows, a content part that is
//! not text) is refused with the field's name rather than ignored.

use http_serve::ApiError;
use http_serve::requests::{
    OneOrMany, check_model, check_one_choice, invalid_json, single_prompt, stop_sequences,
};
use minirun_runtime::Sampling;
use serde::Deserialize;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// `max_tokens` when the request does not say (OpenAI's default for completions).
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text, with the tokenizer's BOS.
    Text(String),
    /// `(role, content)` messages rendered with the artifact's chat template.
    Chat(Vec<(String, String)>),
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub prompt: Prompt,
    /// At most this many tokens; `None`: up to the context.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stops: Vec<Vec<u8>>,
    pub stream: bool,
}

/// The fields read from either request; others are ignored, as OpenAI's server ignores
/// fields it does not know.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    stream: Option<bool>,
    n: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Option<OneOrMany>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Option<Vec<Message>>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// A `/v1/completions` body for the model `model_id`; `seed_if_absent` seeds a request that
/// gives no seed.
pub fn completion(body: &[u8], model_id: &str, seed_if_absent: u64) -> Result<Ask, ApiError> {
    let req: CompletionBody = serde_json::from_slice(body).map_err(invalid_json)?;
    let prompt = single_prompt(req.prompt)?;
    let max_tokens = Some(req.common.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    finish(
        Prompt::Text(prompt),
        max_tokens,
        req.common,
        model_id,
        seed_if_absent,
    )
}

/// A `/v1/chat/completions` body for the model `model_id`.
pub fn chat(body: &[u8], model_id: &str, seed_if_absent: u64) -> Result<Ask, ApiError> {
    let req: ChatBody = serde_json::from_slice(body).map_err(invalid_json)?;
    let messages = req
        .messages
        .ok_or_else(|| ApiError::invalid("messages", "missing", "messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "invalid_value",
            "messages is empty: give at least one message",
        ));
    }
    let mut turns = Vec::with_capacity(messages.len());
    for message in messages {
        if !matches!(message.role.as_str(), "system" | "user" | "assistant") {
            return Err(ApiError::invalid(
                "messages",
                "invalid_value",
                format!(
                    "the role {:?} is not one the chat templates take: use system, user or assistant",
                    message.role
                ),
            ));
        }
        turns.push((message.role, content_text(message.content)?));
    }
    let max_tokens = req.common.max_completion_tokens.or(req.common.max_tokens);
    finish(
        Prompt::Chat(turns),
        max_tokens,
        req.common,
        model_id,
        seed_if_absent,
    )
}

/// A message's content as text: a string, or text parts joined.
fn content_text(content: Option<Content>) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            "messages",
                            "invalid_value",
                            format!(
                                "a content part of type {kind:?} cannot be served: these models read text parts only"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

/// The checks both requests share.
fn finish(
    prompt: Prompt,
    max_tokens: Option<u64>,
    common: Common,
    model_id: &str,
    seed_if_absent: u64,
) -> Result<Ask, ApiError> {
    check_model(common.model.as_deref(), model_id)?;
    check_one_choice(common.n)?;
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            "max_tokens",
            "invalid_value",
            "max_tokens must be at least 1",
        ));
    }
    let temperature = common.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::invalid(
            "temperature",
            "invalid_value",
            format!("temperature must be in [0, 2] (0 is greedy), not {temperature}"),
        ));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            "invalid_value",
            format!("top_p must be in (0, 1], not {top_p}"),
        ));
    }
    let stops = stop_sequences(common.stop)?;
    Ok(Ask {
        prompt,
        max_tokens: max_tokens.map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
        sampling: Sampling {
            temperature: temperature as f32,
            top_p: top_p as f32,
            seed: common.seed.unwrap_or(seed_if_absent),
        },
        stops,
        stream: common.stream.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_chats_are_validated_with_the_field_at_fault_named() {
        let ok = completion(
            br#"{"model":"m","prompt":["hi"],"max_tokens":5,"stop":"\n","temperature":0}"#,
            "m",
            9,
        )
        .unwrap();
        assert_eq!(ok.prompt, Prompt::Text("hi".into()));
        assert_eq!(
            (ok.max_tokens, ok.sampling.seed, ok.stream),
            (Some(5), 9, false)
        );
        assert_eq!(ok.sampling.temperature, 0.0);
        assert_eq!(ok.stops, vec![b"\n".to_vec()]);
        let chat_ok = chat(
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_completion_tokens":3,"stream":true}"#,
            "m",
            1,
        )
        .unwrap();
        assert_eq!(
            chat_ok.prompt,
            Prompt::Chat(vec![
                ("system".into(), "be brief".into()),
                ("user".into(), "ab".into())
            ])
        );
        assert_eq!((chat_ok.max_tokens, chat_ok.stream), (Some(3), true));
        assert_eq!(
            chat(br#"{"messages":[{"role":"user","content":"x"}]}"#, "m", 1)
                .unwrap()
                .max_tokens,
            None,
            "a chat without a limit runs to the context"
        );

        let err = |body: &[u8]| completion(body, "m", 0).unwrap_err();
        assert_eq!(err(b"{nope").code, "invalid_json");
        assert_eq!(err(br#"{"model":"other","prompt":"x"}"#).status, 404);
        assert_eq!(err(br#"{"prompt":""}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":["a","b"]}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"max_tokens":3}"#).code, "missing");
        assert_eq!(
            err(br#"{"prompt":"x","max_tokens":0}"#).param,
            Some("max_tokens")
        );
        assert_eq!(
            err(br#"{"prompt":"x","temperature":-1}"#).param,
            Some("temperature")
        );
        assert_eq!(err(br#"{"prompt":"x","top_p":0}"#).param, Some("top_p"));
        assert_eq!(err(br#"{"prompt":"x","n":2}"#).param, Some("n"));
        assert_eq!(
            err(br#"{"prompt":"x","stop":["a","b","c","d","e"]}"#).param,
            Some("stop")
        );
        let chat_err = |body: &[u8]| chat(body, "m", 0).unwrap_err();
        assert_eq!(chat_err(br#"{"messages":[]}"#).param, Some("messages"));
        assert_eq!(chat_err(br#"{"prompt":"x"}"#).code, "missing");
        assert!(
            chat_err(br#"{"messages":[{"role":"tool","content":"x"}]}"#)
                .message
                .contains("\"tool\"")
        );
        assert!(
            chat_err(br#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
                .message
                .contains("image_url")
        );
    }
}
