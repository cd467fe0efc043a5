//! The root files a publication does not hold but a run needs, taken from the upstream
//! repository and pinned revision that the publication's own `index.json` names, and verified
//! against that upstream's tree: `config.json` (Kimi K3 and DeepSeek V4 publish none) and, when
//! the publication carries no tokenizer at all (DeepSeek V4's recorded revision), the upstream's
//! `tokenizer.json` and `tokenizer_config.json`.
//!
//! Nothing is defaulted: an index that names no single pinned upstream, or an upstream whose
//! tree lacks a file, leaves the artifact without it, and `minirun run` refuses what it needs.

use std::path::Path;

use anyhow::{Context, Result, bail};
use minirun_format::artifact::INDEX_FILE;
use minirun_format::identity::is_pinned_revision;
use minirun_format::index::ArtifactIndex;
use minirun_format::tree::{StreamHasher, Tree, TreeBuilder};
use minirun_hub::{DownloadOptions, Hub};
use minirun_store::{Origin, Root, SourcedFile};

const CONFIG: &str = "config.json";
/// A publication holding any of these has its tokenizer.
const TOKENIZERS: [&str; 3] = ["tokenizer.json", "tiktoken.model", "tokenizer.model"];
/// What is taken from the upstream for a publication without a tokenizer.
const UPSTREAM_TOKENIZER: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];
/// Far above any index.json (the K3 one is 577 bytes).
const MAX_INDEX_BYTES: u64 = 16 << 20;

/// Where the upstream's tree comes from.
pub struct Lookup<'a> {
    /// A saved listing of the upstream tree (`--source-tree`).
    pub source_tree: Option<&'a Path>,
    /// The publication's tree was given as a file: ask no server.
    pub offline: bool,
    pub endpoint: Option<&'a str>,
}

/// The files to verify against the upstream besides the publication's own.
pub fn sourced_config(
    dir: &Path,
    publication: &Tree,
    lookup: Lookup<'_>,
) -> Result<Vec<SourcedFile>> {
    let mut wanted: Vec<&str> = Vec::new();
    if !publication.files.contains_key(CONFIG) {
        wanted.push(CONFIG);
    }
    if !TOKENIZERS
        .iter()
        .any(|t| publication.files.contains_key(*t))
    {
        wanted.extend(UPSTREAM_TOKENIZER);
    }
    if wanted.is_empty() {
        if lookup.source_tree.is_some() {
            bail!(
                "the publication holds its own config.json and tokenizer; --source-tree is not needed"
            );
        }
        return Ok(Vec::new());
    }
    let Some(origin) = named_upstream(dir, publication)? else {
        if lookup.source_tree.is_some() {
            bail!(
                "the publication's index.json names no single upstream repository at a pinned revision, so no upstream file can be verified"
            );
        }
        return Ok(Vec::new());
    };
    let upstream = upstream_tree(&origin, &lookup)?;
    let mut sourced = Vec::new();
    let mut absent = Tree {
        repo: upstream.repo.clone(),
        revision: upstream.revision.clone(),
        files: Default::default(),
    };
    for name in wanted {
        let Some(file) = upstream.files.get(name).cloned() else {
            eprintln!(
                "warning: neither the publication nor its upstream {}@{} holds {name}: `minirun run` refuses an artifact without what it needs",
                origin.repo, origin.revision
            );
            continue;
        };
        let target = dir.join(name);
        if std::fs::symlink_metadata(&target).is_err() {
            if lookup.offline {
                bail!(
                    "the publication holds no {name}; its index.json names {repo}@{rev}, whose tree lists one ({size} bytes): \
                     place it at {} (it is https://huggingface.co/{repo}/blob/{rev}/{name}) and verify again",
                    target.display(),
                    repo = origin.repo,
                    rev = origin.revision,
                    size = file.size,
                );
            }
            absent.files.insert(name.to_string(), file.clone());
        }
        sourced.push(SourcedFile {
            file,
            origin: origin.clone(),
        });
    }
    if !absent.files.is_empty() {
        fetch(&absent, dir, lookup.endpoint)?;
    }
    Ok(sourced)
}

/// The single upstream the publication's index.json names, read from bytes that match the
/// publication's digest of that file.
fn named_upstream(dir: &Path, publication: &Tree) -> Result<Option<Origin>> {
    let Some(listed) = publication.files.get(INDEX_FILE) else {
        return Ok(None);
    };
    let root = Root::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    let (file, _) = root.open_file(INDEX_FILE)?;
    let bytes = minirun_store::read_bounded(file, INDEX_FILE, MAX_INDEX_BYTES)?;
    let mut hasher = StreamHasher::new(&listed.digest, bytes.len() as u64);
    hasher.update(&bytes);
    if bytes.len() as u64 != listed.size || hasher.finish() != listed.digest {
        bail!(
            "{}: index.json is not the published one ({} bytes, the publication lists {}): verification would fail on it",
            dir.display(),
            bytes.len(),
            listed.size
        );
    }
    let index = ArtifactIndex::parse(&bytes);
    let [source] = index.sources.as_slice() else {
        return Ok(None);
    };
    Ok(source
        .revision
        .as_deref()
        .filter(|rev| is_pinned_revision(rev))
        .map(|rev| Origin {
            repo: source.repo.clone(),
            revision: rev.to_string(),
        }))
}

fn upstream_tree(origin: &Origin, lookup: &Lookup<'_>) -> Result<Tree> {
    let Some(path) = lookup.source_tree else {
        if lookup.offline {
            bail!(
                "the publication lacks files a run needs (config.json, or its tokenizer); its index.json names {}@{}: give that repository's tree listing with --source-tree FILE, or leave out --tree to ask the Hub",
                origin.repo,
                origin.revision
            );
        }
        return Hub::from_env(lookup.endpoint)?
            .tree(&origin.repo, &origin.revision)
            .with_context(|| format!("cannot list {}@{}", origin.repo, origin.revision));
    };
    read_listing(path, &origin.repo, &origin.revision)
}

/// A saved tree listing (one page of the Hub's tree endpoint) as the tree of `repo@revision`.
pub fn read_listing(path: &Path, repo: &str, revision: &str) -> Result<Tree> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut builder = TreeBuilder::default();
    builder
        .add_page(&bytes)
        .with_context(|| format!("{} is not a tree listing", path.display()))?;
    Ok(builder.finish(repo, revision))
}

/// Downloads `files` (part of the upstream's tree) into `dir` in one pass, each verified
/// against its listed digest before it is renamed into place.
fn fetch(files: &Tree, dir: &Path, endpoint: Option<&str>) -> Result<()> {
    Hub::from_env(endpoint)?
        .download(files, dir, &DownloadOptions::default(), &|_| {})
        .with_context(|| format!("cannot fetch from {}@{}", files.repo, files.revision))?;
    for path in files.files.keys() {
        eprintln!(
            "fetched {path} from {}@{} (the upstream the publication's index.json names)",
            files.repo, files.revision
        );
    }
    Ok(())
}
