//! The one model every architecture runs as. An architecture says what its weights outside
//! the layers are, how one layer is built from a [`Weights`] handle, and how rows go through a
//! layer ([`Layered`]); [`LayeredModel`] does the rest once for all of them: holding or
//! streaming each layer as the plan says, the passes over the layers with their reads, and the
//! decode policy ([`crate::engine::decode_policy`]).

use std::sync::Arc;

use crate::engine::config::ModelConfig;
use crate::engine::decode_policy::{
    LayerState, Logits, PREFILL_CHUNK, Place, Rows, SequenceCache, prefill_each, step_each,
};
use crate::engine::decoder::Decoder;
use minirun_stream::artifact::{Artifact, ArtifactError};
use minirun_stream::expert_stream::ExpertStream;
use minirun_stream::layer_stream::LayerStream;
use minirun_stream::model_weights::ModelWeights;
use minirun_stream::plan::{Plan, Shape};
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::{Placement, Weights};

/// One architecture: its weights outside the layers and what its passes need beside them
/// (`Self`), its layers, its cache.
pub trait Layered<'a>: Sized + Send + Sync {
    type Config: ModelConfig + Shape + Clone + Send + Sync + 'static;
    /// One layer's weights, built from a handle (held for the run, or for one step).
    type Layer<'w>: Send + Sync;
    /// One layer's part of a sequence's cache.
    type LayerCache: LayerState + Send + 'static;
    /// The rows' state between layers (the residual stream, and whatever else a layer hands
    /// the next).
    type Hidden;

    /// The weights outside the layers: the tables (embedding, head) asked for with
    /// [`Weights::table`], held or read by rows as the plan says; every other weight held. Run
    /// dry, this is what the planner learns the tables from.
    fn new(config: Self::Config, w: &Weights<'a>) -> Result<Self, ArtifactError>;

    fn config(&self) -> &Self::Config;

    /// Layer `i` from `w`: every tensor asked for once, by name, its matrices in the order
    /// [`Self::run_layer`] computes with them (a streamed layer reads them in that order, one
    /// ahead of the compute; one asked for out of it is read twice, which the streaming tests
    /// catch). Run dry, this is what the planner learns the layer's weights from.
    fn layer<'w>(
        config: &Self::Config,
        w: &Weights<'w>,
        i: usize,
    ) -> Result<Self::Layer<'w>, ArtifactError>;

    fn new_cache(&self) -> SequenceCache<Self::LayerCache>;

    /// The rows' state before the first layer.
    fn embed(&self, tokens: &[u32], stats: &mut StepStats) -> Result<Self::Hidden, ModelError>;

    /// Every row through one layer; row `r` is at `at.rows.position[r]` of
    /// `caches[at.rows.cache[r]]`.
    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &self,
        layer: &Self::Layer<'_>,
        at: Place,
        tokens: &[u32],
        hidden: &mut Self::Hidden,
        caches: &mut [&mut SequenceCache<Self::LayerCache>],
        stats: &mut StepStats,
    ) -> Result<(), ModelError>;

    /// The routed experts layer `i` would choose for the one row of `hidden` if its router met
    /// that state now, most likely first: a guess to read them ahead with while the layers
    /// before `i` compute ([`minirun_stream::guessed_experts`]). `None` where the layer routes no experts
    /// or the architecture does not guess. Any answer is safe: a wrong guess costs a read,
    /// never a result.
    fn guess_experts(
        &self,
        _layer: &Self::Layer<'_>,
        _i: usize,
        _tokens: &[u32],
        _hidden: &Self::Hidden,
    ) -> Option<Vec<usize>> {
        None
    }

    /// Whether [`Self::guess_experts`] for layer `i` is its router's choice itself, whatever
    /// state it is given (a layer that routes by the token alone): such a layer is guessed as
    /// early as the plan's room for guesses lets it.
    fn guesses_exactly(&self, _layer: &Self::Layer<'_>, _i: usize) -> bool {
        false
    }

    /// The logits of rows `wanted`, after the last layer.
    fn logits(
        &self,
        hidden: &Self::Hidden,
        wanted: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// What every layer and the weights outside them ask for, recorded without a payload byte
    /// read.
    fn record(
        config: &Self::Config,
        artifact: &'a Artifact,
    ) -> Result<ModelWeights, ArtifactError> {
        let mut weights = ModelWeights::record(artifact, config.layer_count(), |w, i| {
            Self::layer(config, w, i).map(drop)
        })?;
        weights.record_outside(artifact, |w| Self::new(config.clone(), w).map(drop))?;
        Ok(weights)
    }
}

/// An architecture's model: its layers held or streamed as a plan says.
pub struct LayeredModel<'a, A: Layered<'a>> {
    arch: A,
    artifact: &'a Artifact,
    /// Every layer, its deterministic matrices held for the run or, where the plan streams
    /// them, read by `stream` in each pass when the layer computes with them.
    layers: Vec<Box<A::Layer<'a>>>,
    stream: Arc<LayerStream<'a>>,
    experts: Option<Arc<ExpertStream<'a>>>,
}

