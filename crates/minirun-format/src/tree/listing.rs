//! A pinned revision's file tree as the Hub API lists it, with each file's published digest.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::digest::{FileDigest, parse_hex};
use super::repo_path::{UnsafePath, check_repo_path};

/// One file of a pinned revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: u64,
    pub digest: FileDigest,
}

/// Every file of a repository at a pinned revision, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub repo: String,
    pub revision: String,
    pub files: BTreeMap<String, RepoFile>,
}

impl Tree {
    /// The sum of the file sizes ([`TreeBuilder`] refuses a tree whose sum overflows).
    pub fn total_bytes(&self) -> u64 {
        self.files
            .values()
            .fold(0, |sum, f| sum.saturating_add(f.size))
    }
}

/// Why a tree page or the tree as a whole was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("a tree page is not a JSON array of entries: {0}")]
    NotAPage(String),
    #[error("tree entry {index} ({path}): {reason}")]
    BadEntry {
        index: usize,
        path: String,
        reason: String,
    },
    #[error(transparent)]
    UnsafePath(#[from] UnsafePath),
    #[error("the tree lists {0:?} twice")]
    Duplicate(String),
    #[error(
        "the tree lists more than {0} entries, far more than any model repository holds; this build refuses it rather than keep accumulating pages"
    )]
    TooManyEntries(usize),
    #[error(
        "the tree's paths add up to more than {0} bytes, far more than any model repository's; this build refuses it rather than keep accumulating pages"
    )]
    TooManyPathBytes(usize),
    #[error(
        "the tree is incomplete or padded: the revision lists {missing} file(s) the tree lacks (e.g. {example_missing:?}) and the tree has {extra} it does not list (e.g. {example_extra:?})"
    )]
    Incomplete {
        missing: usize,
        extra: usize,
        example_missing: Option<String>,
        example_extra: Option<String>,
    },
}

/// The most entries (files and folders) a tree may list over all its pages. The largest
/// published artifacts hold a few tens of thousands of files (the Hub advises at most 100,000
/// per repository); each entry kept costs a few hundred bytes besides its path.
pub const MAX_TREE_ENTRIES: usize = 1 << 18;
/// The most path bytes a tree may list over all its entries. A path may be 4,096 bytes and is
/// kept up to three times (the set that refuses repeats, the file map's key and the file), so
/// without this the entry limit alone would let a listing hold gigabytes.
pub const MAX_TREE_PATH_BYTES: usize = 32 << 20;

/// Collects tree pages into a [`Tree`], refusing unsafe or duplicate paths, entries without a
/// usable digest, and more than [`MAX_TREE_ENTRIES`] entries.
#[derive(Debug)]
pub struct TreeBuilder {
    files: BTreeMap<String, RepoFile>,
    seen: BTreeSet<String>,
    entries: usize,
    path_bytes: usize,
    total: u64,
    max_entries: usize,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        TreeBuilder::with_entry_limit(MAX_TREE_ENTRIES)
    }
}

/// Folders minirun keeps inside an artifact (partial downloads, evidence); a publication that
/// places files there is refused.
const RESERVED: [&str; 2] = [".minirun-partial", ".minirun"];

impl TreeBuilder {
    /// A builder that refuses more than `max_entries` entries over all pages.
    pub fn with_entry_limit(max_entries: usize) -> Self {
        TreeBuilder {
            files: BTreeMap::new(),
            seen: BTreeSet::new(),
            entries: 0,
            path_bytes: 0,
            total: 0,
            max_entries,
        }
    }

    /// Adds one page (the JSON array the tree endpoint returns).
    pub fn add_page(&mut self, page: &[u8]) -> Result<(), TreeError> {
        let value: Value =
            serde_json::from_slice(page).map_err(|e| TreeError::NotAPage(e.to_string()))?;
        let Value::Array(entries) = value else {
            return Err(TreeError::NotAPage("the top level is not an array".into()));
        };
        if self.entries.saturating_add(entries.len()) > self.max_entries {
            return Err(TreeError::TooManyEntries(self.max_entries));
        }
        for entry in &entries {
            let index = self.entries;
            self.entries += 1;
            self.add_entry(index, entry)?;
        }
        Ok(())
    }

