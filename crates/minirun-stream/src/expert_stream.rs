//! What a streamed run reads its routed experts with: the artifact, the cache of loaded
//! experts, how many reads may be in flight, where each streamed layer's experts are, and the
//! reads started ahead on a guess of a layer's choice.

use std::sync::{Arc, Mutex};
use std::thread::Scope;

use crate::artifact::Artifact;
use crate::experts::{ExpertCache, ReadControl};
use crate::guessed_experts::{Guess, GuessRecord, Settled};
use crate::model_weights::ExpertMap;

/// The routed experts a streamed run reads from storage when the router picks them.
pub struct ExpertStream<'a> {
    pub artifact: &'a Artifact,
    pub cache: ExpertCache,
    /// Threads reading a layer's chosen experts.
    pub reads_in_flight: usize,
    /// Experts loaded at once: one token's of a layer (the plan's slot pool).
    pub slots: usize,
    /// Where every streamed layer's experts are (`None` for a layer that holds them).
    pub map: ExpertMap,
    /// Streamed layers whose experts may be read ahead on a guess at once (the plan's
    /// `guessed_layers`): each takes at most one slot pool.
    pub guessed_layers: usize,
    pub guessing: Mutex<Guessing>,
}

/// The guesses of a streamed run.
#[derive(Default)]
pub struct Guessing {
    /// Guesses whose layer has not run yet.
    open: Vec<Guess>,
    /// The step's guesses that ended, for the bytes they read once their reads are done.
    ended: Vec<Arc<ReadControl>>,
    /// Per layer, how often its guesses were right lately.
    records: Vec<GuessRecord>,
}

impl Guessing {
    fn record(&mut self, layer: usize) -> &mut GuessRecord {
        if self.records.len() <= layer {
            self.records.resize(layer + 1, GuessRecord::default());
        }
        &mut self.records[layer]
    }
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
    pub fn streams(&self, layer: usize) -> bool {
        matches!(self.map.get(layer), Some(Some(_)))
    }

    /// Whether `layer`'s guesses are right often enough to guess it this step (see
    /// [`GuessRecord`]); asked once a step.
    pub fn worth_guessing(&self, layer: usize) -> bool {
        self.guessing
            .lock()
            .is_ok_and(|mut g| g.record(layer).worth_guessing())
    }

    /// Guesses whose layer has not run yet.
    pub fn outstanding_guesses(&self) -> usize {
        self.guessing.lock().map_or(0, |g| g.open.len())
    }

    /// Starts reading `experts` of `layer` (most likely first) on threads of `scope`, leaving
    /// out the ones the cache holds; nothing when none is left.
    pub fn start_guess<'s>(&self, scope: &'s Scope<'s, '_>, layer: usize, experts: &[usize])
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
        if let Ok(mut g) = self.guessing.lock() {
            g.open.push(guess);
        }
    }

    /// The guess for `layer`, settled once its router chose `chosen` (see [`Guess::settle`]);
    /// `None` when there was none.
    pub fn settle_guess(&self, layer: usize, chosen: &[usize]) -> Option<Settled> {
        let mut g = self.guessing.lock().ok()?;
        let at = g.open.iter().position(|guess| guess.layer == layer)?;
        let (settled, control) = g.open.swap_remove(at).settle(chosen);
        g.record(layer).settled(settled.guessed, settled.right);
        g.ended.push(control);
        Some(settled)
    }

    /// Stops every guess no layer took (a step that ended early).
    pub fn stop_guesses(&self) {
        if let Ok(mut g) = self.guessing.lock() {
            let open = std::mem::take(&mut g.open);
            let stopped = open.into_iter().map(|guess| guess.settle(&[]).1);
            g.ended.extend(stopped.collect::<Vec<_>>());
        }
    }

    /// Bytes the step's guesses read, once their readers are done (the step's scope joined
    /// them); forgets them.
    pub fn guessed_read_bytes(&self) -> u64 {
        self.guessing
            .lock()
            .map_or(0, |mut g| g.ended.drain(..).map(|c| c.read_bytes()).sum())
    }
}
