//! minirun's Hugging Face Hub client: the file tree of a pinned revision with each file's
//! published digest (SHA-256 for LFS files, git-blob SHA-1 for files kept in git, never one
//! passed off as the other), the catalog of an account's `-minirun` artifacts, and downloads
//! that resume, hash while they write, and place each file only once its size and digest match.
//!
//! Blocking HTTP (ureq with rustls). API answers are accepted from the endpoint's origin only:
//! redirects and pagination links to another origin are refused. File content may come from a
//! CDN after a redirect (the Hub serves LFS files that way); the token is never sent there, and
//! the content is trusted only after its digest matches the tree's.
//!
//! [`upstream`] takes from a publication's named upstream the root files it lacks and a run
//! needs (its `config.json`, its tokenizer), verified against the upstream's tree.

mod client;
mod download;
mod error;
pub mod upstream;

pub use client::{CatalogEntry, Hub};
pub use download::{DownloadOptions, DownloadReport};
pub use error::HubError;
// The tree types belong to the artifact layout (minirun-format), which readers that make no
// HTTP requests use too; they are re-exported here because every Hub answer is one.
pub use minirun_format::tree::{
    FileDigest, RepoFile, StreamHasher, Tree, TreeBuilder, TreeError, UnsafePath, check_complete,
    check_repo_path,
};
