//! `export run`: a training run (`<name>.bin` + `<name>.config.toml`) to one `.dmexp` file.
//!
//! Reads the checkpoint's model section and trainer section (for the step) and nothing else:
//! the optimizer section, the EMA teacher and an `--engram-ram` run's `.ngram` sidecar are never
//! opened. The config comes from the run's snapshot; a preset is accepted only when the snapshot
//! is absent, and the export's `source` then says the shape was guessed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dmexp::{Dtype, ExportMeta, TensorRef, Written};

use crate::checkpoint::{Checkpoint, CheckpointError, SectionKind};
use crate::config::{ConfigReadError, DormouseConfig};
use crate::tensor_shapes::{expected_tensors, tensor_mismatch};

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub ckpt_dir: PathBuf,
    pub ckpt_name: String,
    pub dtype: Dtype,
    /// Default `<ckpt-dir>/<ckpt-name>.<dtype>.dmexp`.
    pub out: Option<PathBuf>,
    /// Only when the run has no config snapshot: the preset whose shape to assume.
    pub preset: Option<String>,
}

impl ExportRequest {
    pub fn checkpoint_path(&self) -> PathBuf {
        self.ckpt_dir.join(format!("{}.bin", self.ckpt_name))
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.ckpt_dir
            .join(format!("{}.config.toml", self.ckpt_name))
    }

    pub fn out_path(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            self.ckpt_dir
                .join(format!("{}.{}.dmexp", self.ckpt_name, self.dtype.name()))
        })
    }
}

/// Where the export's config came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// The run's own snapshot: the shape the weights were trained under.
    Snapshot(PathBuf),
    /// A preset, because the snapshot was absent: a guess.
    GuessedPreset(String),
}

/// What `export run` wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub out: PathBuf,
    pub written: Written,
    pub config: DormouseConfig,
    pub config_source: ConfigSource,
    pub step: u64,
}

/// Why a run could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Dmexp(#[from] dmexp::Error),
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} is not a valid dormouse config: {error}", path.display())]
    Snapshot {
        path: PathBuf,
        error: ConfigReadError,
    },
    #[error(
        "{} exists, so the config comes from it and --preset {preset} is not used: drop --preset \
         (a preset is a guess about a shape; the snapshot is the shape the weights were trained under)",
        snapshot.display()
    )]
    PresetWithSnapshot { snapshot: PathBuf, preset: String },
    #[error(
        "{} is missing, so the shape of these weights is unknown; if you know which preset the run \
         used, pass --preset NAME (the export will record that the shape was guessed)",
        snapshot.display()
    )]
    NoSnapshot { snapshot: PathBuf },
    #[error(transparent)]
    Preset(ConfigReadError),
    #[error("the checkpoint's model section is not a valid safetensors file: {0}")]
    ModelSection(String),
    #[error("the checkpoint's trainer section is damaged: {0}")]
    TrainerSection(String),
    #[error(
        "the checkpoint's tensors do not fit the config ({config}): {mismatch}; export the run with its own snapshot"
    )]
    Mismatch { config: String, mismatch: String },
    #[error("building the model for the config failed: {0}")]
    Model(#[from] candle_core::Error),
    #[error(
        "--out {} is the run's own {} ({}): the export would replace the run it is made from. Give another --out (default <ckpt-dir>/<ckpt-name>.<dtype>.dmexp)",
        out.display(), what, file.display()
    )]
    OutIsTheRun {
        out: PathBuf,
        what: &'static str,
        file: PathBuf,
    },
    #[error(
        "--out {} is {kind}, not a regular file: an export replaces only a regular file or writes a new one. Give another --out",
        out.display()
    )]
    OutNotRegular { out: PathBuf, kind: &'static str },
    #[error(
        "--out {} already holds a file that is not a .dmexp export ({kind}): an export replaces only an earlier export. Give another --out, or move that file away first",
        out.display()
    )]
    OutNotAnExport { out: PathBuf, kind: &'static str },
}

fn resolve_config(req: &ExportRequest) -> Result<(DormouseConfig, ConfigSource), ExportError> {
    let snapshot = req.snapshot_path();
    match (std::fs::read_to_string(&snapshot), &req.preset) {
        (Ok(_), Some(preset)) => Err(ExportError::PresetWithSnapshot {
            snapshot,
            preset: preset.clone(),
        }),
        (Ok(text), None) => {
            let cfg = DormouseConfig::from_toml(&text).map_err(|error| ExportError::Snapshot {
                path: snapshot.clone(),
                error,
            })?;
            Ok((cfg, ConfigSource::Snapshot(snapshot)))
        }
        (Err(e), _) if e.kind() != std::io::ErrorKind::NotFound => Err(ExportError::Io {
            path: snapshot,
            error: e,
        }),
        (Err(_), Some(preset)) => Ok((
            DormouseConfig::preset(preset).map_err(ExportError::Preset)?,
            ConfigSource::GuessedPreset(preset.clone()),
        )),
        (Err(_), None) => Err(ExportError::NoSnapshot { snapshot }),
    }
}

