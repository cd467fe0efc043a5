//! The root files a publication does not hold but a run needs, taken from the upstream
//! repository and pinned revision that the publication's own `index.json` names, and verified
//! against that upstream's tree: `config.json` (Kimi K3 and DeepSeek V4 publish none) and, when
//! the publication carries no tokenizer at all (DeepSeek V4's recorded revision), the upstream's
//! `tokenizer.json` and `tokenizer_config.json`.
//!
//! Nothing is defaulted: an index that names no single pinned upstream, or an upstream whose
//! tree lacks a file, leaves the artifact without it ([`Sourced::absent_upstream`]), and
//! `minirun run` refuses what it needs.

use std::path::Path;

use minirun_format::artifact::INDEX_FILE;
use minirun_format::identity::{is_canonical_repo_id, is_pinned_revision};
use minirun_format::index::ArtifactIndex;
use minirun_format::tree::{StreamHasher, Tree, TreeBuilder};
use minirun_store::{Origin, Root, SourcedFile};

use crate::{DownloadOptions, Hub, HubError};

const CONFIG: &str = "config.json";
/// A publication holding any of these has its tokenizer.
const TOKENIZERS: [&str; 3] = ["tokenizer.json", "tiktoken.model", "tokenizer.model"];
/// What is taken from the upstream for a publication without a tokenizer.
const UPSTREAM_TOKENIZER: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];
/// Far above any index.json (the K3 one is 577 bytes).
const MAX_INDEX_BYTES: u64 = 16 << 20;

/// Why the upstream's files could not be had.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("the publication holds its own config.json and tokenizer; --source-tree is not needed")]
    SourceTreeNotNeeded,
    #[error(
        "the publication's index.json names no single upstream repository at a pinned revision, so no upstream file can be verified"
    )]
    NoNamedUpstream,
    #[error("{dir}: cannot read index.json: {error}")]
    Index { dir: String, error: String },
    #[error(
        "{dir}: index.json is not the published one ({got} bytes, the publication lists {listed}): verification would fail on it"
    )]
    IndexNotPublished { dir: String, got: u64, listed: u64 },
    #[error(
        "the publication's index.json names {repo:?} as its upstream, which is not a repository id (owner/name): nothing is fetched or recorded from it"
    )]
    NotARepoId { repo: String },
    #[error(
        "the publication lacks files a run needs (config.json, or its tokenizer); its index.json names {repo}@{revision}: give that repository's tree listing with --source-tree FILE, or leave out --tree to ask the Hub"
    )]
    NeedsUpstreamTree { repo: String, revision: String },
    #[error(
        "the publication holds no {name}; its index.json names {repo}@{revision}, whose tree lists one ({size} bytes): place it at {target} (it is https://huggingface.co/{repo}/blob/{revision}/{name}) and verify again"
    )]
    PlaceIt {
        name: String,
        repo: String,
        revision: String,
        size: u64,
        target: String,
    },
    #[error("cannot read the tree listing {path}: {error}")]
    Listing { path: String, error: String },
    #[error("cannot list {repo}@{revision}: {source}")]
    List {
        repo: String,
        revision: String,
        #[source]
        source: Box<HubError>,
    },
    #[error("cannot fetch from {repo}@{revision}: {source}")]
    Fetch {
        repo: String,
        revision: String,
        #[source]
        source: Box<HubError>,
    },
    #[error(transparent)]
    Hub(Box<HubError>),
}

impl From<HubError> for UpstreamError {
    fn from(error: HubError) -> UpstreamError {
        UpstreamError::Hub(Box::new(error))
    }
}

/// Where the upstream's tree comes from.
pub struct Lookup<'a> {
    /// A saved listing of the upstream tree (`--source-tree`).
    pub source_tree: Option<&'a Path>,
    /// The publication's tree was given as a file: ask no server.
    pub offline: bool,
    pub endpoint: Option<&'a str>,
}

/// What the upstream gave a publication.
#[derive(Default)]
pub struct Sourced {
    /// The upstream the publication's index.json names, when it names one and a file was
    /// wanted from it.
    pub origin: Option<Origin>,
    /// The files to verify against the upstream besides the publication's own.
    pub files: Vec<SourcedFile>,
    /// Files fetched now into the artifact (each verified against its listed digest first).
    pub fetched: Vec<String>,
    /// Files a run needs that neither the publication nor its upstream holds.
    pub absent_upstream: Vec<String>,
}

