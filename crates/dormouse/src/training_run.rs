//! A run from where it stands to its last step: the steps, an evaluation of the model and its
//! EMA teacher on the held-out bytes every `eval_every` steps and at the end, a save every
//! `save_every` steps and at the end, and the run's log. What a person sees (a progress bar,
//! lines on stderr) is the caller's: it hears each [`RunEvent`].
//!
//! The log is JSON Lines, one object a line, appended (a resumed run continues its file):
//!
//! | line | when |
//! |---|---|
//! | `{"startup_s": S}` | once per start: seconds from the program's start to the first step |
//! | `{"baselines": {"gzip_9", "xz_9", "zstd_19", "order0_entropy"}}` | once per start: bits per byte of the held-out bytes under each |
//! | `{"step", "loss", "lr", "grad_norm", "tokens_per_s"}` | after every step (`step` is the step's index, from 0) |
//! | `{"eval": {"step", "bpb", "ema_bpb"}}` | after each evaluation (`step`: steps done): held-out bits per byte of the model and of its EMA teacher |

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::baselines::Baselines;
use crate::data::Corpus;
use crate::train::{RunError, StepLog, Trainer, bits_per_byte};

/// How often a run stops to evaluate and to save (0: only at the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub eval_every: u64,
    pub save_every: u64,
}

/// Held-out bits per byte at one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Steps done when it was made.
    pub step: u64,
    /// The model's.
    pub bpb: f64,
    /// The EMA teacher's.
    pub ema_bpb: f64,
}

/// What the caller hears as the run goes.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// Step `entry.step` (from 0) is done, `done` steps in all; `tokens_per_s` is the rate
    /// since this call started.
    Step {
        entry: &'a StepLog,
        done: u64,
        tokens_per_s: f64,
    },
    Evaluated(&'a Evaluation),
    /// The run was saved at `step` (the last save of the run included).
    Saved {
        step: u64,
    },
}

/// The run's JSONL log, or none.
pub struct TrainLog(Option<File>);

impl TrainLog {
    /// Appends to `path` (created if missing).
    pub fn append_to(path: &Path) -> std::io::Result<TrainLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(TrainLog(Some(file)))
    }

    /// A log that writes nothing.
    pub fn none() -> TrainLog {
        TrainLog(None)
    }

    pub fn startup(&mut self, seconds: f64) -> std::io::Result<()> {
        self.line(json!({ "startup_s": seconds }))
    }

    pub fn baselines(&mut self, b: &Baselines) -> std::io::Result<()> {
        self.line(json!({ "baselines": b }))
    }

    fn step(&mut self, entry: &StepLog, tokens_per_s: f64) -> std::io::Result<()> {
        self.line(json!({
            "step": entry.step, "loss": entry.loss, "lr": entry.lr,
            "grad_norm": entry.grad_norm, "tokens_per_s": tokens_per_s,
        }))
    }

    fn eval(&mut self, e: &Evaluation) -> std::io::Result<()> {
        self.line(json!({ "eval": { "step": e.step, "bpb": e.bpb, "ema_bpb": e.ema_bpb } }))
    }

    fn line(&mut self, value: serde_json::Value) -> std::io::Result<()> {
        match &mut self.0 {
            Some(file) => writeln!(file, "{value}"),
            None => Ok(()),
        }
    }
}

/// Held-out bits per byte of the model and of its EMA teacher now.
pub fn evaluate(trainer: &Trainer, corpus: &Corpus) -> Result<Evaluation, RunError> {
    let seq = trainer.settings.seq;
    // The teacher averages the model's parameters; an --engram-ram run's host rows have no
    // average of their own, so the teacher reads the current ones.
    let host = trainer.host.as_ref();
    Ok(Evaluation {
        step: trainer.step,
        bpb: bits_per_byte(&trainer.model, host, corpus.held_out(), seq)?,
        ema_bpb: bits_per_byte(&trainer.teacher()?, host, corpus.held_out(), seq)?,
    })
}

/// Trains from `trainer.step` to its last step, evaluating and saving (to `checkpoint`) as
/// `schedule` says and once more at the end. A diverged loss stops the run with the last good
/// checkpoint kept ([`RunError::Diverged`]).
pub fn run_to_end(
    trainer: &mut Trainer,
    corpus: &Corpus,
    schedule: Schedule,
    checkpoint: &Path,
    log: &mut TrainLog,
    mut on: impl FnMut(RunEvent<'_>),
) -> Result<(), RunError> {
    let s = trainer.settings.clone();
    let started = Instant::now();
    let first = trainer.step;
    let due = |every: u64, step: u64| every > 0 && step.is_multiple_of(every) && step < s.steps;
    while trainer.step < s.steps {
        let entry = trainer.train_step(corpus)?;
        let tokens = (trainer.step - first) as f64 * (s.batch * s.seq) as f64;
        let tokens_per_s = tokens / started.elapsed().as_secs_f64().max(1e-9);
        log.step(&entry, tokens_per_s).map_err(RunError::Log)?;
        on(RunEvent::Step {
            entry: &entry,
            done: trainer.step,
            tokens_per_s,
        });
        if due(schedule.eval_every, trainer.step) {
            evaluated(trainer, corpus, log, &mut on)?;
        }
        if due(schedule.save_every, trainer.step) {
            trainer.save(checkpoint)?;
            on(RunEvent::Saved { step: trainer.step });
        }
    }
    evaluated(trainer, corpus, log, &mut on)?;
    trainer.save(checkpoint)?;
    on(RunEvent::Saved { step: trainer.step });
    Ok(())
}

fn evaluated(
    trainer: &Trainer,
    corpus: &Corpus,
    log: &mut TrainLog,
    on: &mut impl FnMut(RunEvent<'_>),
) -> Result<(), RunError> {
    let evaluation = evaluate(trainer, corpus)?;
    log.eval(&evaluation).map_err(RunError::Log)?;
    on(RunEvent::Evaluated(&evaluation));
    Ok(())
}
