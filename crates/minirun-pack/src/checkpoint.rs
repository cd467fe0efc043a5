//! An upstream checkpoint directory: config.json, safetensors shards (with or without
//! `model.safetensors.index.json`) and the other root files (tokenizer, licence, ...).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::PackError;
use crate::shard::{Shard, TensorSource};

const SHARD_INDEX: &str = "model.safetensors.index.json";

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
        let config_text =
            std::fs::read_to_string(&config_path).map_err(|e| PackError::io(&config_path, e))?;
        let config: Value = serde_json::from_str(&config_text).map_err(|e| PackError::Refused {
            what: config_path.display().to_string(),
            reason: format!("config.json is not JSON: {e}"),
        })?;
        let (shard_names, other_files) = list_root(dir)?;
        let mut tensors = BTreeMap::new();
        for name in &shard_names {
            let shard = Shard::open(&dir.join(name))?;
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

/// Shards (`*.safetensors`) and other regular root files, each sorted by name.
fn list_root(dir: &Path) -> Result<(Vec<String>, Vec<String>), PackError> {
    let mut shards = Vec::new();
    let mut others = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| PackError::io(dir, e))? {
        let entry = entry.map_err(|e| PackError::io(dir, e))?;
        // metadata() follows symbolic links: a Hugging Face cache snapshot is all links.
        let kind = std::fs::metadata(entry.path()).map_err(|e| PackError::io(entry.path(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !kind.is_file() || name.starts_with('.') {
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
    let text = std::fs::read_to_string(&path).map_err(|e| PackError::io(&path, e))?;
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