/// The files to verify against the upstream besides the publication's own, fetched into `dir`
/// first where they are missing (unless `lookup` is offline, which refuses instead).
pub fn sourced_files(
    dir: &Path,
    publication: &Tree,
    lookup: Lookup<'_>,
) -> Result<Sourced, UpstreamError> {
    let wanted = files_lacking(publication);
    if wanted.is_empty() {
        return match lookup.source_tree {
            Some(_) => Err(UpstreamError::SourceTreeNotNeeded),
            None => Ok(Sourced::default()),
        };
    }
    let Some(origin) = named_upstream(dir, publication)? else {
        return match lookup.source_tree {
            Some(_) => Err(UpstreamError::NoNamedUpstream),
            None => Ok(Sourced::default()),
        };
    };
    let upstream = upstream_tree(&origin, &lookup)?;
    let mut sourced = Sourced {
        origin: Some(origin.clone()),
        ..Sourced::default()
    };
    let mut absent = Tree {
        repo: upstream.repo.clone(),
        revision: upstream.revision.clone(),
        files: Default::default(),
    };
    for name in wanted {
        let Some(file) = upstream.files.get(name).cloned() else {
            sourced.absent_upstream.push(name.to_string());
            continue;
        };
        let target = dir.join(name);
        if std::fs::symlink_metadata(&target).is_err() {
            if lookup.offline {
                return Err(UpstreamError::PlaceIt {
                    name: name.to_string(),
                    repo: origin.repo.clone(),
                    revision: origin.revision.clone(),
                    size: file.size,
                    target: target.display().to_string(),
                });
            }
            absent.files.insert(name.to_string(), file.clone());
        }
        sourced.files.push(SourcedFile {
            file,
            origin: origin.clone(),
        });
    }
    if !absent.files.is_empty() {
        fetch(&absent, dir, lookup.endpoint)?;
        sourced.fetched = absent.files.keys().cloned().collect();
    }
    Ok(sourced)
}

/// What a run needs that `publication` does not hold: its `config.json`, and a tokenizer when
/// it has none.
fn files_lacking(publication: &Tree) -> Vec<&'static str> {
    let mut wanted = Vec::new();
    if !publication.files.contains_key(CONFIG) {
        wanted.push(CONFIG);
    }
    if !TOKENIZERS
        .iter()
        .any(|t| publication.files.contains_key(*t))
    {
        wanted.extend(UPSTREAM_TOKENIZER);
    }
    wanted
}

/// The single upstream the publication's index.json names, read from bytes that match the
/// publication's digest of that file.
fn named_upstream(dir: &Path, publication: &Tree) -> Result<Option<Origin>, UpstreamError> {
    let Some(listed) = publication.files.get(INDEX_FILE) else {
        return Ok(None);
    };
    let unreadable = |error: String| UpstreamError::Index {
        dir: dir.display().to_string(),
        error,
    };
    let root = Root::open(dir).map_err(|e| unreadable(e.to_string()))?;
    let (file, _) = root
        .open_file(INDEX_FILE)
        .map_err(|e| unreadable(e.to_string()))?;
    let bytes = minirun_store::read_bounded(file, INDEX_FILE, MAX_INDEX_BYTES)
        .map_err(|e| unreadable(e.to_string()))?;
    let mut hasher = StreamHasher::new(&listed.digest, bytes.len() as u64);
    hasher.update(&bytes);
    if bytes.len() as u64 != listed.size || hasher.finish() != listed.digest {
        return Err(UpstreamError::IndexNotPublished {
            dir: dir.display().to_string(),
            got: bytes.len() as u64,
            listed: listed.size,
        });
    }
    let index = ArtifactIndex::parse(&bytes);
    let [source] = index.sources.as_slice() else {
        return Ok(None);
    };
    // The id is printed and recorded in the evidence: a hostile index.json must not put
    // terminal escapes or a path there.
    if !is_canonical_repo_id(&source.repo) {
        return Err(UpstreamError::NotARepoId {
            repo: source.repo.clone(),
        });
    }
    Ok(source
        .revision
        .as_deref()
        .filter(|rev| is_pinned_revision(rev))
        .map(|rev| Origin {
            repo: source.repo.clone(),
            revision: rev.to_string(),
        }))
}

fn upstream_tree(origin: &Origin, lookup: &Lookup<'_>) -> Result<Tree, UpstreamError> {
    match lookup.source_tree {
        Some(path) => read_listing(path, &origin.repo, &origin.revision),
        None if lookup.offline => Err(UpstreamError::NeedsUpstreamTree {
            repo: origin.repo.clone(),
            revision: origin.revision.clone(),
        }),
        None => Hub::from_env(lookup.endpoint)?
            .tree(&origin.repo, &origin.revision)
            .map_err(|source| UpstreamError::List {
                repo: origin.repo.clone(),
                revision: origin.revision.clone(),
                source: Box::new(source),
            }),
    }
}

