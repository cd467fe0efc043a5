//! The request fields both servers read the same way: `model`, a single `prompt`, `n`, and
//! `stop`. Each check refuses with the OpenAI-shaped error naming the field.

use serde::Deserialize;

use crate::ApiError;

/// At most this many stop sequences, each at most this many bytes.
pub const MAX_STOPS: usize = 4;
pub const MAX_STOP_BYTES: usize = 64;

/// A field OpenAI takes as one string or a list of them (`prompt`, `stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The body was not JSON of the request's shape.
pub fn invalid_json(e: serde_json::Error) -> ApiError {
    ApiError {
        status: 400,
        message: format!("the body is not a valid request: {e}"),
        kind: "invalid_request_error",
        param: None,
        code: "invalid_json",
    }
}

/// A `model` the request names must be the served one (404 otherwise).
pub fn check_model(asked: Option<&str>, served: &str) -> Result<(), ApiError> {
    match asked {
        Some(model) if model != served => Err(ApiError::unknown_model(model, served)),
        _ => Ok(()),
    }
}

/// Only one choice per request.
pub fn check_one_choice(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        Some(n) if n != 1 => Err(ApiError::invalid(
            "n",
            "invalid_value",
            "only n = 1 is supported",
        )),
        _ => Ok(()),
    }
}

/// The one non-empty prompt: a string, or a list of exactly one.
pub fn single_prompt(prompt: Option<OneOrMany>) -> Result<String, ApiError> {
    let prompt = match prompt {
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
            "the prompt is empty: give some text to continue",
        ));
    }
    Ok(prompt)
}

/// The stop sequences as bytes: at most [`MAX_STOPS`], each 1 to [`MAX_STOP_BYTES`] bytes.
pub fn stop_sequences(stop: Option<OneOrMany>) -> Result<Vec<Vec<u8>>, ApiError> {
    let stops: Vec<Vec<u8>> = match stop {
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
    Ok(stops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Option<OneOrMany> {
        Some(OneOrMany::One(s.into()))
    }

    #[test]
    fn each_shared_field_is_refused_by_name() {
        assert_eq!(single_prompt(one("hi")).unwrap(), "hi");
        assert_eq!(single_prompt(None).unwrap_err().code, "missing");
        assert_eq!(single_prompt(one("")).unwrap_err().param, Some("prompt"));
        let two = Some(OneOrMany::Many(vec!["a".into(), "b".into()]));
        assert_eq!(single_prompt(two).unwrap_err().param, Some("prompt"));
        assert_eq!(stop_sequences(one("\n")).unwrap(), vec![b"\n".to_vec()]);
        let many = Some(OneOrMany::Many(vec!["x".into(); MAX_STOPS + 1]));
        assert_eq!(stop_sequences(many).unwrap_err().param, Some("stop"));
        assert_eq!(stop_sequences(one("")).unwrap_err().param, Some("stop"));
        let long = "z".repeat(MAX_STOP_BYTES + 1);
        assert_eq!(stop_sequences(one(&long)).unwrap_err().param, Some("stop"));
        assert_eq!(check_model(Some("other"), "m").unwrap_err().status, 404);
        assert!(check_model(Some("m"), "m").is_ok() && check_model(None, "m").is_ok());
        assert_eq!(check_one_choice(Some(2)).unwrap_err().param, Some("n"));
        assert!(check_one_choice(Some(1)).is_ok());
    }
}
