//! What a generating server needs around its work: the `created` clock and request seeds, and
//! the flags that say where it listens and how long it waits on clients ([`ListenArgs`]).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::access::Access;
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
    /// A host name requests may name in their Host header besides IP addresses and localhost
    /// (the name a reverse proxy or the local network gives this machine); repeatable. Requests
    /// for any other name are refused, so that a web page that points its own name at this
    /// address (DNS rebinding) cannot read the server.
    #[arg(long = "allow-host", value_name = "NAME", value_parser = host_name_arg)]
    pub allow_host: Vec<String>,
    /// An origin whose web pages may call this server from a browser, as `http://host:port`;
    /// repeatable. Browser requests from pages of other sites are refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN", value_parser = origin_arg)]
    pub allow_origin: Vec<String>,
    /// Require this key on every request but the page and /health, as `Authorization: Bearer
    /// KEY` (what OpenAI clients send; the page asks for it once). Other users of this machine
    /// can see a command line: --api-key-file keeps the key out of it.
    #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the key --api-key would give from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
}

/// An API key file that gives no key.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("cannot read the API key file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the API key file {path} holds no key on its first line")]
    Empty { path: String },
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

    /// Who may talk to the server these flags start: the allowed hosts and origins, and the key
    /// (read from --api-key-file where it is given there).
    pub fn access(&self) -> Result<Access, ApiKeyError> {
        let api_key = match (&self.api_key, &self.api_key_file) {
            (Some(key), _) => Some(key.clone()),
            (None, Some(path)) => Some(read_key(path)?),
            (None, None) => None,
        };
        Ok(Access {
            allowed_hosts: self.allow_host.clone(),
            allowed_origins: self.allow_origin.clone(),
            api_key,
        })
    }
}

/// The most bytes an API key file is read for: a key is a line, not a file of any size.
const KEY_FILE_LIMIT: u64 = 4096;

fn read_key(path: &std::path::Path) -> Result<String, ApiKeyError> {
    let shown = path.display().to_string();
    let read = |source| ApiKeyError::Read {
        path: shown.clone(),
        source,
    };
    let file = regular_file::open(path).map_err(read)?;
    let bytes = regular_file::read_at_most(file, KEY_FILE_LIMIT)
        .map_err(read)?
        .ok_or_else(|| {
            read(std::io::Error::other(format!(
                "it holds more than {KEY_FILE_LIMIT} bytes"
            )))
        })?;
    let text = String::from_utf8_lossy(&bytes);
    match text.lines().next().map(str::trim) {
        Some(key) if !key.is_empty() => Ok(key.to_string()),
        _ => Err(ApiKeyError::Empty { path: shown }),
    }
}

/// A host name for --allow-host, lowercase: letters, digits, dots and hyphens.
fn host_name_arg(text: &str) -> Result<String, String> {
    let name = text.to_ascii_lowercase();
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    match valid {
        true => Ok(name),
        false => Err(format!(
            "{text:?} is not a host name (letters, digits, dots and hyphens, no port)"
        )),
    }
}

/// An origin for --allow-origin, as browsers send it: `http://` or `https://`, a host, maybe a
/// port, no path; lowercase.
fn origin_arg(text: &str) -> Result<String, String> {
    let origin = text.to_ascii_lowercase();
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let valid = rest.is_some_and(|r| {
        !r.is_empty()
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    });
    match valid {
        true => Ok(origin),
        false => Err(format!(
            "{text:?} is not an origin: give it as a browser sends it, http://HOST[:PORT] or https://HOST[:PORT], without a path"
        )),
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
