//! What a training invocation may do to a run: start one only where none exists, and resume
//! one only as the same run.
//!
//! A run's state is only meaningful under the config and settings it was trained with: its
//! weights have the snapshot's shapes, and its next batches and learning rates follow from
//! its saved settings. So a new run never overwrites a saved one, a resumed run keeps the
//! snapshot's config field for field, and of the settings only the number of steps may grow.
//! A refusal names every field that differs, so the fix is in the message.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::{ConfigError, DormouseConfig};
use crate::train::TrainSettings;

/// Why a run may not start or resume as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunPolicyError {
    /// A run of that name is saved already; starting afresh would overwrite its trained state.
    #[error(
        "a run named {name:?} already exists at {}: pass --resume to continue it, or --ckpt-name NAME to start another \
         (refusing to overwrite trained state)",
        bin.display()
    )]
    RunExists { name: String, bin: PathBuf },
    /// A training window longer than the model's context.
    #[error("--seq {seq} exceeds the config's max_seq_len {max_seq_len}")]
    SeqTooLong { seq: usize, max_seq_len: usize },
    /// The config asked for on resume is not the one the run was trained under.
    #[error(
        "--resume with a config that differs from the run's snapshot {}: {}",
        snapshot.display(),
        Listed(differences, "; ")
    )]
    ConfigDiffers {
        snapshot: PathBuf,
        differences: Vec<ConfigDifference>,
    },
    /// The configs could not be laid side by side (they did not serialize as tables).
    #[error(
        "--resume with a config that differs from the run's snapshot {}: the configs cannot be compared",
        snapshot.display()
    )]
    Incomparable { snapshot: PathBuf },
    /// Settings that fix the run's batches and schedule, asked to change on resume.
    #[error(
        "a resumed run is the same run: {} cannot change on --resume (only --steps can)",
        Listed(&flags(fields), ", ")
    )]
    SettingsChanged {
        /// The [`TrainSettings`] fields, in declaration order.
        fields: Vec<&'static str>,
    },
    /// The config the flags ask for is not a valid config.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// `a; b; c` for any list of displayable items.
struct Listed<'a, T>(&'a [T], &'a str);

impl<T: fmt::Display> fmt::Display for Listed<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(self.1)?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

/// The `train` flag that sets each [`TrainSettings`] field (`min_lr` is `--min-lr`).
fn flags(fields: &[&str]) -> Vec<String> {
    fields
        .iter()
        .map(|f| format!("--{}", f.replace('_', "-")))
        .collect()
}

/// One config field whose value differs between a run's snapshot and what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDifference {
    pub field: String,
    /// The snapshot's value, as TOML.
    pub snapshot: String,
    /// The asked value, as TOML (`None`: the asked config lacks the field).
    pub asked: Option<String>,
}

impl fmt::Display for ConfigDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} in the snapshot, {} asked",
            self.field,
            self.snapshot,
            self.asked.as_deref().unwrap_or("nothing")
        )
    }
}

/// Refuses to start a run named `name` where its checkpoint `bin` already exists.
pub fn refuse_existing_run(bin: &Path, name: &str) -> Result<(), RunPolicyError> {
    match bin.exists() {
        true => Err(RunPolicyError::RunExists {
            name: name.to_string(),
            bin: bin.to_path_buf(),
        }),
        false => Ok(()),
    }
}

/// Refuses settings the config's model cannot train on (a window past its context).
pub fn check_settings_fit(
    cfg: &DormouseConfig,
    settings: &TrainSettings,
) -> Result<(), RunPolicyError> {
    if settings.seq > cfg.max_seq_len {
        return Err(RunPolicyError::SeqTooLong {
            seq: settings.seq,
            max_seq_len: cfg.max_seq_len,
        });
    }
    Ok(())
}

/// Every field whose value differs between `snapshot` and `asked`, in field-name order;
/// `None` if the configs cannot be compared.
pub fn config_differences(
    snapshot: &DormouseConfig,
    asked: &DormouseConfig,
) -> Option<Vec<ConfigDifference>> {
    let (Ok(toml::Value::Table(a)), Ok(toml::Value::Table(b))) = (
        toml::Value::try_from(snapshot),
        toml::Value::try_from(asked),
    ) else {
        return None;
    };
    let differences = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| ConfigDifference {
            field: k.clone(),
            snapshot: v.to_string(),
            asked: b.get(k).map(toml::Value::to_string),
        })
        .collect();
    Some(differences)
}

/// The `--engram-ram` and `--engram-slots` flags: they move the memory to host RAM through the
/// config seam (which squeezes the in-model tables to one row per order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngramFlags {
    pub ram: bool,
    pub slots: Option<usize>,
}

impl EngramFlags {
    /// Whether either flag was given (`--engram-slots` implies `--engram-ram`).
    pub fn given(&self) -> bool {
        self.ram || self.slots.is_some()
    }

