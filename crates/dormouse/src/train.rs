//! A run in memory and its loop: the loss of a batch, warmup + cosine learning rate, the EMA
//! teacher, held-out bits per byte, and saving and resuming the whole run state (model,
//! optimizer moments, teacher, step and, on an `--engram-ram` run, the host memory). The
//! batches come from [`crate::data`], the initialisation from [`crate::init`] and the updates
//! from [`crate::optim`]; every random choice is a pure function of (seed, step), so a resumed
//! run is the uninterrupted run, bit for bit.

use std::path::Path;

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rayon::prelude::*;

use crate::checkpoint::{self, Checkpoint, SectionKind};
use crate::config::DormouseConfig;
use crate::data::Corpus;
use crate::engram::memory::{HostMemory, MemoryError, MemoryShape, SparseGrad};
use crate::engram::sidecar::{self, SidecarError, SidecarStamp};
use crate::fused::cross_entropy::cross_entropy;
use crate::fused::in_place::update_with;
use crate::init::{seeded_model, sorted_vars};
use crate::model::Dormouse;
use crate::optim::{AdamW, clip_factor, grad_norm_squared};

/// How a run trains (the `train` flags).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainSettings {
    pub steps: u64,
    pub batch: usize,
    pub seq: usize,
    pub lr: f64,
    pub warmup: u64,
    pub min_lr: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub ema_decay: f64,
    pub seed: u64,
    pub eval_bytes: usize,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            steps: 1000,
            batch: 8,
            seq: 256,
            lr: 3e-3,
            warmup: 50,
            min_lr: 3e-4,
            weight_decay: 0.01,
            grad_clip: 1.0,
            ema_decay: 0.99,
            seed: 1,
            eval_bytes: 65_536,
        }
    }
}

/// Learning rate at `step`: linear warmup to `lr`, then cosine decay to `min_lr` at `steps`.
pub fn lr_at(s: &TrainSettings, step: u64) -> f64 {
    if step < s.warmup {
        return s.lr * (step + 1) as f64 / s.warmup as f64;
    }
    let span = s.steps.saturating_sub(s.warmup).max(1) as f64;
    let progress = ((step - s.warmup) as f64 / span).min(1.0);
    s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// A batch's loss and, on an `--engram-ram` run, the host rows it read: a variable (so
/// backward gives their gradient) and which row each position read.
pub struct BatchLoss {
    pub loss: Tensor,
    pub host_read: Option<(Var, Vec<Vec<u32>>)>,
}

/// Cross-entropy (nats per byte) of predicting each window's next bytes, reading the memory
/// from `host` on an `--engram-ram` run and from the model otherwise.
pub fn batch_loss(
    model: &Dormouse,
    windows: &[&[u8]],
    host: Option<&HostMemory>,
) -> Result<BatchLoss> {
    let (inputs, targets) = inputs_and_targets(windows)?;
    let host_read = read_host(host, &inputs, model.device())?;
    let logits = match &host_read {
        Some((values, _)) => model.forward_with_memory(&inputs, values.as_tensor())?,
        None => model.forward(&inputs, None)?,
    };
    let (b, t, v) = logits.dims3()?;
    let loss = cross_entropy(&logits.reshape((b * t, v))?, targets)?;
    Ok(BatchLoss { loss, host_read })
}

/// Each window's bytes but the last (read) and, in order, each window's bytes but the first
/// (predicted).
fn inputs_and_targets<'w>(windows: &[&'w [u8]]) -> Result<(Vec<&'w [u8]>, Vec<u32>)> {
    if windows.iter().any(|w| w.len() < 2) {
        candle_core::bail!(
            "a training window needs at least two bytes: one to read, one to predict"
        );
    }
    let inputs = windows.iter().map(|w| &w[..w.len() - 1]).collect();
    let targets = windows
        .iter()
        .flat_map(|w| w[1..].iter().map(|&x| u32::from(x)))
        .collect();
    Ok((inputs, targets))
}