    fn add_entry(&mut self, index: usize, entry: &Value) -> Result<(), TreeError> {
        let path =
            entry
                .get("path")
                .and_then(Value::as_str)
                .ok_or_else(|| TreeError::BadEntry {
                    index,
                    path: "?".into(),
                    reason: "no path".into(),
                })?;
        check_repo_path(path)?;
        self.path_bytes += path.len();
        if self.path_bytes > MAX_TREE_PATH_BYTES {
            return Err(TreeError::TooManyPathBytes(MAX_TREE_PATH_BYTES));
        }
        let first = path.split('/').next().unwrap_or_default();
        if RESERVED.contains(&first) {
            return Err(TreeError::BadEntry {
                index,
                path: path.to_string(),
                reason: format!("{first}/ is a folder minirun keeps for itself"),
            });
        }
        if !self.seen.insert(path.to_string()) {
            return Err(TreeError::Duplicate(path.to_string()));
        }
        if entry.get("type").and_then(Value::as_str) != Some("file") {
            return Ok(());
        }
        let file = parse_file(entry, path).map_err(|reason| TreeError::BadEntry {
            index,
            path: path.to_string(),
            reason,
        })?;
        self.total = self
            .total
            .checked_add(file.size)
            .ok_or_else(|| TreeError::BadEntry {
                index,
                path: path.to_string(),
                reason: "the sizes of the tree overflow 64 bits".into(),
            })?;
        self.files.insert(path.to_string(), file);
        Ok(())
    }

    pub fn finish(self, repo: &str, revision: &str) -> Tree {
        Tree {
            repo: repo.to_string(),
            revision: revision.to_string(),
            files: self.files,
        }
    }
}

/// LFS files are digested by `lfs.oid` (SHA-256 of the content); the entry's own `oid` is
/// then the git blob of the *pointer* and says nothing about the content. Plain files are
/// digested by `oid`, a git-blob SHA-1.
fn parse_file(entry: &Value, path: &str) -> Result<RepoFile, String> {
    let size = entry.get("size").and_then(Value::as_u64);
    match entry.get("lfs") {
        Some(lfs) if !lfs.is_null() => {
            let oid = lfs
                .get("oid")
                .and_then(Value::as_str)
                .ok_or("an LFS entry without lfs.oid")?;
            let digest = parse_hex::<32>(oid)
                .map(FileDigest::Sha256)
                .ok_or("lfs.oid is not 64 hex digits")?;
            let lfs_size = lfs.get("size").and_then(Value::as_u64);
            let size = match (lfs_size, size) {
                (Some(a), Some(b)) if a != b => {
                    return Err(format!("lfs.size {a} and size {b} disagree"));
                }
                (Some(a), _) => a,
                (None, Some(b)) => b,
                (None, None) => return Err("no size".into()),
            };
            Ok(RepoFile {
                path: path.to_string(),
                size,
                digest,
            })
        }
        _ => {
            let oid = entry
                .get("oid")
                .and_then(Value::as_str)
                .ok_or("neither lfs.oid nor oid")?;
            let digest = parse_hex::<20>(oid)
                .map(FileDigest::GitBlobSha1)
                .ok_or("oid is not 40 hex digits")?;
            Ok(RepoFile {
                path: path.to_string(),
                size: size.ok_or("no size")?,
                digest,
            })
        }
    }
}