#[derive(serde::Deserialize)]
struct TrainerStep {
    step: u64,
}

/// Exports the run `req` names. Nothing is created on any failure.
/// Refuses an `--out` that is one of the run's own files (through any name: a hard or
/// symbolic link too) or anything but a regular file, before a byte is read.
fn check_out(req: &ExportRequest) -> Result<(), ExportError> {
    use std::os::unix::fs::MetadataExt;
    let out = req.out_path();
    let Ok(meta) = std::fs::symlink_metadata(&out) else {
        return Ok(());
    };
    if !meta.file_type().is_file() {
        return Err(ExportError::OutNotRegular {
            kind: regular_file::describe(meta.file_type()),
            out,
        });
    }
    let bin = req.checkpoint_path();
    let run_files = [
        ("checkpoint", bin.clone()),
        ("config snapshot", req.snapshot_path()),
        ("Engram sidecar", crate::engram::sidecar::sidecar_path(&bin)),
    ];
    for (what, file) in run_files {
        if let Ok(theirs) = std::fs::metadata(&file)
            && (theirs.dev(), theirs.ino()) == (meta.dev(), meta.ino())
        {
            return Err(ExportError::OutIsTheRun { out, what, file });
        }
    }
    // Anything else that is not an export (another run's checkpoint under another name, a
    // user's file) is not this command's to replace; an empty file holds nothing to lose.
    let io = |error| ExportError::Io {
        path: out.clone(),
        error,
    };
    let mut prefix = Vec::new();
    regular_file::open(&out)
        .and_then(|file| {
            use std::io::Read;
            file.take(OUT_PREFIX_BYTES).read_to_end(&mut prefix)
        })
        .map_err(io)?;
    match dmexp::identify(&prefix) {
        _ if meta.len() == 0 => Ok(()),
        dmexp::FileKind::Export { .. } => Ok(()),
        other => Err(ExportError::OutNotAnExport {
            out,
            kind: other.label(),
        }),
    }
}

/// Enough of an existing `--out` to tell an export from anything else.
const OUT_PREFIX_BYTES: u64 = 64;

pub fn export_run(req: &ExportRequest) -> Result<Exported, ExportError> {
    check_out(req)?;
    let bin = req.checkpoint_path();
    let ckpt = Checkpoint::open(&bin)?;
    let (config, config_source) = resolve_config(req)?;
    let trainer = ckpt.read(SectionKind::Trainer)?;
    let step = std::str::from_utf8(&trainer)
        .map_err(|e| e.to_string())
        .and_then(|t| toml::from_str::<TrainerStep>(t).map_err(|e| e.to_string()))
        .map_err(ExportError::TrainerSection)?
        .step;
    let section = ckpt.read(SectionKind::Model)?;
    let tensors = safetensors::SafeTensors::deserialize(&section)
        .map_err(|e| ExportError::ModelSection(e.to_string()))?;
    let mut values: BTreeMap<String, (Vec<u64>, std::borrow::Cow<'_, [f32]>)> = BTreeMap::new();
    for (name, view) in tensors.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(ExportError::ModelSection(format!(
                "{name} is {:?}, not F32",
                view.dtype()
            )));
        }
        let dims = view.shape().iter().map(|&d| d as u64).collect();
        // Little-endian f32s, read in place when aligned (they nearly always are).
        let floats = match bytemuck::try_cast_slice::<u8, f32>(view.data()) {
            Ok(aligned) if cfg!(target_endian = "little") => std::borrow::Cow::Borrowed(aligned),
            _ => std::borrow::Cow::Owned(
                view.data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
        };
        values.insert(name, (dims, floats));
    }
    let found = values
        .iter()
        .map(|(n, (d, _))| (n.clone(), d.clone()))
        .collect();
    if let Some(mismatch) = tensor_mismatch(&expected_tensors(&config)?, &found) {
        return Err(ExportError::Mismatch {
            config: match &config_source {
                ConfigSource::Snapshot(p) => p.display().to_string(),
                ConfigSource::GuessedPreset(p) => format!("preset {p}"),
            },
            mismatch,
        });
    }
    let source = match &config_source {
        ConfigSource::Snapshot(_) => format!("{}@step{step}", bin.display()),
        ConfigSource::GuessedPreset(p) => format!(
            "{}@step{step} (config snapshot absent; shape guessed from preset {p})",
            bin.display()
        ),
    };
    let meta = ExportMeta {
        source,
        step,
        config: config_table(&config),
    };
    let refs: Vec<TensorRef<'_>> = values
        .iter()
        .map(|(name, (dims, values))| TensorRef { name, dims, values })
        .collect();
    let out = req.out_path();
    let written = dmexp::encode_to_path(&out, &meta, &refs, req.dtype)?;
    Ok(Exported {
        out,
        written,
        config,
        config_source,
        step,
    })
}

/// The config as the TOML table an export header carries.
pub fn config_table(cfg: &DormouseConfig) -> toml::Table {
    toml::Table::try_from(cfg).unwrap_or_default()
}