/// On an `--engram-ram` run, the host rows `inputs` read, as a variable (so the backward
/// pass gives their gradient), and which row each position read.
fn read_host(
    host: Option<&HostMemory>,
    inputs: &[&[u8]],
    device: &Device,
) -> Result<Option<(Var, Vec<Vec<u32>>)>> {
    let Some(host) = host else {
        return Ok(None);
    };
    let read = host.read(inputs, device)?;
    Ok(Some((Var::from_tensor(&read.values)?, read.rows)))
}

/// Cross-entropy (nats per byte) of predicting each window's next bytes.
pub fn loss(model: &Dormouse, windows: &[&[u8]]) -> Result<Tensor> {
    Ok(batch_loss(model, windows, None)?.loss)
}

/// Held-out bits per byte over consecutive windows of `seq + 1` bytes of `held_out` (the
/// memory read from `host` on an `--engram-ram` run).
pub fn bits_per_byte(
    model: &Dormouse,
    host: Option<&HostMemory>,
    held_out: &[u8],
    seq: usize,
) -> Result<f64> {
    let windows: Vec<&[u8]> = held_out.windows(seq + 1).step_by(seq).collect();
    let mut nats = 0.0;
    for chunk in windows.chunks(8) {
        let loss = batch_loss(model, chunk, host)?.loss;
        nats += f64::from(loss.to_scalar::<f32>()?) * chunk.len() as f64;
    }
    Ok(nats / windows.len().max(1) as f64 / std::f64::consts::LN_2)
}

/// `ema = decay * ema + (1 - decay) * params`, in place, in f32.
pub fn update_ema(ema: &mut [Tensor], vars: &[(String, Var)], decay: f64) -> Result<()> {
    let (keep, take) = (decay as f32, (1.0 - decay) as f32);
    ema.par_iter_mut().zip(vars).try_for_each(|(e, (_, var))| {
        update_with("ema", e, var.as_tensor(), |e, p| *e = *e * keep + p * take)
    })
}

/// One step's record (a JSONL line of the training log).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepLog {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
}

/// Why a run could not be saved or resumed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightsError),
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("the trainer section is damaged: {0}")]
    TrainerState(String),
    #[error(
        "the loss became {loss} at step {step}: the run diverged; the last good checkpoint is kept"
    )]
    Diverged { step: u64, loss: f64 },
    #[error("cannot write the training log: {0}")]
    Log(std::io::Error),
}

/// The trainer section of a checkpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct TrainerState {
    /// Updates applied so far: the next step to run.
    step: u64,
    settings: TrainSettings,
    /// The `.ngram` sidecar saved with this checkpoint (`--engram-ram` runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ngram: Option<SidecarStamp>,
}

/// A run in memory: model, optimizer, EMA teacher and position.
pub struct Trainer {
    pub settings: TrainSettings,
    pub varmap: VarMap,
    pub model: Dormouse,
    vars: Vec<(String, Var)>,
    pub optim: AdamW,
    pub ema: Vec<Tensor>,
    /// The memory rows of an `--engram-ram` run (saved as the `.ngram` sidecar).
    pub host: Option<HostMemory>,
    /// Updates applied so far.
    pub step: u64,
}

/// The host memory an `--engram-ram` config asks for.
pub fn host_shape(cfg: &DormouseConfig) -> Option<MemoryShape> {
    (cfg.use_engram && cfg.engram_ram).then(|| MemoryShape {
        orders: cfg.engram_orders.clone(),
        slots: cfg.engram_slots,
        dim: cfg.engram_dim,
    })
}

impl Trainer {
    /// A fresh run: seeded parameters, zero moments, the teacher a copy of the student.
    pub fn new(
        cfg: &DormouseConfig,
        settings: TrainSettings,
        device: &Device,
    ) -> std::result::Result<Self, RunError> {
        let host = match host_shape(cfg) {
            Some(shape) => Some(HostMemory::fresh(shape, settings.seed)?),
            None => None,
        };
        Ok(Self::assemble(cfg, settings, device, host)?)
    }