    /// `cfg` with the flags applied, resolved and validated.
    pub fn apply(&self, mut cfg: DormouseConfig) -> Result<DormouseConfig, ConfigError> {
        if self.given() {
            cfg.engram_ram = true;
        }
        if let Some(slots) = self.slots {
            cfg.engram_slots = slots;
        }
        cfg.resolve()
    }
}

/// Refuses a resume that asks for another config than the run's `snapshot` (read from
/// `snapshot_path`). `asked_base` is the config a `--config` file or `--preset` names, if one
/// was given; the Engram flags apply to it, or to the snapshot when none was. With neither, the
/// snapshot is simply used.
pub fn check_resumed_config(
    snapshot_path: &Path,
    snapshot: &DormouseConfig,
    asked_base: Option<DormouseConfig>,
    engram: EngramFlags,
) -> Result<(), RunPolicyError> {
    if asked_base.is_none() && !engram.given() {
        return Ok(());
    }
    let asked = engram.apply(asked_base.unwrap_or_else(|| snapshot.clone()))?;
    let differences =
        config_differences(snapshot, &asked).ok_or_else(|| RunPolicyError::Incomparable {
            snapshot: snapshot_path.to_path_buf(),
        })?;
    if differences.is_empty() {
        return Ok(());
    }
    Err(RunPolicyError::ConfigDiffers {
        snapshot: snapshot_path.to_path_buf(),
        differences,
    })
}

/// The training settings given on the command line; `None` takes the default on a new run
/// and the saved value on a resumed one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsOverrides {
    pub steps: Option<u64>,
    pub batch: Option<usize>,
    pub seq: Option<usize>,
    pub lr: Option<f64>,
    pub warmup: Option<u64>,
    pub min_lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub grad_clip: Option<f64>,
    pub ema_decay: Option<f64>,
    pub seed: Option<u64>,
    pub eval_bytes: Option<usize>,
}

impl SettingsOverrides {
    /// The settings of a new run: each given value, the default for the rest.
    pub fn over_defaults(&self) -> TrainSettings {
        let d = TrainSettings::default();
        TrainSettings {
            steps: self.steps.unwrap_or(d.steps),
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            lr: self.lr.unwrap_or(d.lr),
            warmup: self.warmup.unwrap_or(d.warmup),
            min_lr: self.min_lr.unwrap_or(d.min_lr),
            weight_decay: self.weight_decay.unwrap_or(d.weight_decay),
            grad_clip: self.grad_clip.unwrap_or(d.grad_clip),
            ema_decay: self.ema_decay.unwrap_or(d.ema_decay),
            seed: self.seed.unwrap_or(d.seed),
            eval_bytes: self.eval_bytes.unwrap_or(d.eval_bytes),
        }
    }

    /// The fields given with a value other than `saved`'s, `steps` aside.
    fn changed_from(&self, saved: &TrainSettings) -> Vec<&'static str> {
        let same: [(&'static str, Option<bool>); 10] = [
            ("batch", self.batch.map(|x| x == saved.batch)),
            ("seq", self.seq.map(|x| x == saved.seq)),
            ("lr", self.lr.map(|x| x == saved.lr)),
            ("warmup", self.warmup.map(|x| x == saved.warmup)),
            ("min_lr", self.min_lr.map(|x| x == saved.min_lr)),
            (
                "weight_decay",
                self.weight_decay.map(|x| x == saved.weight_decay),
            ),
            ("grad_clip", self.grad_clip.map(|x| x == saved.grad_clip)),
            ("ema_decay", self.ema_decay.map(|x| x == saved.ema_decay)),
            ("seed", self.seed.map(|x| x == saved.seed)),
            ("eval_bytes", self.eval_bytes.map(|x| x == saved.eval_bytes)),
        ];
        same.into_iter()
            .filter(|(_, same)| *same == Some(false))
            .map(|(field, _)| field)
            .collect()
    }
}