impl<'a, A: Layered<'a>> LayeredModel<'a, A> {
    /// The model with every weight resident.
    pub fn load(artifact: &'a Artifact, config: A::Config) -> Result<Self, ModelError> {
        let layers = config.layer_count();
        Self::build(artifact, config, Placement::resident(layers))
    }

    /// The model as `plan` says: fully resident, or the routed experts of `plan.held_layers`
    /// read now and held, the others' streamed through a cache of `plan.cache_bytes`, and the
    /// deterministic weights of `plan.streamed_layers` read for each step. `weights` is what
    /// the plan was made from.
    pub fn load_planned(
        artifact: &'a Artifact,
        config: A::Config,
        plan: &Plan,
        weights: &ModelWeights,
    ) -> Result<Self, ModelError> {
        Self::build(artifact, config, Placement::of(artifact, plan, weights))
    }

    fn build(
        artifact: &'a Artifact,
        config: A::Config,
        placement: Placement<'a>,
    ) -> Result<Self, ModelError> {
        let count = config.layer_count();
        if placement.streamed_layers.len() != count {
            return Err(ModelError::Artifact(ArtifactError::Tensor {
                name: "the plan's layers".into(),
                reason: format!(
                    "number {}, the config's {count}: plan the model with its own config",
                    placement.streamed_layers.len()
                ),
            }));
        }
        let experts = placement.experts;
        let stream = Arc::new(LayerStream::new(
            artifact,
            placement.streamed_layers,
            placement.layer_pool_bytes,
            placement.read_ahead,
            placement.reads_in_flight,
        ));
        let layers = (0..count)
            .map(|i| {
                let w = match stream.is_streamed(i) {
                    true => Weights::streamed(artifact, Arc::clone(&stream), i, experts.clone()),
                    false => Weights::resident(artifact, Some(i), experts.clone()),
                };
                Ok(Box::new(A::layer(&config, &w, i)?))
            })
            .collect::<Result<Vec<_>, ArtifactError>>()?;
        let arch = A::new(
            config,
            &Weights::outside_layers(artifact, Arc::clone(&placement.tables)),
        )?;
        if let Some(stream) = &experts {
            stream.prepare_cache(minirun_stream::budget::preparable_memory());
        }
        Ok(LayeredModel {
            arch,
            artifact,
            layers,
            stream,
            experts,
        })
    }

    /// What every layer of the model asks for, recorded without a payload byte read: what a
    /// plan is made from.
    pub fn weights(
        artifact: &'a Artifact,
        config: &A::Config,
    ) -> Result<ModelWeights, ArtifactError> {
        A::record(config, artifact)
    }

    pub fn config(&self) -> &A::Config {
        self.arch.config()
    }

    /// Streamed matrices already read for the next step (read-ahead reads the first ones
    /// while a step's last layers and logits compute).
    pub fn matrices_read_for_next_step(&self) -> usize {
        self.stream.read_for_next_pass()
    }

    fn limits(&self) -> (usize, usize) {
        let c = self.arch.config();
        (c.vocab_size(), c.max_positions())
    }

    /// `tokens` through every layer, row `r` at `rows.position[r]` of `caches[rows.cache[r]]`;
    /// the logits `logits` asks for.
    fn forward_rows(
        &self,
        tokens: &[u32],
        rows: &Rows,
        caches: &mut [&mut SequenceCache<A::LayerCache>],
        logits: Logits,
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let started = std::time::Instant::now();
        let busy_before = self.artifact.read_busy();
        let hidden = self.arch.embed(tokens, stats)?;
        stats.read_busy += self.artifact.read_busy().saturating_sub(busy_before);
        stats.outside_layers += started.elapsed();
        let mut state = (hidden, caches);
        let mut tried = vec![false; self.layers.len()];
        let out = std::thread::scope(|scope| {
            let out = self.stream.run(
                &mut state,
                stats,
                |(hidden, caches), i, stats| {
                    self.guess_ahead(scope, i, tokens, hidden, &mut tried);
                    let at = Place { layer: i, rows };
                    let layer = self.layers.get(i).ok_or_else(|| {
                        ModelError::Artifact(ArtifactError::Tensor {
                            name: format!("layer {i}"),
                            reason: "is not among the model's layers".into(),
                        })
                    })?;
                    self.arch
                        .run_layer(layer, at, tokens, hidden, caches, stats)
                },
                |(hidden, caches), stats| {
                    for &seq in &rows.cache {
                        caches[seq].len += 1;
                    }
                    let wanted = logits.rows(tokens.len());
                    if wanted.is_empty() {
                        return Ok(Vec::new());
                    }
                    let started = std::time::Instant::now();
                    let out = self.arch.logits(hidden, &wanted, stats);
                    stats.outside_layers += started.elapsed();
                    out.and_then(refuse_non_finite)
                },
            );
            if let Some(stream) = &self.experts {
                stream.stop_guesses();
            }
            out
        });
        if let Some(stream) = &self.experts {
            stats.expert_guess_read_bytes += stream.guessed_read_bytes();
        }
        out
    }

    /// Before layer `i` of a one-row step: starts reading ahead, on a guess from the row's
    /// state now, the experts of the next layers that stream theirs, in layer order, while the
    /// plan has room for another guess: layer `i` itself and the next `guessed_layers - 1`
    /// layers, and a layer further on only where its guess is exact (it routes by the token).
    /// A router-driven layer further on is not guessed from here: its router, applied to a
    /// state that many layers earlier, picks too few of its choices to pay for the reads
    /// (docs/runtime.md has the figures), nor one whose guesses were wrong too often lately
    /// ([`minirun_stream::guessed_experts::GuessRecord`]). Each layer is guessed once a step, from the
    /// earliest state; one whose deterministic weights stream is not guessed.
    fn guess_ahead<'s>(
        &self,
        scope: &'s std::thread::Scope<'s, '_>,
        i: usize,
        tokens: &[u32],
        hidden: &A::Hidden,
        tried: &mut [bool],
    ) where
        'a: 's,
    {
        let Some(stream) = &self.experts else {
            return;
        };
        if tokens.len() != 1 || stream.guessed_layers == 0 {
            return;
        }
        let mut outstanding = stream.outstanding_guesses();
        for m in (i..self.layers.len()).filter(|&m| stream.streams(m)) {
            if outstanding >= stream.guessed_layers {
                return;
            }
            if tried[m] {
                continue;
            }
            let Some(layer) = self.layers.get(m).filter(|_| !self.stream.is_streamed(m)) else {
                return;
            };
            let exact = self.arch.guesses_exactly(layer, m);
            if m >= i + stream.guessed_layers && !exact {
                return;
            }
            tried[m] = true;
            if !exact && !stream.worth_guessing(m) {
                continue;
            }
            if let Some(experts) = self.arch.guess_experts(layer, m, tokens, hidden) {
                stream.start_guess(scope, m, &experts);
                outstanding += 1;
            }
        }
    }
}

