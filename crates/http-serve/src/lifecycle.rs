//! What a generating server needs around its work: the `created` clock and request seeds, and
//! the flags that say where it listens and how long it waits on clients ([`ListenArgs`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::api_error::body_refused;
use crate::server::Limits;

/// Where a server listens and how long it waits on its clients: the flags every `serve`
/// command takes (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct ListenArgs {
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Seconds a client has to send its request line and headers; a connection still sending
    /// them after that is closed (a client holding connections open half-sent is cut off).
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    pub header_timeout: f64,
    /// Seconds a client has to send its request body; after that the request gets 408.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub body_timeout: f64,
    /// Seconds requests in flight may take to finish after SIGTERM or Ctrl-C; then the server
    /// exits anyway (status 0; it says how many connections it cut off).
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub shutdown_grace: f64,
}

impl ListenArgs {
    /// The listener's limits for these flags, with bodies above `max_body` bytes refused.
    pub fn limits(&self, max_body: usize) -> Limits {
        Limits {
            header_timeout: Duration::from_secs_f64(self.header_timeout),
            body_timeout: Duration::from_secs_f64(self.body_timeout),
            grace: Duration::from_secs_f64(self.shutdown_grace),
            max_body,
            refuse: body_refused,
        }
    }
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
