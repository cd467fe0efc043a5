//! What a streamed run reads its routed experts with: the artifact, the cache of loaded
//! experts, how many reads may be in flight, where each streamed layer's experts are, and the
//! reads started ahead on a guess of a layer's choice.

use std::sync::Mutex;
use std::thread::Scope;

use crate::artifact::Artifact;
use crate::experts::ExpertCache;
use crate::experts::ReadControl;
use crate::guessed_experts::{Guess, GuessRecord, Settled};
use crate::model_weights::ExpertMap;

/// The routed experts a streamed run reads from storage when the router picks them.
pub struct ExpertStream<'a> {
    pub(crate) artifact: &'a Artifact,
    pub(crate) cache: ExpertCache,
    /// Threads reading a layer's chosen experts.
    pub(crate) reads_in_flight: usize,
    /// Experts loaded at once: one token's of a layer (the plan's slot pool).
    pub(crate) slots: usize,
    /// Where every streamed layer's experts are (`None` for a layer that holds them).
    pub(crate) map: ExpertMap,
    /// Streamed layers whose experts may be read ahead on a guess at once (the plan's
    /// `guessed_layers`): each takes at most one slot pool.
    pub(crate) guessed_layers: usize,
    pub(crate) guesses: Mutex<Vec<Guess>>,
    /// Per layer, how often its guesses were right lately.
    pub(crate) records: Mutex<Vec<GuessRecord>>,
    /// The step's guesses that ended, for the bytes they read once their reads are done.
    pub(crate) ended: Mutex<Vec<std::sync::Arc<ReadControl>>>,
}

impl<'a> ExpertStream<'a> {
    /// Makes the cache's buffers now (see [`ExpertCache::prepare`]), at most `limit` bytes:
    /// once the model's resident weights are in, so that what the memory then available says
    /// bounds it. Returns the bytes made.
    pub fn prepare_cache(&self, limit: u64) -> u64 {
        self.cache.prepare(self.artifact, &self.map, limit)
    }

    /// Bytes of routed experts the cache holds now, and the most it held at once.
    pub fn usage(&self) -> (u64, u64) {
        self.cache.usage()
    }

    /// Whether `layer`'s experts are streamed (not held).
    pub(crate) fn streams(&self, layer: usize) -> bool {
        matches!(self.map.get(layer), Some(Some(_)))
    }

    /// Whether `layer`'s guesses are right often enough to guess it this step (see
    /// [`GuessRecord`]); asked once a step.
    pub(crate) fn worth_guessing(&self, layer: usize) -> bool {
        let Ok(mut records) = self.records.lock() else {
            return false;
        };
        if records.len() <= layer {
            records.resize(layer + 1, GuessRecord::default());
        }
        records[layer].worth_guessing()
    }

    /// Guesses whose layer has not run yet.
    pub(crate) fn outstanding_guesses(&self) -> usize {
        self.guesses.lock().map(|g| g.len()).unwrap_or(0)
    }

    /// Starts reading `experts` of `layer` (most likely first) on threads of `scope`, leaving
    /// out the ones the cache holds; nothing when none is left.
    pub(crate) fn start_guess<'s>(&self, scope: &'s Scope<'s, '_>, layer: usize, experts: &[usize])
    where
        'a: 's,
    {
        let Some(Some(parts)) = self.map.get(layer) else {
            return;
        };
        let mut wanted: Vec<usize> = Vec::new();
        for &e in experts {
            if !wanted.contains(&e) && !self.cache.holds((layer, e)) {
                wanted.push(e);
            }
        }
        if wanted.is_empty() {
            return;
        }
        let guess = Guess::start(
            scope,
            self.artifact,
            layer,
            wanted,
            parts,
            self.reads_in_flight,
        );
        if let Ok(mut guesses) = self.guesses.lock() {
            guesses.push(guess);
        }
    }

    /// The guess for `layer`, settled once its router chose `chosen` (see [`Guess::settle`]);
    /// `None` when there was none.
    pub(crate) fn settle_guess(&self, layer: usize, chosen: &[usize]) -> Option<Settled> {
        let guess = {
            let mut guesses = self.guesses.lock().ok()?;
            let at = guesses.iter().position(|g| g.layer == layer)?;
            guesses.swap_remove(at)
        };
        let (settled, control) = guess.settle(chosen);
        if let Ok(mut records) = self.records.lock() {
            if records.len() <= layer {
                records.resize(layer + 1, GuessRecord::default());
            }
            records[layer].settled(settled.guessed, settled.right);
        }
        if let Ok(mut ended) = self.ended.lock() {
            ended.push(control);
        }
        Some(settled)
    }

    /// Stops every guess no layer took (a step that ended early).
    pub(crate) fn stop_guesses(&self) {
        let Ok(mut guesses) = self.guesses.lock() else {
            return;
        };
        for guess in guesses.drain(..) {
            let (_, control) = guess.settle(&[]);
            if let Ok(mut ended) = self.ended.lock() {
                ended.push(control);
            }
        }
    }

    /// Bytes the step's guesses read, once their readers are done (the step's scope joined
    /// them); forgets them.
    pub(crate) fn guessed_read_bytes(&self) -> u64 {
        self.ended
            .lock()
            .map(|mut ended| ended.drain(..).map(|c| c.read_bytes()).sum())
            .unwrap_or(0)
    }
}
