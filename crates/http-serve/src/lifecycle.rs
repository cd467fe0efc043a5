//! What a generating handler needs around its work: knowing when its client has gone (axum
//! drops a handler's future when the connection closes), and a shutdown on SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Sets its flag when dropped: held by a handler, it tells the generating thread the client
/// went away.
pub struct SetOnDrop(pub Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Completes on SIGTERM or Ctrl-C, saying so on stderr (`program: shutting down ...`).
pub async fn shutdown_signal(program: &'static str) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        () = terminate => {},
    }
    eprintln!("{program}: shutting down (finishing requests in flight)");
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The sampling seed of the `number`th request that gives none: the clock mixed with the
/// request counter, so two requests in one second still differ.
pub fn request_seed(number: u64) -> u64 {
    unix_now() ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A command-line number of seconds in (0, 86400].
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() && s <= 86_400.0 => Ok(s),
        _ => Err(format!("{text:?} is not a number of seconds in (0, 86400]")),
    }
}
