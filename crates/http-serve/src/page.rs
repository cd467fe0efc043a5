//! The page both servers serve at `/`: a chat over the server's own OpenAI routes, with the
//! model's identity and, where the server has them, the memory dial and live instruments. Its
//! three files are compiled into the binary, so the page works offline and always matches the
//! server that sends it. What a page shows comes from `GET /api/about` ([`About`]); the dial's and
//! the instruments' JSON are each server's own.

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

const INDEX_HTML: &str = include_str!("../page/index.html");
const APP_JS: &str = include_str!("../page/app.js");
const STYLE_CSS: &str = include_str!("../page/style.css");

/// The page may load only its own files and talk only to its own server: an answer a model
/// writes is text, and even text that looks like markup can never load or run anything.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// What the page shows of the server: sent as `GET /api/about`.
#[derive(Debug, Clone, Serialize)]
pub struct About {
    /// `minirun` or `dormouse`.
    pub program: &'static str,
    /// The served model's id, as `/v1/models` names it.
    pub model: String,
    pub mode: ChatMode,
    /// Whether the served bytes were checked against what their publisher released.
    pub verified: bool,
    /// One sentence: against what they were checked, or that they were not.
    pub provenance: String,
    /// The server's startup lines (what was loaded, how it is planned).
    pub details: Vec<String>,
    /// Whether `GET /api/memory` answers (the memory dial).
    pub dial: bool,
    /// Whether `GET /api/instruments` answers.
    pub instruments: bool,
    /// The largest `max_tokens` a request may give.
    pub max_tokens: usize,
    /// Tokens one request may hold, prompt and reply together; `None` where a long prompt is
    /// cut to fit instead (dormouse keeps its last bytes).
    pub context: Option<usize>,
    pub max_concurrent: usize,
}

/// How the page talks to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatMode {
    /// A conversation through `/v1/chat/completions` and the model's chat template.
    Chat,
    /// A model with no chat template: each turn is a prompt to `/v1/completions`.
    Completion,
}

/// The routes of the page's files: `/`, `/page/app.js`, `/page/style.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/page/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/page/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (
                HeaderName::from_static("content-security-policy"),
                CONTENT_SECURITY_POLICY,
            ),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
            // The files change with the binary: a browser must not keep an old page for a new
            // server.
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
