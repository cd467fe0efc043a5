//! Loading an export for inference, and the checks that run before a byte is sampled.
//!
//! `generate` and `serve` take a `.dmexp` and nothing else. Anything else is refused with what
//! it is and the command that handles it (a training checkpoint: the exact `export run`
//! command), after reading its first 24 bytes. An export is loaded as an f32 model only after
//! its CRC and statistics verify, its config validates, its memory shape is servable and every
//! tensor's name and dims match the model built from the header's config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::config::{ConfigError, DormouseConfig};
use crate::model::Dormouse;
use crate::tensor_shapes::{expected_tensors, tensor_mismatch};

/// Why an export cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{}", prefixed_once(path, error))]
    Export { path: PathBuf, error: dmexp::Error },
    #[error("{}: the header's config is not a dormouse config: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Unservable {
        path: PathBuf,
        reason: UnservableMemory,
    },
    #[error(
        "{}: the header's config and the payload disagree: {mismatch}; the file was altered after export (re-export the run)",
        path.display()
    )]
    Mismatch { path: PathBuf, mismatch: String },
    #[error("{}: building the model failed: {error}", path.display())]
    Model {
        path: PathBuf,
        error: candle_core::Error,
    },
}

/// `error` after `path`, unless its message already starts with the path (an I/O error does).
fn prefixed_once(path: &Path, error: &dmexp::Error) -> String {
    let (path, message) = (path.display().to_string(), error.to_string());
    match message.starts_with(&format!("{path}: ")) {
        true => message,
        false => format!("{path}: {message}"),
    }
}

/// A memory shape no key can be served from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this model's Engram memory has {rows} row(s) per order, so every n-gram would read the same row: \
     the memory arm is a constant that was never trained as a memory. {cause}"
)]
pub struct UnservableMemory {
    pub rows: usize,
    pub cause: &'static str,
}

/// Refuses a config whose Engram rows come to one row per order. Called by `generate` and
/// `serve` before a byte is sampled.
pub fn refuse_unservable_memory(cfg: &DormouseConfig) -> Result<(), UnservableMemory> {
    if !cfg.use_engram || cfg.engram_rows > 1 {
        return Ok(());
    }
    Err(UnservableMemory {
        rows: cfg.engram_rows,
        cause: if cfg.engram_ram {
            "It was trained with --engram-ram: its memory rows live in the run's .ngram sidecar, \
             which is training state no export carries. Train without --engram-ram for a servable model."
        } else {
            "A run trained with --engram-ram keeps its rows in the .ngram sidecar instead; train with \
             engram_rows above 1 (without --engram-ram) for a servable model."
        },
    })
}

/// A loaded export.
#[derive(Debug)]
pub struct Served {
    pub model: Dormouse,
    pub header: dmexp::Header,
}

/// Loads the export at `path` as an f32 model, refusing anything that cannot be served.
pub fn load_export(path: &Path, device: &Device) -> Result<Served, ServeError> {
    let export = dmexp::read(path).map_err(|error| ServeError::Export {
        path: path.to_path_buf(),
        error,
    })?;
    let header = export.header.clone();
    let cfg = config_of(&header).map_err(|reason| ServeError::Config {
        path: path.to_path_buf(),
        reason,
    })?;
    refuse_unservable_memory(&cfg).map_err(|reason| ServeError::Unservable {
        path: path.to_path_buf(),
        reason,
    })?;
    let model_error = |error| ServeError::Model {
        path: path.to_path_buf(),
        error,
    };
    let found: BTreeMap<String, Vec<u64>> = header
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone()))
        .collect();
    if let Some(mismatch) = tensor_mismatch(&expected_tensors(&cfg).map_err(model_error)?, &found) {
        return Err(ServeError::Mismatch {
            path: path.to_path_buf(),
            mismatch,
        });
    }
    let mut tensors = std::collections::HashMap::new();
    for (entry, values) in export.into_tensors() {
        let dims: Vec<usize> = entry.dims.iter().map(|&d| d as usize).collect();
        let tensor = Tensor::from_vec(values, dims, device).map_err(model_error)?;
        tensors.insert(entry.name, tensor);
    }
    let model = Dormouse::new(&cfg, VarBuilder::from_tensors(tensors, DType::F32, device))
        .map_err(model_error)?;
    Ok(Served { model, header })
}

/// The dormouse config an export header carries, validated.
pub fn config_of(header: &dmexp::Header) -> Result<DormouseConfig, String> {
    let cfg: DormouseConfig = toml::Value::Table(header.config.clone())
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string())?;
    cfg.validate().map_err(|e: ConfigError| e.to_string())?;
    Ok(cfg)
}