/// Checks the tree's paths against the revision's sibling list, both ways.
pub fn check_complete(tree: &Tree, siblings: &BTreeSet<String>) -> Result<(), TreeError> {
    let listed: BTreeSet<&String> = tree.files.keys().collect();
    let missing: Vec<&String> = siblings.iter().filter(|s| !listed.contains(s)).collect();
    let extra: Vec<&&String> = listed.iter().filter(|p| !siblings.contains(**p)).collect();
    if missing.is_empty() && extra.is_empty() {
        return Ok(());
    }
    Err(TreeError::Incomplete {
        missing: missing.len(),
        extra: extra.len(),
        example_missing: missing.first().map(|s| s.to_string()),
        example_extra: extra.first().map(|s| s.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(entries: &str) -> Vec<u8> {
        format!("[{entries}]").into_bytes()
    }

    const LFS: &str = r#"{"type":"file","oid":"9f29622b3111fd35fb24420bc7bd176b39902d5f","size":2348810240,"lfs":{"oid":"4a79cdabdab6826b994aff69d90a72aa35dae32e90f8acaf1ce312c7bdc4a487","size":2348810240,"pointerSize":135},"path":"global/embed_tokens.bin"}"#;
    const PLAIN: &str = r#"{"type":"file","oid":"9238e45903a3d0f2c30d9b6296165a92219a48ed","size":19459,"path":".gitattributes"}"#;

    #[test]
    fn pages_stop_accumulating_at_the_entry_limit() {
        assert_eq!(TreeBuilder::default().max_entries, MAX_TREE_ENTRIES);
        let dir = |i: usize| format!(r#"{{"type":"directory","oid":"","size":0,"path":"d{i}"}}"#);
        let mut b = TreeBuilder::with_entry_limit(3);
        b.add_page(&page(&format!("{},{}", dir(0), dir(1))))
            .unwrap();
        b.add_page(&page(&dir(2))).unwrap();
        let err = b.add_page(&page(&dir(3))).unwrap_err();
        assert!(matches!(err, TreeError::TooManyEntries(3)), "{err}");
        assert!(err.to_string().contains("more than 3 entries"), "{err}");
    }

    #[test]
    fn pages_stop_accumulating_at_the_path_byte_limit() {
        let long = |i: usize| format!("{i:0>4096}");
        let dir = |i: usize| format!(r#"{{"type":"directory","path":"{}"}}"#, long(i));
        let per_page = 1024;
        let pages_within = MAX_TREE_PATH_BYTES / (per_page * 4096);
        let mut b = TreeBuilder::default();
        for p in 0..pages_within {
            let entries: Vec<String> = (0..per_page).map(|i| dir(p * per_page + i)).collect();
            b.add_page(&page(&entries.join(","))).unwrap();
        }
        let err = b.add_page(&page(&dir(usize::MAX))).unwrap_err();
        assert!(matches!(err, TreeError::TooManyPathBytes(_)), "{err}");
    }

    #[test]
    fn lfs_entries_use_the_content_sha256_never_the_pointer_oid() {
        let mut b = TreeBuilder::default();
        b.add_page(&page(&format!(
            r#"{{"type":"directory","oid":"aaa6e8279b4c1b65920db17322820e234d86d1a6","size":0,"path":"global"}},{LFS},{PLAIN}"#
        )))
        .unwrap();
        let tree = b.finish("o/r", &"a".repeat(40));
        assert_eq!(tree.files.len(), 2, "directories are dropped");
        let lfs = &tree.files["global/embed_tokens.bin"];
        assert_eq!(lfs.digest.algorithm(), "sha256");
        assert!(lfs.digest.hex().starts_with("4a79cdab"));
        assert_eq!(lfs.size, 2_348_810_240);
        let plain = &tree.files[".gitattributes"];
        assert_eq!(plain.digest.algorithm(), "git-blob-sha1");
        assert_eq!(tree.total_bytes(), 2_348_810_240 + 19_459);
    }

    /// A listing may write `"lfs": null` for a file kept in git itself: it is a plain file.
    #[test]
    fn an_lfs_field_of_null_is_a_plain_file() {
        let mut b = TreeBuilder::default();
        b.add_page(&page(&PLAIN.replace(r#""size""#, r#""lfs":null,"size""#)))
            .unwrap();
        let tree = b.finish("o/r", &"a".repeat(40));
        let plain = &tree.files[".gitattributes"];
        assert_eq!(plain.digest.algorithm(), "git-blob-sha1");
        assert!(plain.digest.hex().starts_with("9238e459"));
    }

    #[test]
    fn bad_entries_are_refused() {
        let refuse = |entries: &str| {
            let mut b = TreeBuilder::default();
            b.add_page(&page(entries)).unwrap_err()
        };
        assert!(matches!(
            refuse(&format!("{PLAIN},{PLAIN}")),
            TreeError::Duplicate(_)
        ));
        assert!(matches!(
            refuse(&PLAIN.replace(".gitattributes", "../evil")),
            TreeError::UnsafePath(_)
        ));
        assert!(matches!(
            refuse(&LFS.replace(
                r#""size":2348810240,"pointerSize""#,
                r#""size":1,"pointerSize""#
            )),
            TreeError::BadEntry { .. }
        ));
        assert!(matches!(
            refuse(&PLAIN.replace(".gitattributes", ".minirun/evidence.json")),
            TreeError::BadEntry { .. }
        ));
        let huge = LFS.replace("2348810240", "18446744073709551615");
        assert!(matches!(
            refuse(&format!(
                "{huge},{}",
                huge.replace("global/embed", "global/other")
            )),
            TreeError::BadEntry { .. }
        ));
        assert!(matches!(
            refuse(r#"{"type":"file","size":3,"path":"x"}"#),
            TreeError::BadEntry { .. }
        ));
        assert!(matches!(
            refuse(&PLAIN.replace("9238e459", "9238e4")),
            TreeError::BadEntry { .. }
        ));
        let mut b = TreeBuilder::default();
        assert!(matches!(b.add_page(b"{}"), Err(TreeError::NotAPage(_))));
    }

    #[test]
    fn completeness_is_checked_both_ways() {
        let mut b = TreeBuilder::default();
        b.add_page(&page(PLAIN)).unwrap();
        let tree = b.finish("o/r", &"a".repeat(40));
        let same: BTreeSet<String> = [".gitattributes".to_string()].into();
        assert!(check_complete(&tree, &same).is_ok());
        let more: BTreeSet<String> = [".gitattributes".to_string(), "x".to_string()].into();
        assert!(matches!(
            check_complete(&tree, &more),
            Err(TreeError::Incomplete {
                missing: 1,
                extra: 0,
                ..
            })
        ));
    }
}