/// The settings a resumed run continues with: the `saved` ones, with the asked number of
/// steps. Refuses any other setting given with a value other than the saved one.
pub fn resumed_settings(
    saved: &TrainSettings,
    asked: &SettingsOverrides,
) -> Result<TrainSettings, RunPolicyError> {
    let fields = asked.changed_from(saved);
    if !fields.is_empty() {
        return Err(RunPolicyError::SettingsChanged { fields });
    }
    Ok(TrainSettings {
        steps: asked.steps.unwrap_or(saved.steps),
        ..saved.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nano() -> DormouseConfig {
        DormouseConfig::preset("nano").unwrap()
    }

    #[test]
    fn a_new_run_may_not_overwrite_a_saved_one() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("latest.bin");
        assert_eq!(refuse_existing_run(&bin, "latest"), Ok(()));
        std::fs::write(&bin, b"trained state").unwrap();
        let err = refuse_existing_run(&bin, "latest").unwrap_err();
        assert!(matches!(err, RunPolicyError::RunExists { .. }));
        let message = err.to_string();
        assert!(
            message.contains("\"latest\"") && message.contains("pass --resume"),
            "{message}"
        );
    }

    #[test]
    fn a_window_longer_than_the_context_is_refused() {
        let cfg = nano();
        let fits = TrainSettings {
            seq: cfg.max_seq_len,
            ..TrainSettings::default()
        };
        assert_eq!(check_settings_fit(&cfg, &fits), Ok(()));
        let long = TrainSettings {
            seq: cfg.max_seq_len + 1,
            ..fits
        };
        assert_eq!(
            check_settings_fit(&cfg, &long),
            Err(RunPolicyError::SeqTooLong {
                seq: cfg.max_seq_len + 1,
                max_seq_len: cfg.max_seq_len
            })
        );
    }

    #[test]
    fn the_snapshot_diff_names_every_differing_field_with_both_values() {
        let small = DormouseConfig::preset("small").unwrap();
        let differences = config_differences(&nano(), &small).unwrap();
        let shown: Vec<String> = differences.iter().map(ToString::to_string).collect();
        assert!(
            shown.contains(&"d_model: 64 in the snapshot, 384 asked".to_string()),
            "{shown:?}"
        );
        let fields: Vec<&str> = differences.iter().map(|d| d.field.as_str()).collect();
        let mut sorted = fields.clone();
        sorted.sort_unstable();
        assert_eq!(fields, sorted, "in field-name order");
        assert_eq!(config_differences(&nano(), &nano()), Some(Vec::new()));
    }

    #[test]
    fn resume_keeps_the_snapshot_config_unless_flags_ask_for_another() {
        let path = Path::new("checkpoints/latest.config.toml");
        let snapshot = nano();
        let none = EngramFlags::default();
        assert_eq!(check_resumed_config(path, &snapshot, None, none), Ok(()));
        assert_eq!(
            check_resumed_config(path, &snapshot, Some(nano()), none),
            Ok(()),
            "the same preset again is the same config"
        );
        let err = check_resumed_config(
            path,
            &snapshot,
            Some(DormouseConfig::preset("small").unwrap()),
            none,
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(
                "--resume with a config that differs from the run's snapshot checkpoints/latest.config.toml: "
            ) && message.contains("d_model: 64 in the snapshot, 384 asked; "),
            "{message}"
        );
    }

    #[test]
    fn engram_flags_on_resume_are_compared_through_the_config_seam() {
        let path = Path::new("latest.config.toml");
        let ram = EngramFlags {
            ram: false,
            slots: Some(2048),
        };
        let snapshot = ram.apply(nano()).unwrap();
        assert_eq!((snapshot.engram_rows, snapshot.engram_slots), (1, 2048));
        assert_eq!(check_resumed_config(path, &snapshot, None, ram), Ok(()));
        let other = EngramFlags {
            slots: Some(4096),
            ..ram
        };
        let Err(RunPolicyError::ConfigDiffers { differences, .. }) =
            check_resumed_config(path, &snapshot, None, other)
        else {
            panic!("other slots were accepted");
        };
        assert_eq!(
            differences
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["engram_slots: 2048 in the snapshot, 4096 asked"]
        );
        let too_few = EngramFlags {
            ram: true,
            slots: Some(1),
        };
        assert!(matches!(
            check_resumed_config(path, &snapshot, None, too_few),
            Err(RunPolicyError::Config(ConfigError {
                field: "engram_slots",
                ..
            }))
        ));
    }

    #[test]
    fn only_the_number_of_steps_may_change_on_resume() {
        let saved = TrainSettings {
            steps: 100,
            ..TrainSettings::default()
        };
        let more = SettingsOverrides {
            steps: Some(300),
            lr: Some(saved.lr),
            seed: Some(saved.seed),
            ..SettingsOverrides::default()
        };
        let resumed = resumed_settings(&saved, &more).unwrap();
        assert_eq!(
            resumed,
            TrainSettings {
                steps: 300,
                ..saved.clone()
            },
            "given values equal to the saved ones are not changes"
        );
        assert_eq!(
            resumed_settings(&saved, &SettingsOverrides::default()).unwrap(),
            saved,
            "no --steps: the saved number"
        );
        let changed = SettingsOverrides {
            lr: Some(0.5),
            min_lr: Some(0.0),
            eval_bytes: Some(1),
            ..SettingsOverrides::default()
        };
        let err = resumed_settings(&saved, &changed).unwrap_err();
        assert_eq!(
            err,
            RunPolicyError::SettingsChanged {
                fields: vec!["lr", "min_lr", "eval_bytes"]
            }
        );
        assert_eq!(
            err.to_string(),
            "a resumed run is the same run: --lr, --min-lr, --eval-bytes cannot change on --resume (only --steps can)"
        );
    }

    #[test]
    fn a_new_run_takes_each_given_setting_and_the_default_for_the_rest() {
        let asked = SettingsOverrides {
            batch: Some(2),
            lr: Some(0.01),
            ..SettingsOverrides::default()
        };
        assert_eq!(
            asked.over_defaults(),
            TrainSettings {
                batch: 2,
                lr: 0.01,
                ..TrainSettings::default()
            }
        );
    }
}