impl<'a, A: Layered<'a>> Decoder for LayeredModel<'a, A> {
    type Cache = SequenceCache<A::LayerCache>;

    fn new_cache(&self) -> SequenceCache<A::LayerCache> {
        self.arch.new_cache()
    }

    fn cached(&self, cache: &SequenceCache<A::LayerCache>) -> usize {
        cache.len
    }

    fn max_positions(&self) -> usize {
        self.arch.config().max_positions()
    }

    /// Every sequence's token as one row of one batch through every layer: each matrix, and
    /// each streamed layer and expert, is read once for all the rows, and each row gets the
    /// bits `step` gives it alone (rows compute independently; each reads its own cache).
    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut SequenceCache<A::LayerCache>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        step_each(tokens, caches, self.limits(), |rows, caches| {
            self.forward_rows(tokens, rows, caches, Logits::Every, stats)
        })
    }

    /// Every prompt's positions as the rows of shared passes of [`PREFILL_CHUNK`] rows, each
    /// row with the bits its own prefill gives it.
    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut SequenceCache<A::LayerCache>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (vocab, max_positions) = self.limits();
        let limits = (vocab, max_positions, PREFILL_CHUNK);
        prefill_each(prompts, caches, limits, |tokens, rows, caches, logits| {
            self.forward_rows(tokens, rows, caches, logits, stats)
        })
    }

    /// Bytes of routed experts the cache holds now, and the most it held at once with the
    /// experts of a layer in flight; `None` for a resident run (held layers are resident).
    fn expert_memory(&self) -> Option<(u64, u64)> {
        self.experts.as_ref().map(|e| e.usage())
    }

    fn layer_pool_peak(&self) -> u64 {
        self.stream.peak_bytes()
    }
}

/// A step's logits, refused where one is a NaN or an infinity: the weights or the config made
/// the model compute something a sampler must not pick from, and a plausible token picked from
/// it would hide that.
fn refuse_non_finite(rows: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, ModelError> {
    for logits in &rows {
        if let Some(token) = logits.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                token,
                value: logits[token],
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod non_finite_tests {
    use super::*;

    #[test]
    fn a_nan_or_an_infinite_logit_is_refused_by_token() {
        let fine = vec![vec![0.5, -3.0], vec![f32::MAX, f32::MIN]];
        assert_eq!(refuse_non_finite(fine.clone()).unwrap(), fine);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            match refuse_non_finite(vec![vec![0.0; 3], vec![0.0, 1.0, bad]]) {
                Err(ModelError::NonFinite { token: 2, value }) => {
                    assert_eq!(value.to_bits(), bad.to_bits())
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
