//! Which requests a server answers, against a real server on 127.0.0.1: a DNS-rebinding page's
//! Host, another site's Origin, a body that is not JSON, and a missing or wrong API key are
//! refused before the handler runs; what the operator allowed is answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use axum::routing::{get, post};
use http_serve::{Access, Limits};

/// A server with a page, /health, a GET and a POST route, in a thread of its own.
fn start(access: Access) -> SocketAddr {
    let (sent, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = http_serve::bind("127.0.0.1", 0).await.unwrap();
            sent.send(listener.local_addr().unwrap()).unwrap();
            let app = http_serve::page::routes()
                .route("/health", get(|| async { "ok" }))
                .route("/api/about", get(|| async { "about" }))
                .route("/v1/completions", post(|body: String| async move { body }));
            let limits = Limits {
                header_timeout: Duration::from_secs(5),
                body_timeout: Duration::from_secs(5),
                grace: Duration::from_secs(1),
                max_body: 1 << 16,
                refuse: http_serve::api_error::body_refused,
            };
            http_serve::serve(listener, app, (limits, access), std::future::pending()).await;
        });
    });
    address.recv().unwrap()
}

/// The status line's code, the headers (lowercase names) and the body of one request.
fn ask(address: SocketAddr, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, head.to_ascii_lowercase(), body.to_string())
}

fn get_with(address: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    ask(
        address,
        &format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n"),
    )
}

fn post_with(address: SocketAddr, headers: &str, body: &str) -> (u16, String, String) {
    ask(
        address,
        &format!(
            "POST /v1/completions HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn a_host_that_is_not_an_address_localhost_or_allowed_is_refused() {
    let server = start(Access {
        allowed_hosts: vec!["models.lan".into()],
        ..Access::default()
    });
    let port = server.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".to_string(),
        "models.lan:8080".to_string(),
        "MODELS.LAN".to_string(),
    ] {
        let (code, _, body) = get_with(server, "/api/about", &format!("Host: {host}\r\n"));
        assert_eq!((code, body.as_str()), (200, "about"), "{host}");
    }
    for host in [
        "rebound.example",
        "rebound.example:80",
        "127.0.0.1.rebound.example",
    ] {
        let (code, _, body) = get_with(server, "/api/about", &format!("Host: {host}\r\n"));
        assert_eq!(code, 403, "{host}: {body}");
        assert!(
            body.contains("host_not_allowed") && body.contains("--allow-host"),
            "{body}"
        );
    }
}

#[test]
fn a_page_of_another_origin_is_refused_unless_allowed() {
    let server = start(Access {
        allowed_origins: vec!["http://chat.lan:3000".into()],
        ..Access::default()
    });
    let host = format!("Host: 127.0.0.1:{}\r\n", server.port());
    let json = "Content-Type: application/json\r\n";
    // The server's own page, and clients that are no page (no Origin), are answered.
    let own = format!("{host}{json}Origin: http://127.0.0.1:{}\r\n", server.port());
    assert_eq!(post_with(server, &own, "{}").0, 200);
    assert_eq!(post_with(server, &format!("{host}{json}"), "{}").0, 200);
    // Another site's page is refused, and its request never reaches the handler.
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let headers = format!("{host}{json}Origin: {origin}\r\n");
        let (code, _, body) = post_with(server, &headers, "{}");
        assert_eq!(code, 403, "{origin}: {body}");
        assert!(body.contains("--allow-origin"), "{body}");
    }
    // An allowed site gets its preflight and CORS headers on the answer.
    let allowed = format!("{host}Origin: http://chat.lan:3000\r\n");
    let (code, head, _) = ask(
        server,
        &format!(
            "OPTIONS /v1/completions HTTP/1.1\r\n{allowed}Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(code, 204);
    assert!(
        head.contains("access-control-allow-origin: http://chat.lan:3000"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{head}"
    );
    let (code, head, body) = post_with(server, &format!("{allowed}{json}"), "{\"a\":1}");
    assert_eq!((code, body.as_str()), (200, "{\"a\":1}"));
    assert!(
        head.contains("access-control-allow-origin: http://chat.lan:3000"),
        "{head}"
    );
}

#[test]
fn a_post_that_is_not_json_is_refused() {
    let server = start(Access::default());
    let host = format!("Host: 127.0.0.1:{}\r\n", server.port());
    for content_type in [
        "",
        "Content-Type: text/plain\r\n",
        "Content-Type: application/x-www-form-urlencoded\r\n",
    ] {
        let (code, _, body) = post_with(server, &format!("{host}{content_type}"), "{}");
        assert_eq!(code, 415, "{content_type:?}: {body}");
        assert!(body.contains("application/json"), "{body}");
    }
    let (code, _, _) = post_with(
        server,
        &format!("{host}Content-Type: Application/JSON; charset=utf-8\r\n"),
        "{}",
    );
    assert_eq!(code, 200);
}

#[test]
fn with_a_key_only_the_page_and_health_answer_without_it() {
    let server = start(Access {
        api_key: Some("s3cret-key".into()),
        ..Access::default()
    });
    let host = format!("Host: 127.0.0.1:{}\r\n", server.port());
    for path in ["/", "/page/app.js", "/page/style.css", "/health"] {
        assert_eq!(get_with(server, path, &host).0, 200, "{path}");
    }
    for auth in [
        "",
        "Authorization: Bearer wrong-key\r\n",
        "Authorization: s3cret-key\r\n",
        "Authorization: Bearer s3cret-ke\r\n",
    ] {
        let (code, head, body) = get_with(server, "/api/about", &format!("{host}{auth}"));
        assert_eq!(code, 401, "{auth:?}: {body}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(body.contains("invalid_api_key"), "{body}");
        let headers = format!("{host}{auth}Content-Type: application/json\r\n");
        assert_eq!(post_with(server, &headers, "{}").0, 401, "{auth:?}");
    }
    let auth = format!("{host}Authorization: Bearer s3cret-key\r\n");
    assert_eq!(get_with(server, "/api/about", &auth).2, "about");
    let headers = format!("{auth}Content-Type: application/json\r\n");
    assert_eq!(post_with(server, &headers, "{}").0, 200);
}
