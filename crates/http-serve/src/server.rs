//! Serving a router over HTTP/1.1 with the limits a server facing untrusted clients needs:
//! a client has `header_timeout` to send its request line and headers and `body_timeout` to
//! send its body (a client trickling bytes, or sending half a request and waiting, is cut off
//! instead of holding a connection and a file descriptor forever), and a shutdown lets requests
//! in flight finish for at most `grace` before the process exits anyway.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;

use crate::access::Access;

/// How long clients may take, and how long a shutdown waits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub grace: Duration,
    /// Bytes a request body may have.
    pub max_body: usize,
    /// The server's own error response for a body refused here (status, message), so that
    /// clients see one error shape.
    pub refuse: fn(StatusCode, String) -> Response,
}

/// Serves `app` on `listener` to the requests `access` allows until `shutdown` completes, then
/// waits for the connections in flight for at most `limits.grace`. Returns how many connections
/// were still open when the grace ran out (0 after a clean shutdown).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    (limits, access): (Limits, Access),
    shutdown: impl Future<Output = ()>,
) -> usize {
    let access = Arc::new(access);
    // The last layer runs first: who may ask is checked before a body is read.
    let app = app
        .layer(axum::middleware::from_fn(move |req, next| {
            read_body_within(req, next, limits)
        }))
        .layer(axum::middleware::from_fn(move |req, next| {
            crate::access::check(access.clone(), req, next)
        }));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors, a connection reset before accept: the listener
                    // is fine, so keep serving (after a pause, so as not to spin).
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout);
                let service = TowerToHyperService::new(app.clone());
                let connection = http.serve_connection(TokioIo::new(stream), service);
                let watched = graceful.watch(connection);
                tokio::spawn(async move {
                    // A client that timed out or went away ends only its own connection.
                    let _ = watched.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let open = graceful.count();
    match tokio::time::timeout(limits.grace, graceful.shutdown()).await {
        Ok(()) => 0,
        Err(_) => open,
    }
}

/// The address could not be listened on.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{host}:{port} is not an address to listen on (give an IP address as --host)")]
    Address { host: String, port: u16 },
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A listener on `host:port` (port 0: any free one; `local_addr` says which).
pub async fn bind(host: &str, port: u16) -> Result<TcpListener, BindError> {
    let address: std::net::SocketAddr =
        format!("{host}:{port}")
            .parse()
            .map_err(|_| BindError::Address {
                host: host.to_string(),
                port,
            })?;
    TcpListener::bind(address)
        .await
        .map_err(|source| BindError::Listen { address, source })
}

/// [`serve`] until SIGTERM or Ctrl-C, saying on stderr (as `program`) when it stopped and how
/// many connections the grace cut off.
pub async fn serve_until_signal(
    listener: TcpListener,
    app: Router,
    (limits, access): (Limits, Access),
    program: &'static str,
) {
    if let Ok(address) = listener.local_addr()
        && !address.ip().is_loopback()
        && access.api_key.is_none()
    {
        eprintln!(
            "{program}: warning: listening on {address}, beyond this machine, with no --api-key: anyone who can reach it can use the model"
        );
    }
    let shutdown = crate::signal::shutdown_signal(program);
    match serve(listener, app, (limits, access), shutdown).await {
        0 => eprintln!("{program}: stopped"),
        n => eprintln!(
            "{program}: stopped after the {} s grace; {n} connection(s) still open were cut off",
            limits.grace.as_secs_f64()
        ),
    }
}

/// Reads the whole request body within `body_timeout` (and `max_body`) before the handler
/// runs, so that a handler never waits on a client that stopped sending.
async fn read_body_within(req: Request, next: Next, limits: Limits) -> Response {
    let (parts, body) = req.into_parts();
    let read = read_limited(body, limits.max_body);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(BodyFault::TooLarge)) => (limits.refuse)(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Failed to buffer the request body: length limit exceeded (bodies are limited to {} bytes)",
                limits.max_body
            ),
        ),
        Ok(Err(BodyFault::Broken)) => (limits.refuse)(
            StatusCode::BAD_REQUEST,
            "the request body could not be read (the connection broke while sending it)".into(),
        ),
        Err(_) => (limits.refuse)(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                limits.body_timeout.as_secs_f64()
            ),
        ),
    }
}

enum BodyFault {
    TooLarge,
    Broken,
}

/// How much of an over-long body is read and dropped before the refusal goes out: a client
/// still writing its body when the connection closes sees a broken pipe instead of the 413.
const DRAIN_FACTOR: usize = 16;

/// The body, if it has at most `max` bytes. A longer one is read on (and dropped) up to
/// `DRAIN_FACTOR` times `max`, so that its sender can finish writing and read the refusal.
async fn read_limited(body: Body, max: usize) -> Result<Bytes, BodyFault> {
    let mut chunks = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    let drain_to = max.saturating_mul(DRAIN_FACTOR);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|_| BodyFault::Broken)?;
        seen = seen.saturating_add(chunk.len());
        if seen <= max {
            kept.extend_from_slice(&chunk);
        } else if seen > drain_to {
            break;
        }
    }
    match seen <= max {
        true => Ok(Bytes::from(kept)),
        false => Err(BodyFault::TooLarge),
    }
}