    fn assemble(
        cfg: &DormouseConfig,
        settings: TrainSettings,
        device: &Device,
        host: Option<HostMemory>,
    ) -> Result<Self> {
        let (varmap, model) = seeded_model(cfg, settings.seed, device)?;
        let vars = sorted_vars(&varmap)?;
        let optim = AdamW::new(&vars)?;
        let ema = vars
            .iter()
            .map(|(_, v)| Ok(v.as_tensor().copy()?.detach()))
            .collect::<Result<_>>()?;
        Ok(Trainer {
            settings,
            varmap,
            model,
            vars,
            optim,
            ema,
            host,
            step: 0,
        })
    }

    /// Runs step `self.step` on the batch the seed assigns to it.
    pub fn train_step(&mut self, corpus: &Corpus) -> std::result::Result<StepLog, RunError> {
        // On one of rayon's threads: each parallel op of the step is then handed to the other
        // thread directly instead of being injected from outside the pool, which wakes a
        // sleeping worker and puts the calling thread to sleep until the op is done.
        rayon::scope(|_| self.run_step(corpus))
    }

    fn run_step(&mut self, corpus: &Corpus) -> std::result::Result<StepLog, RunError> {
        let s = &self.settings;
        let windows = corpus.batch(s.seed, self.step, s.batch, s.seq);
        let (inputs, targets) = inputs_and_targets(&windows)?;
        let host_read = read_host(self.host.as_ref(), &inputs, self.model.device())?;
        let pass = self.model.loss_and_gradients(
            &inputs,
            targets,
            host_read.as_ref().map(|(values, _)| values),
        )?;
        let value = f64::from(pass.loss.to_scalar::<f32>()?);
        if !value.is_finite() {
            return Err(RunError::Diverged {
                step: self.step,
                loss: value,
            });
        }
        let grads = pass.grads;
        let sparse = match &host_read {
            Some((values, rows)) => match grads.get(values.as_tensor()) {
                Some(g) => Some(SparseGrad::accumulate(
                    rows,
                    &g.flatten_all()?.to_vec1::<f32>()?,
                    self.model.config().engram_dim,
                )),
                None => None,
            },
            None => None,
        };
        let squared = grad_norm_squared(&self.vars, &grads)?
            + sparse.as_ref().map_or(0.0, SparseGrad::norm_squared);
        let grad_norm = squared.sqrt();
        let scale = clip_factor(grad_norm, s.grad_clip);
        let lr = lr_at(s, self.step);
        self.optim.update_with_average(
            &self.vars,
            &grads,
            (lr, s.weight_decay, scale),
            &self.ema,
            s.ema_decay,
        )?;
        if let (Some(host), Some(sparse)) = (self.host.as_mut(), sparse.as_ref()) {
            host.apply_adam(sparse, lr, scale, self.step + 1);
        }
        let log = StepLog {
            step: self.step,
            loss: value,
            lr,
            grad_norm,
        };
        self.step += 1;
        Ok(log)
    }