/// A saved tree listing (one page of the Hub's tree endpoint, or pages concatenated) as the
/// tree of `repo@revision`.
pub fn read_listing(path: &Path, repo: &str, revision: &str) -> Result<Tree, UpstreamError> {
    let refused = |error: String| UpstreamError::Listing {
        path: path.display().to_string(),
        error,
    };
    let bytes = std::fs::read(path).map_err(|e| refused(e.to_string()))?;
    let mut builder = TreeBuilder::default();
    builder
        .add_page(&bytes)
        .map_err(|e| refused(format!("it is not a tree listing: {e}")))?;
    Ok(builder.finish(repo, revision))
}

/// Downloads `files` (part of the upstream's tree) into `dir` in one pass, each verified
/// against its listed digest before it is renamed into place.
fn fetch(files: &Tree, dir: &Path, endpoint: Option<&str>) -> Result<(), UpstreamError> {
    let fetch_error = |source| UpstreamError::Fetch {
        repo: files.repo.clone(),
        revision: files.revision.clone(),
        source: Box::new(source),
    };
    Hub::from_env(endpoint)?
        .download(files, dir, &DownloadOptions::default(), &|_| {})
        .map_err(fetch_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use minirun_format::tree::{FileDigest, RepoFile};

    use super::*;

    fn publication(names: &[&str]) -> Tree {
        let files = names
            .iter()
            .map(|n| {
                let file = RepoFile {
                    path: n.to_string(),
                    size: 1,
                    digest: FileDigest::Sha256([0; 32]),
                };
                (n.to_string(), file)
            })
            .collect();
        Tree {
            repo: "owner/name".into(),
            revision: "0".repeat(40),
            files,
        }
    }

    #[test]
    fn a_run_needs_a_config_and_a_tokenizer_of_some_kind() {
        assert_eq!(
            files_lacking(&publication(&["index.json"])),
            ["config.json", "tokenizer.json", "tokenizer_config.json"]
        );
        assert_eq!(
            files_lacking(&publication(&["tiktoken.model"])),
            ["config.json"]
        );
        assert_eq!(
            files_lacking(&publication(&["config.json", "tokenizer.model"])),
            Vec::<&str>::new()
        );
        assert_eq!(
            files_lacking(&publication(&["config.json"])),
            ["tokenizer.json", "tokenizer_config.json"]
        );
    }

    #[test]
    fn an_upstream_that_is_not_a_repository_id_is_refused_before_anything_is_printed() {
        use sha2::{Digest, Sha256};
        let dir = tempfile::tempdir().unwrap();
        let index = serde_json::json!({
            "format": "quantized_tile_container", "format_version": 1,
            "source_repo": "evil\u{1b}[31m/../name", "source_revision": "0".repeat(40),
        })
        .to_string();
        std::fs::write(dir.path().join("index.json"), &index).unwrap();
        let mut publication = publication(&["tokenizer.json"]);
        publication.files.insert(
            "index.json".into(),
            RepoFile {
                path: "index.json".into(),
                size: index.len() as u64,
                digest: FileDigest::Sha256(Sha256::digest(index.as_bytes()).into()),
            },
        );
        let listing = dir.path().join("tree.json");
        let lookup = Lookup {
            source_tree: Some(&listing),
            offline: true,
            endpoint: None,
        };
        let err = sourced_files(dir.path(), &publication, lookup)
            .err()
            .unwrap();
        assert!(matches!(err, UpstreamError::NotARepoId { .. }), "{err}");
        assert!(
            !err.to_string().contains('\u{1b}'),
            "the escape is not printed raw"
        );
    }

    #[test]
    fn nothing_lacking_needs_no_upstream_listing() {
        let dir = tempfile::tempdir().unwrap();
        let complete = publication(&["config.json", "tokenizer.json"]);
        let lookup = |source_tree| Lookup {
            source_tree,
            offline: true,
            endpoint: None,
        };
        let none = sourced_files(dir.path(), &complete, lookup(None)).unwrap();
        assert!(none.files.is_empty() && none.origin.is_none());
        let listing = dir.path().join("tree.json");
        assert!(matches!(
            sourced_files(dir.path(), &complete, lookup(Some(&listing))),
            Err(UpstreamError::SourceTreeNotNeeded)
        ));
    }
}
