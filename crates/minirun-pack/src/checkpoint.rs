//! An upstream checkpoint directory: config.json, safetensors shards (with or without
//! `model.safetensors.index.json`) and the other root files (tokenizer, licence, ...).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::PackError;
use crate::shard::{Shard, TensorSource};

const SHARD_INDEX: &str = "model.safetensors.index.json";
/// The most tensors a checkpoint may hold over all its shards (each costs a few hundred bytes
/// while packing).
pub const MAX_TENSORS: usize = 1 << 20;
/// The most `config.json` or the shard index may hold: about 64 bytes for each of
/// `MAX_TENSORS` index entries.
pub const MAX_METADATA_BYTES: u64 = 64 << 20;

/// The most header bytes all shards may have together. What packing keeps of a shard is
/// about its header's size, so this bounds the tensor list; the largest published
/// checkpoints' headers add up to a few tens of megabytes.
pub const MAX_HEADER_BYTES: u64 = 128 << 20;

/// A checkpoint whose every shard header has been validated.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Value,
    /// Every tensor by name, across shards.
    pub tensors: BTreeMap<String, TensorSource>,
    /// Root files that are neither shards nor the shard index, sorted: copied verbatim.
    pub other_files: Vec<String>,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, PackError> {
        let config_path = dir.join("config.json");
        let config_text = read_text_bounded(&config_path)?;
        let config: Value = serde_json::from_str(&config_text).map_err(|e| PackError::Refused {
            what: config_path.display().to_string(),
            reason: format!("config.json is not JSON: {e}"),
        })?;
        let (shard_names, other_files) = list_root(dir)?;
        let mut tensors = BTreeMap::new();
        let mut header_bytes = 0;
        for name in &shard_names {
            let shard = Shard::open(&dir.join(name))?;
            header_bytes += shard.header_bytes;
            if header_bytes > MAX_HEADER_BYTES {
                return Err(PackError::Refused {
                    what: dir.display().to_string(),
                    reason: format!(
                        "its shards' headers add up to more than {MAX_HEADER_BYTES} bytes, far more than any published checkpoint's; this build refuses it rather than exhaust memory"
                    ),
                });
            }
            if tensors.len() + shard.tensors.len() > MAX_TENSORS {
                return Err(PackError::Refused {
                    what: dir.display().to_string(),
                    reason: format!(
                        "its shards hold more than {MAX_TENSORS} tensors, far more than any published checkpoint; this build refuses it rather than exhaust memory"
                    ),
                });
            }
            for t in shard.tensors {
                if let Some(previous) = tensors.insert(t.name.clone(), t) {
                    return Err(PackError::Refused {
                        what: previous.name.clone(),
                        reason: format!(
                            "the tensor appears in two shards ({} and {name})",
                            previous.shard
                        ),
                    });
                }
            }
        }
        check_shard_index(dir, &tensors)?;
        if tensors.is_empty() {
            return Err(PackError::Refused {
                what: dir.display().to_string(),
                reason: "no *.safetensors shard holds any tensor".to_string(),
            });
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            tensors,
            other_files,
        })
    }
}

/// Shards (`*.safetensors`) and other regular root files, each sorted by name. A root file
/// that is a symbolic link must lead inside the checkpoint folder, or, for a Hugging Face cache
/// snapshot (`<repo>/snapshots/<revision>`, which is all links), inside that repository's
/// cache folder: a link out of the source would copy any file of this machine into an artifact
/// that may be published.
fn list_root(dir: &Path) -> Result<(Vec<String>, Vec<String>), PackError> {
    let mut shards = Vec::new();
    let mut others = Vec::new();
    let allowed = link_roots(dir)?;
    for entry in std::fs::read_dir(dir).map_err(|e| PackError::io(dir, e))? {
        let entry = entry.map_err(|e| PackError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let own = std::fs::symlink_metadata(&path).map_err(|e| PackError::io(&path, e))?;
        if own.file_type().is_symlink() {
            check_link(&path, &allowed)?;
        }
        // metadata() follows the (checked) link.
        let kind = std::fs::metadata(&path).map_err(|e| PackError::io(&path, e))?;
        if !kind.is_file() {
            continue;
        }
        if name.ends_with(".safetensors") {
            shards.push(name);
        } else if name != SHARD_INDEX {
            others.push(name);
        }
    }
    shards.sort();
    others.sort();
    Ok((shards, others))
}

/// Where a root link may lead: the checkpoint folder, and for a Hugging Face cache snapshot,
/// its repository's cache folder (whose `blobs/` the snapshot's links point into).
fn link_roots(dir: &Path) -> Result<Vec<PathBuf>, PackError> {
    let own = std::fs::canonicalize(dir).map_err(|e| PackError::io(dir, e))?;
    let mut roots = vec![own.clone()];
    if let Some(snapshots) = own.parent()
        && snapshots.file_name().is_some_and(|n| n == "snapshots")
        && let Some(repo) = snapshots.parent()
    {
        roots.push(repo.to_path_buf());
    }
    Ok(roots)
}

fn check_link(path: &Path, allowed: &[PathBuf]) -> Result<(), PackError> {
    let target = std::fs::canonicalize(path).map_err(|e| PackError::io(path, e))?;
    if allowed.iter().any(|root| target.starts_with(root)) {
        return Ok(());
    }
    Err(PackError::Refused {
        what: path.display().to_string(),
        reason: format!(
            "is a symbolic link to {}, outside the checkpoint folder: packing it would copy a file from elsewhere on this machine into the artifact. Copy the file into the folder, or remove the link",
            target.display()
        ),
    })
}

/// A root metadata file's text, refused past [`MAX_METADATA_BYTES`] without reading further.
fn read_text_bounded(path: &Path) -> Result<String, PackError> {
    let refuse = |reason: String| PackError::Refused {
        what: path.display().to_string(),
        reason,
    };
    let file = regular_file::open(path).map_err(|e| PackError::io(path, e))?;
    let bytes = regular_file::read_at_most(file, MAX_METADATA_BYTES)
        .map_err(|e| PackError::io(path, e))?
        .ok_or_else(|| {
            refuse(format!(
                "larger than {MAX_METADATA_BYTES} bytes: not a model's metadata"
            ))
        })?;
    String::from_utf8(bytes).map_err(|_| {
        let invalid = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        );
        PackError::io(path, invalid)
    })
}

