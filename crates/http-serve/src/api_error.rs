//! Errors as OpenAI's API shapes them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`, so that official clients raise the right
//! exception with the server's message.

use axum::Json;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An OpenAI-shaped error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: &'static str,
}

impl ApiError {
    /// A 400 naming the request field at fault.
    pub fn invalid(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param),
            code,
        }
    }

    /// A 500: the server failed, not the request.
    pub fn server(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code,
        }
    }

    /// A request body refused before its handler ran (too large, too slow, not JSON).
    pub fn body(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code,
        }
    }

    /// A 404 for a `model` the server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            status: 404,
            message: format!("the model {asked:?} does not exist; this server serves {served:?}"),
            kind: "invalid_request_error",
            param: Some("model"),
            code: "model_not_found",
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.to_json())).into_response()
    }
}

/// A request body refused before its handler ran, as [`crate::Limits::refuse`] wants it.
pub fn body_refused(status: StatusCode, message: String) -> Response {
    ApiError::body(status, "invalid_body", message).into_response()
}

/// A body axum's extractor refused (above its limit, or unreadable), in the servers' error shape.
pub fn rejected_body(
    rejection: axum::extract::rejection::BytesRejection,
    max_body: usize,
) -> Response {
    body_refused(
        rejection.status(),
        format!(
            "{} (bodies are limited to {max_body} bytes)",
            rejection.body_text()
        ),
    )
}

/// The 404 for a path no route serves, listing the `routes` there are.
pub fn no_route(method: &Method, uri: &Uri, routes: &str) -> Response {
    ApiError {
        status: 404,
        message: format!("no route {method} {uri}; the routes are {routes}"),
        kind: "invalid_request_error",
        param: None,
        code: "not_found",
    }
    .into_response()
}

/// The 405 for a route asked with a method it does not take.
pub async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError {
        status: 405,
        message: format!("{uri} does not take {method}"),
        kind: "invalid_request_error",
        param: None,
        code: "method_not_allowed",
    }
    .into_response()
}
