//! A request's prompt turned into ids for `minirun serve`, on a blocking worker of the async
//! runtime rather than on the decode thread: a long prompt then costs its own client time and
//! never stalls the requests being decoded. A prompt whose bytes alone prove it longer than
//! the context is refused before it is tokenized.

use std::sync::Arc;

use http_serve::ApiError;
use minirun_text::Text;

use crate::serve::requests::Prompt;

/// The prompt's ids (a text prompt with the tokenizer's BOS, a chat rendered with the
/// artifact's template), or why it is refused.
pub async fn prompt_ids(
    text: Arc<Text>,
    prompt: Prompt,
    context: usize,
) -> Result<Vec<u32>, ApiError> {
    refuse_by_bytes(&text, &prompt, context)?;
    tokio::task::spawn_blocking(move || tokenize(&text, &prompt))
        .await
        .map_err(|_| ApiError::server("tokenizer_failed", "the tokenizer stopped on this prompt"))?
}

fn tokenize(text: &Text, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let ids = match prompt {
        Prompt::Text(raw) => text.encode(raw, true),
        Prompt::Chat(messages) => text.conversation_ids(messages),
    };
    ids.map_err(|e| {
        ApiError::invalid(
            "prompt",
            "invalid_prompt",
            format!("the prompt cannot be tokenized: {e}"),
        )
    })
}

/// Refuses a prompt of `n` bytes when even `n / longest token` tokens leave no room for one
/// generated token. Only tokenizers that can bound a token's bytes exactly are measured so.
fn refuse_by_bytes(text: &Text, prompt: &Prompt, context: usize) -> Result<(), ApiError> {
    let Some(longest) = text.longest_token_bytes() else {
        return Ok(());
    };
    let bytes = match prompt {
        Prompt::Text(raw) => raw.len(),
        Prompt::Chat(messages) => messages.iter().map(|(_, content)| content.len()).sum(),
    };
    let fewest_tokens = bytes.div_ceil(longest.max(1));
    if fewest_tokens < context {
        return Ok(());
    }
    Err(ApiError::invalid(
        "prompt",
        "context_length_exceeded",
        format!(
            "the prompt's {bytes} bytes are at least {fewest_tokens} tokens (no token of this tokenizer stands for more than {longest} bytes), and this server's context is {context} tokens a request (--context): shorten the prompt"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize) -> String {
        "lock".repeat(n)
    }

    fn kimi() -> Text {
        // The smallest tiktoken vocabulary: the 256 single bytes, so the longest token is 1 byte.
        use base64::Engine;
        let model: String = (0..=255u8)
            .map(|b| {
                format!(
                    "{} {b}\n",
                    base64::engine::general_purpose::STANDARD.encode([b])
                )
            })
            .collect();
        Text::open(None, None, Some(model.as_bytes())).unwrap()
    }

    #[test]
    fn a_prompt_longer_in_bytes_than_the_context_can_hold_is_refused_unread() {
        let text = kimi();
        assert_eq!(text.longest_token_bytes(), Some(1));
        let refused = refuse_by_bytes(&text, &Prompt::Text(words(16)), 64).unwrap_err();
        assert!(format!("{refused:?}").contains("context_length_exceeded"));
        let chat = Prompt::Chat(vec![("user".into(), words(16))]);
        assert!(refuse_by_bytes(&text, &chat, 64).is_err());
        assert!(refuse_by_bytes(&text, &Prompt::Text(words(15)), 64).is_ok());
    }
}