/// When a shard index exists, every tensor it maps must be in the shard it names, and
/// every tensor found must be mapped.
fn check_shard_index(
    dir: &Path,
    tensors: &BTreeMap<String, TensorSource>,
) -> Result<(), PackError> {
    let path = dir.join(SHARD_INDEX);
    if !path.is_file() {
        return Ok(());
    }
    let refuse = |reason: String| PackError::Refused {
        what: path.display().to_string(),
        reason,
    };
    let text = read_text_bounded(&path)?;
    let index: Value = serde_json::from_str(&text).map_err(|e| refuse(format!("not JSON: {e}")))?;
    let Some(map) = index.get("weight_map").and_then(Value::as_object) else {
        return Err(refuse("no weight_map object".to_string()));
    };
    for (name, shard) in map {
        let found = tensors.get(name).map(|t| t.shard.as_str());
        if found != shard.as_str() {
            return Err(refuse(format!(
                "maps {name:?} to {shard} but it is in {found:?}"
            )));
        }
    }
    if let Some(unmapped) = tensors.keys().find(|k| !map.contains_key(*k)) {
        return Err(refuse(format!("does not map tensor {unmapped:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Shards whose headers (one tensor, padded with spaces as the format allows) add up to
    /// just over the bound, and just under it.
    #[test]
    fn the_shards_headers_together_are_bounded() {
        let shard = |dir: &Path, name: &str, header_len: usize| {
            let mut header = br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#.to_vec();
            header.resize(header_len, b' ');
            let mut bytes = (header_len as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(&header);
            bytes.push(0);
            std::fs::write(dir.join(name), bytes).unwrap();
        };
        let half = (MAX_HEADER_BYTES / 2) as usize;
        for (second, refused) in [(half + 1, true), (half, false)] {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::write(tmp.path().join("config.json"), "{}").unwrap();
            shard(tmp.path(), "a.safetensors", half);
            shard(tmp.path(), "b.safetensors", second);
            let result = Checkpoint::open(tmp.path());
            match refused {
                true => assert!(
                    matches!(&result, Err(PackError::Refused { reason, .. }) if reason.contains("headers add up")),
                    "{result:?}"
                ),
                false => assert!(
                    matches!(&result, Err(PackError::Refused { reason, .. }) if reason.contains("appears in two shards")),
                    "{result:?}"
                ),
            }
        }
    }

    #[test]
    fn root_links_must_stay_in_the_checkpoint_or_its_hugging_face_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret.txt");
        std::fs::write(&secret, "private").unwrap();
        let dir = tmp.path().join("checkpoint");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("README.md"), "model card").unwrap();
        symlink(dir.join("README.md"), dir.join("card.md")).unwrap();
        let (_, others) = list_root(&dir).unwrap();
        assert_eq!(others, ["README.md", "card.md"]);

        symlink(&secret, dir.join("notes.txt")).unwrap();
        let err = list_root(&dir).unwrap_err().to_string();
        assert!(
            err.contains("notes.txt") && err.contains("outside the checkpoint folder"),
            "{err}"
        );

        // A Hugging Face cache snapshot: links into the repository's blobs/ are the layout.
        let repo = tmp.path().join("models--org--name");
        let snapshot = repo.join("snapshots/0123abc");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs/f00d"), "{}").unwrap();
        symlink("../../blobs/f00d", snapshot.join("config.json")).unwrap();
        let (_, others) = list_root(&snapshot).unwrap();
        assert_eq!(others, ["config.json"]);
        symlink(&secret, snapshot.join("notes.txt")).unwrap();
        assert!(list_root(&snapshot).is_err());
    }
}
