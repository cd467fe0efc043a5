//! The OpenAI-compatible `/v1/completions` request and its validation, as documented in
//! `docs/serve.md`.

use dormouse::sample::SamplingParams;
use http_serve::ApiError;
use http_serve::requests::{
    OneOrMany, check_model, check_one_choice, invalid_json, single_prompt, stop_sequences,
};
use serde::Deserialize;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest `max_tokens` accepted (one token is one byte).
pub const MAX_TOKENS_LIMIT: u64 = 4096;
/// `max_tokens` when the request does not say (OpenAI's default).
pub const DEFAULT_MAX_TOKENS: u64 = 16;

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
    let req: CompletionRequest = serde_json::from_slice(body).map_err(invalid_json)?;
    check_model(req.model.as_deref(), model_id)?;
    let prompt = single_prompt(req.prompt)?;
    check_one_choice(req.n)?;
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
    let stops = stop_sequences(req.stop)?;
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
