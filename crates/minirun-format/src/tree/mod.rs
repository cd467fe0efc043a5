//! A publication's file tree: every file of a repository at a pinned revision with the digest
//! its publisher released (SHA-256 for LFS files, git-blob SHA-1 for files kept in git, never
//! one passed off as the other), the Hub tree listing those come from, and the rule for paths
//! that are safe to join under a local root. Verification and downloads both read these; no
//! HTTP here.

mod digest;
mod listing;
mod repo_path;

pub use digest::{FileDigest, StreamHasher};
pub use listing::{RepoFile, Tree, TreeBuilder, TreeError, check_complete};
pub use repo_path::{UnsafePath, check_repo_path};
