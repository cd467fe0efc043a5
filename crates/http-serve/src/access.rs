//! Which requests a server answers at all, checked before a body is read or a handler runs. A
//! server on 127.0.0.1 is still reachable from every web page its user opens, so:
//!
//! - the `Host` header must be an IP address, `localhost`, or a name the operator allowed
//!   (`--allow-host`): a page on another site that re-points its own name at this address (DNS
//!   rebinding) names itself in `Host`, and is refused before it can read anything;
//! - a browser request from a page of another origin (its `Origin` header) is refused unless the
//!   operator allowed that origin (`--allow-origin`), which then gets CORS headers and preflights;
//! - a `POST` must say `Content-Type: application/json`: a page may send `text/plain` to any
//!   address without a preflight, never `application/json`;
//! - with a key (`--api-key`), every request but the page's own files and `/health` must carry it
//!   as `Authorization: Bearer KEY`, as OpenAI's clients send it.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_METHOD, AUTHORIZATION, CONTENT_TYPE, HOST,
    ORIGIN, VARY, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::ApiError;

/// Who may talk to a server. The default answers same-origin requests naming an IP address or
/// `localhost`, with no key.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Host names, besides IP addresses and `localhost`, that requests may name (lowercase).
    pub allowed_hosts: Vec<String>,
    /// Origins of other sites whose pages may call the server (`scheme://host[:port]`, lowercase).
    pub allowed_origins: Vec<String>,
    /// The key every request but the page's files and `/health` must carry as a bearer token.
    pub api_key: Option<String>,
}

/// Paths anyone who reaches the server may get without a key: the page (which then asks its user
/// for the key) and the health check.
const OPEN_PATHS: [&str; 4] = ["/", "/page/app.js", "/page/style.css", "/health"];

impl Access {
    /// Whether a `Host` header's host (lowercase, without its port) may be served.
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        host == "localhost" || is_ip_literal(host) || self.allowed_hosts.iter().any(|h| h == host)
    }

    fn key_matches(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        bool::from(given.as_bytes().ct_eq(key.as_bytes()))
    }
}

/// The middleware: refuses what [`Access`] does not allow, answers allowed preflights, and marks
/// an allowed cross-origin answer with its CORS headers.
pub async fn check(access: Arc<Access>, req: Request, next: Next) -> Response {
    let host_header = match req.headers().get(HOST).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(value)) => Some(value.to_ascii_lowercase()),
        Some(Err(_)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "bad_host",
                "the Host header is not text".into(),
            );
        }
    };
    if let Some(host) = &host_header
        && !access.host_allowed(host_name(host))
    {
        return refuse(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            format!(
                "this server does not answer requests for the host {host:?}: name it by an IP address or localhost, or start the server with --allow-host {} (a page that points its own name at this address must not read it)",
                host_name(host)
            ),
        );
    }
    let cross_origin = match req.headers().get(ORIGIN) {
        None => None,
        Some(origin) => {
            let origin = origin.to_str().unwrap_or("").to_ascii_lowercase();
            match same_origin(&origin, host_header.as_deref()) {
                true => None,
                false if access.allowed_origins.contains(&origin) => Some(origin),
                false => {
                    return refuse(
                        StatusCode::FORBIDDEN,
                        "origin_not_allowed",
                        format!(
                            "requests from pages of {origin:?} are refused: allow that site with --allow-origin {origin}"
                        ),
                    );
                }
            }
        }
    };
    if let Some(origin) = &cross_origin
        && req.method() == Method::OPTIONS
        && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD)
    {
        return preflight(origin);
    }
    if let Some(refusal) = refuse_unauthorized(&access, &req).or_else(|| refuse_not_json(&req)) {
        return refusal;
    }
    let mut response = next.run(req).await;
    if let Some(origin) = cross_origin {
        allow_origin(response.headers_mut(), &origin);
    }
    response
}

fn refuse_unauthorized(access: &Access, req: &Request) -> Option<Response> {
    let open = matches!(*req.method(), Method::GET | Method::HEAD)
        && OPEN_PATHS.contains(&req.uri().path());
    if open || access.key_matches(req.headers()) {
        return None;
    }
    let mut response = refuse(
        StatusCode::UNAUTHORIZED,
        "invalid_api_key",
        "this server needs its API key: send it as the header Authorization: Bearer KEY (OpenAI clients: api_key=KEY)".into(),
    );
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(response)
}

fn refuse_not_json(req: &Request) -> Option<Response> {
    if req.method() != Method::POST {
        return None;
    }
    let media_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    match media_type {
        Some(t) if t.eq_ignore_ascii_case("application/json") => None,
        _ => Some(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_content_type",
            "send the request body as JSON with the header Content-Type: application/json".into(),
        )),
    }
}

fn refuse(status: StatusCode, code: &'static str, message: String) -> Response {
    ApiError::body(status, code, message).into_response()
}

/// The host of a `Host` header's value, without its port (`[::1]:8000` gives `[::1]`).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn is_ip_literal(host: &str) -> bool {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok(),
        None => host.parse::<IpAddr>().is_ok(),
    }
}

/// Whether `origin` is the origin of a page this server sent under the name `host`.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest == Some(host)
}

fn preflight(origin: &str) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    allow_origin(headers, origin);
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST"),
    );
    headers.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type"),
    );
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}

fn allow_origin(headers: &mut HeaderMap, origin: &str) {
    if let Ok(value) = HeaderValue::from_str(origin) {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    headers.insert(VARY, HeaderValue::from_static("Origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_header_loses_its_port() {
        assert_eq!(host_name("127.0.0.1:8000"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8000"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("evil.example:80"), "evil.example");
    }

    #[test]
    fn only_addresses_localhost_and_allowed_names_are_hosts() {
        let access = Access {
            allowed_hosts: vec!["models.lan".into()],
            ..Access::default()
        };
        for host in [
            "127.0.0.1",
            "10.0.0.7",
            "[::1]",
            "localhost",
            "localhost.",
            "models.lan",
        ] {
            assert!(access.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example",
            "127.0.0.1.nip.io",
            "[evil]",
            "localhost.evil.example",
            "",
        ] {
            assert!(!access.host_allowed(host), "{host}");
        }
    }

    #[test]
    fn same_origin_is_the_page_this_host_sent() {
        assert!(same_origin("http://127.0.0.1:8000", Some("127.0.0.1:8000")));
        assert!(same_origin("https://models.lan", Some("models.lan")));
        assert!(!same_origin(
            "http://127.0.0.1:8001",
            Some("127.0.0.1:8000")
        ));
        assert!(!same_origin("null", Some("127.0.0.1:8000")));
        assert!(!same_origin("http://127.0.0.1:8000", None));
    }
}