    /// Saves the run: `path` (`<name>.bin`) and, on an `--engram-ram` run, the `<name>.ngram`
    /// sidecar. The sidecar is written and fsynced under a pending name first, the checkpoint
    /// that records its step and CRC is then renamed into place (the commit point), and only
    /// then is the sidecar renamed: a kill at any point leaves a checkpoint and a sidecar of one
    /// step (a pending sidecar the checkpoint already records is moved into place on resume).
    pub fn save(&self, path: &Path) -> std::result::Result<(), RunError> {
        let model = crate::weights::save_varmap(&self.varmap)?;
        let named = |prefix: &str, ts: &[Tensor]| -> Vec<(String, Tensor)> {
            self.vars
                .iter()
                .zip(ts)
                .map(|((n, _), t)| (format!("{prefix}{n}"), t.clone()))
                .collect()
        };
        let mut moments = named("m.", &self.optim.m);
        moments.extend(named("v.", &self.optim.v));
        let optim = serialize(&moments)?;
        let ema = serialize(&named("", &self.ema))?;
        let ngram = match &self.host {
            Some(host) => Some(sidecar::write_pending(
                host,
                &sidecar::pending_path(path),
                self.step,
            )?),
            None => None,
        };
        let state = TrainerState {
            step: self.step,
            settings: self.settings.clone(),
            ngram,
        };
        let trainer = toml::to_string(&state).map_err(|e| RunError::TrainerState(e.to_string()))?;
        let sections: [(SectionKind, &[u8]); 4] = [
            (SectionKind::Model, &model),
            (SectionKind::Optimizer, &optim),
            (SectionKind::Ema, &ema),
            (SectionKind::Trainer, trainer.as_bytes()),
        ];
        checkpoint::write(path, &sections)?;
        if self.host.is_some() {
            sidecar::commit(path)?;
        }
        Ok(())
    }

    /// Continues the run saved at `path`: the same model, moments, teacher and step.
    pub fn resume(
        cfg: &DormouseConfig,
        path: &Path,
        device: &Device,
    ) -> std::result::Result<Self, RunError> {
        let ckpt = Checkpoint::open(path)?;
        let text = String::from_utf8(ckpt.read(SectionKind::Trainer)?)
            .map_err(|e| RunError::TrainerState(e.to_string()))?;
        let state: TrainerState =
            toml::from_str(&text).map_err(|e| RunError::TrainerState(e.to_string()))?;
        let host = match (host_shape(cfg), state.ngram) {
            (Some(shape), Some(stamp)) => Some(sidecar::open_for(path, &shape, stamp)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err(RunError::TrainerState(
                    "the config keeps the memory in RAM (engram_ram) but the checkpoint records no .ngram sidecar".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(RunError::TrainerState(
                    "the checkpoint records a .ngram sidecar but the config does not set engram_ram".into(),
                ));
            }
        };
        let mut run = Trainer::assemble(cfg, state.settings, device, host)?;
        crate::weights::load_into_varmap(&run.varmap, &ckpt.read(SectionKind::Model)?, device)?;
        let moments =
            candle_core::safetensors::load_buffer(&ckpt.read(SectionKind::Optimizer)?, device)?;
        let ema = candle_core::safetensors::load_buffer(&ckpt.read(SectionKind::Ema)?, device)?;
        let take = |map: &std::collections::HashMap<String, Tensor>, key: String| {
            map.get(&key)
                .cloned()
                .ok_or_else(|| RunError::TrainerState(format!("the checkpoint lacks {key}")))
        };
        for (i, (name, _)) in run.vars.iter().enumerate() {
            run.optim.m[i] = take(&moments, format!("m.{name}"))?;
            run.optim.v[i] = take(&moments, format!("v.{name}"))?;
            run.ema[i] = take(&ema, name.clone())?;
        }
        run.optim.step = state.step;
        run.step = state.step;
        Ok(run)
    }
}

fn serialize(tensors: &[(String, Tensor)]) -> std::result::Result<Vec<u8>, RunError> {
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), None)
        .map_err(|e| RunError::TrainerState(e.to_string()))
}

impl Trainer {
    /// The EMA teacher as a model of its own (for held-out evaluation). It shares the EMA's
    /// buffers, which each step updates in place: evaluate it before the next step.
    pub fn teacher(&self) -> Result<Dormouse> {
        let device = self.ema.first().map_or(Device::Cpu, |t| t.device().clone());
        let tensors: std::collections::HashMap<String, Tensor> = self
            .vars
            .iter()
            .zip(&self.ema)
            .map(|((n, _), t)| (n.clone(), t.clone()))
            .collect();
        Dormouse::new(
            self.model.config(),
            VarBuilder::from_tensors(tensors, DType::F32, &device),
        )
    }
}
