//! Everything the Hub client refuses, one variant per broken promise.

use std::path::PathBuf;

use minirun_format::tree::TreeError;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{endpoint:?} is not an http(s) endpoint URL: {reason}")]
    BadEndpoint { endpoint: String, reason: String },
    #[error("{0:?} is not a repository id of the form owner/name")]
    BadRepoId(String),
    #[error(
        "{0:?} is not a pinned revision: give the 40-hex-digit commit SHA (a branch or tag can move under you)"
    )]
    NotPinned(String),
    #[error("{url}: not found (404)")]
    NotFound { url: String },
    #[error("{url}: HTTP {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url}: {error}")]
    Transport { url: String, error: String },
    #[error(
        "{from} redirected to {to}, another origin: refused (API answers must come from the endpoint)"
    )]
    RedirectOffOrigin { from: String, to: String },
    #[error("{from}: too many redirects")]
    TooManyRedirects { from: String },
    #[error("pagination of {first} pointed to {next}: {reason}; refused")]
    BadPagination {
        first: String,
        next: String,
        reason: &'static str,
    },
    #[error("{url}: the answer is not what the Hub API returns: {reason}")]
    BadAnswer { url: String, reason: String },
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("the revision endpoint answered for commit {found}, not the pinned {expected}")]
    RevisionMismatch { expected: String, found: String },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{path}: the server says it served commit {found:?}, not the pinned {expected} (X-Repo-Commit)"
    )]
    CommitMismatch {
        path: String,
        expected: String,
        found: Option<String>,
    },
    #[error(
        "{path}: downloaded {got} bytes, the tree says {expected}; the partial file was deleted"
    )]
    WrongSize {
        path: String,
        expected: u64,
        got: u64,
    },
    #[error(
        "{path}: the content hashes to {got}, the tree says {expected}; the partial file was deleted"
    )]
    WrongDigest {
        path: String,
        expected: String,
        got: String,
    },
    #[error("the catalog lists {id} twice with different commits ({a} and {b})")]
    CatalogConflict { id: String, a: String, b: String },
}
