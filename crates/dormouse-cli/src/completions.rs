//! The OpenAI-compatible `/v1/completions` request and its validation, as documented in
//! `docs/serve.md`.

use dormouse::sample::SamplingParams;
use http_serve::ApiError;
use serde::Deserialize;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest `max_tokens` accepted (one token is one byte).
pub const MAX_TOKENS_LIMIT: u64 = 4096;
/// `max_tokens` when the request does not say (OpenAI's default).
pub const DEFAULT_MAX_TOKENS: u64 = 16;
/// At most this many stop sequences, each at most this many bytes.
pub const MAX_STOPS: usize = 4;
pub const MAX_STOP_BYTES: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The fields of a completion request this server reads; others are ignored, as OpenAI's
/// server ignores fields it does not know.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    model: Option<String>,
    prompt: Option<OneOrMany>,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    stream: Option<bool>,
    n: Option<u64>,
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub prompt: Vec<u8>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<Vec<u8>>,
    pub stream: bool,
}

/// Parses and validates a request body for the model `model_id`. `seed_if_absent` seeds a
/// request that gives no seed.
pub fn parse_request(body: &[u8], model_id: &str, seed_if_absent: u64) -> Result<Job, ApiError> {
    let req: CompletionRequest = serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        message: format!("the body is not a valid completion request: {e}"),
        kind: "invalid_request_error",
        param: None,
        code: "invalid_json",
    })?;
    if let Some(model) = &req.model
        && model != model_id
    {
        return Err(ApiError::unknown_model(model, model_id));
    }
    let prompt = match req.prompt {
        Some(OneOrMany::One(p)) => p,
        Some(OneOrMany::Many(mut ps)) if ps.len() == 1 => ps.remove(0),
        Some(OneOrMany::Many(_)) => {
            return Err(ApiError::invalid(
                "prompt",
                "invalid_value",
                "give one prompt per request (a list of exactly one string at most)",
            ));
        }
        None => return Err(ApiError::invalid("prompt", "missing", "prompt is required")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "invalid_value",
            "the prompt is empty: give at least one byte to continue",
        ));
    }
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "n",
            "invalid_value",
            "only n = 1 is supported",
        ));
    }
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 || max_tokens > MAX_TOKENS_LIMIT {
        return Err(ApiError::invalid(
            "max_tokens",
            "invalid_value",
            format!(
                "max_tokens must be in 1..={MAX_TOKENS_LIMIT} (one token is one byte), not {max_tokens}"
            ),
        ));
    }
    let sampling = SamplingParams {
        temperature: req.temperature.unwrap_or(1.0),
        top_k: req.top_k.unwrap_or(0).min(256) as usize,
        top_p: req.top_p.unwrap_or(1.0),
        seed: req.seed.unwrap_or(seed_if_absent),
    };
    sampling.validate().map_err(|e| {
        let param = match e {
            dormouse::sample::SamplingError::Temperature(_) => "temperature",
            dormouse::sample::SamplingError::TopP(_) => "top_p",
        };
        ApiError::invalid(param, "invalid_value", e.to_string())
    })?;
    let stops: Vec<Vec<u8>> = match req.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.into_bytes()],
        Some(OneOrMany::Many(v)) => v.into_iter().map(String::into_bytes).collect(),
    };
    if stops.len() > MAX_STOPS
        || stops
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ApiError::invalid(
            "stop",
            "invalid_value",
            format!(
                "stop takes at most {MAX_STOPS} non-empty sequences of at most {MAX_STOP_BYTES} bytes"
            ),
        ));
    }
    Ok(Job {
        prompt: prompt.into_bytes(),
        max_tokens: max_tokens as usize,
        sampling,
        stops,
        stream: req.stream.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_validated_with_openai_shaped_errors() {
        let ok = parse_request(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"stop":"\n"}"#,
            "m",
            9,
        )
        .unwrap();
        assert_eq!(ok.prompt, b"hi");
        assert_eq!((ok.max_tokens, ok.sampling.seed, ok.stream), (5, 9, false));
        assert_eq!(ok.stops, vec![b"\n".to_vec()]);
        let err = |body: &[u8]| parse_request(body, "m", 0).unwrap_err();
        assert_eq!(err(b"{nope").code, "invalid_json");
        assert_eq!(err(br#"{"model":"other","prompt":"x"}"#).status, 404);
        assert_eq!(
            err(br#"{"prompt":"x","max_tokens":100000}"#).param,
            Some("max_tokens")
        );
        assert_eq!(err(br#"{"prompt":""}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"max_tokens":3}"#).code, "missing");
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
        let body = err(br#"{"prompt":"x","n":2}"#).to_json();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].as_str().unwrap().contains("n = 1"));
    }
}
