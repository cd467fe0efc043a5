//! Several generations decoded together: each step runs every active sequence's next token
//! through the model at once ([`Decoder::step_batch`]), so a weight (and a streamed layer or
//! expert) is read once per step for all of them. Each sequence keeps its own cache, sampler
//! and stop rule, and gets exactly the tokens [`generate`](crate::session::generate::generate) gives it
//! alone: the same prompt pass, the same sampler draws, the same ends.

use crate::engine::decoder::Decoder;
use crate::session::generate::{Sampler, Sampling, StopReason};
use minirun_stream::step::{ModelError, StepStats};

/// One generation to run.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Ids that end the generation (not part of its output).
    pub stop: Vec<u32>,
}

/// What a sequence did in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A generated token.
    Token(u32),
    /// The generation ended; the sequence has left the batch.
    Finished(StopReason),
}

/// A step failed part-way: the caches of the sequences it ran are not those of any prefix, so
/// every one of them has left the batch.
#[derive(Debug, thiserror::Error)]
#[error("a batched decode step failed for {} sequence(s): {error}", ids.len())]
pub struct StepFailed {
    pub ids: Vec<u64>,
    pub error: ModelError,
}

struct Active<C> {
    id: u64,
    cache: C,
    sampler: Sampler,
    stop: Vec<u32>,
    max_tokens: usize,
    generated: usize,
    /// The token the next step runs.
    next: u32,
}

/// The sequences being decoded, in the order they were admitted.
pub struct Batch<'m, D: Decoder> {
    model: &'m D,
    active: Vec<Active<D::Cache>>,
}

impl<'m, D: Decoder> Batch<'m, D> {
    pub fn new(model: &'m D) -> Self {
        Batch {
            model,
            active: Vec::new(),
        }
    }

    /// Sequences still generating.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Runs `request`'s prompt and samples its first token. `on_event` hears what the sequence
    /// did and returns false when nobody listens any more (the sequence then leaves). A prompt
    /// the model refuses (empty, a bad id, too long) is refused here, and the batch is as it was.
    pub fn admit(
        &mut self,
        id: u64,
        request: Request,
        stats: &mut StepStats,
        mut on_event: impl FnMut(u64, Event) -> bool,
    ) -> Result<(), ModelError> {
        let mut cache = self.model.new_cache();
        let logits = self.model.prefill(&request.prompt, &mut cache, stats)?;
        self.start(id, request, cache, &logits, &mut on_event);
        Ok(())
    }

    /// Admits several requests at once, their prompts run as the rows of shared passes
    /// ([`Decoder::prefill_batch`]), each sampling its first token as [`Batch::admit`] does. If
    /// the shared prefill is refused, each request is admitted alone, so that only the ones the
    /// model refuses are refused; those come back with why.
    pub fn admit_all(
        &mut self,
        requests: Vec<(u64, Request)>,
        stats: &mut StepStats,
        mut on_event: impl FnMut(u64, Event) -> bool,
    ) -> Vec<(u64, ModelError)> {
        if requests.len() < 2 {
            return self.admit_each(requests, stats, &mut on_event);
        }
        let mut caches: Vec<D::Cache> = requests.iter().map(|_| self.model.new_cache()).collect();
        let prompts: Vec<&[u32]> = requests.iter().map(|(_, r)| r.prompt.as_slice()).collect();
        let mut refs: Vec<&mut D::Cache> = caches.iter_mut().collect();
        let logits = match self.model.prefill_batch(&prompts, &mut refs, stats) {
            Ok(logits) => logits,
            Err(_) => return self.admit_each(requests, stats, &mut on_event),
        };
        for (((id, request), cache), logits) in requests.into_iter().zip(caches).zip(&logits) {
            self.start(id, request, cache, logits, &mut on_event);
        }
        Vec::new()
    }

    fn admit_each(
        &mut self,
        requests: Vec<(u64, Request)>,
        stats: &mut StepStats,
        on_event: &mut impl FnMut(u64, Event) -> bool,
    ) -> Vec<(u64, ModelError)> {
        requests
            .into_iter()
            .filter_map(|(id, r)| {
                self.admit(id, r, stats, &mut *on_event)
                    .err()
                    .map(|e| (id, e))
            })
            .collect()
    }

    /// A prompted sequence samples its first token and, unless that ends it, joins the batch.
    fn start(
        &mut self,
        id: u64,
        request: Request,
        cache: D::Cache,
        logits: &[f32],
        on_event: &mut impl FnMut(u64, Event) -> bool,
    ) {
        let mut sequence = Active {
            id,
            cache,
            sampler: Sampler::new(request.sampling),
            stop: request.stop,
            max_tokens: request.max_tokens,
            generated: 0,
            next: 0,
        };
        if sequence.max_tokens == 0 {
            on_event(id, Event::Finished(StopReason::MaxTokens));
        } else if Self::advance(self.model, &mut sequence, logits, on_event) {
            self.active.push(sequence);
        }
    }

    /// One step for every active sequence, in one batch through the model.
    pub fn step(
        &mut self,
        stats: &mut StepStats,
        mut on_event: impl FnMut(u64, Event) -> bool,
    ) -> Result<(), StepFailed> {
        if self.active.is_empty() {
            return Ok(());
        }
        let tokens: Vec<u32> = self.active.iter().map(|s| s.next).collect();
        let mut caches: Vec<&mut D::Cache> = self.active.iter_mut().map(|s| &mut s.cache).collect();
        let logits = match self.model.step_batch(&tokens, &mut caches, stats) {
            Ok(logits) => logits,
            Err(error) => {
                let ids = self.active.drain(..).map(|s| s.id).collect();
                return Err(StepFailed { ids, error });
            }
        };
        let mut still = Vec::with_capacity(self.active.len());
        for (mut sequence, logits) in self.active.drain(..).zip(&logits) {
            if Self::advance(self.model, &mut sequence, logits, &mut on_event) {
                still.push(sequence);
            }
        }
        self.active = still;
        Ok(())
    }

    /// Drops the sequence `id` (its client went away); false if it was not generating.
    pub fn cancel(&mut self, id: u64) -> bool {
        let before = self.active.len();
        self.active.retain(|s| s.id != id);
        self.active.len() < before
    }

    /// Samples the sequence's next token from `logits` and says whether it goes on, with the
    /// ends [`generate`](crate::session::generate::generate) has, in its order.
    fn advance(
        model: &D,
        sequence: &mut Active<D::Cache>,
        logits: &[f32],
        on_event: &mut impl FnMut(u64, Event) -> bool,
    ) -> bool {
        let id = sequence.id;
        let token = sequence.sampler.sample(logits);
        if sequence.stop.contains(&token) {
            on_event(id, Event::Finished(StopReason::EndOfSequence));
            return false;
        }
        sequence.generated += 1;
        if !on_event(id, Event::Token(token)) {
            return false;
        }
        let end = if sequence.generated == sequence.max_tokens {
            Some(StopReason::MaxTokens)
        } else if model.cached(&sequence.cache) >= model.max_positions() {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        if let Some(reason) = end {
            on_event(id, Event::Finished(reason));
            return false;
        }
        sequence.next = token;
        true
    }
}
