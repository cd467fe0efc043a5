//! A model of any architecture this build runs, behind one type: [`Model`] decodes with caches
//! of its own kind ([`ModelCache`]), whichever architecture built it.

use std::any::Any;

use crate::engine::decoder::Decoder;
use minirun_stream::step::{ModelError, StepStats};

/// A model built from an artifact (see [`crate::registry`]).
pub struct Model<'a>(Box<dyn Decoder<Cache = ModelCache> + Send + Sync + 'a>);

/// A [`Model`]'s cache: the architecture's own, refused by a model of another one.
pub struct ModelCache(Box<dyn Any + Send>);

impl<'a> Model<'a> {
    pub(crate) fn new<D>(decoder: D) -> Model<'a>
    where
        D: Decoder + Send + Sync + 'a,
        D::Cache: Send + 'static,
    {
        Model(Box::new(Erased(decoder)))
    }
}

impl Decoder for Model<'_> {
    type Cache = ModelCache;

    fn new_cache(&self) -> ModelCache {
        self.0.new_cache()
    }

    fn cached(&self, cache: &ModelCache) -> usize {
        self.0.cached(cache)
    }

    fn max_positions(&self) -> usize {
        self.0.max_positions()
    }

    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.0.step_batch(tokens, caches, stats)
    }

    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.0.prefill_batch(prompts, caches, stats)
    }

    fn expert_memory(&self) -> Option<(u64, u64)> {
        self.0.expert_memory()
    }

    fn layer_pool_peak(&self) -> u64 {
        self.0.layer_pool_peak()
    }
}

/// A decoder whose caches travel as [`ModelCache`]s.
struct Erased<D>(D);

impl<D> Erased<D>
where
    D: Decoder,
    D::Cache: Send + 'static,
{
    /// The decoder's own caches inside `caches`, refused if any is another kind's.
    fn own<'c>(caches: &'c mut [&mut ModelCache]) -> Result<Vec<&'c mut D::Cache>, ModelError> {
        caches
            .iter_mut()
            .map(|c| {
                c.0.downcast_mut::<D::Cache>()
                    .ok_or(ModelError::ForeignCache)
            })
            .collect()
    }
}

impl<D> Decoder for Erased<D>
where
    D: Decoder,
    D::Cache: Send + 'static,
{
    type Cache = ModelCache;

    fn new_cache(&self) -> ModelCache {
        ModelCache(Box::new(self.0.new_cache()))
    }

    /// Positions the cache holds (0 for another architecture's cache, which every step refuses).
    fn cached(&self, cache: &ModelCache) -> usize {
        cache
            .0
            .downcast_ref::<D::Cache>()
            .map_or(0, |c| self.0.cached(c))
    }

    fn max_positions(&self) -> usize {
        self.0.max_positions()
    }

    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut own = Self::own(caches)?;
        self.0.step_batch(tokens, &mut own, stats)
    }

    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut ModelCache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut own = Self::own(caches)?;
        self.0.prefill_batch(prompts, &mut own, stats)
    }

    fn expert_memory(&self) -> Option<(u64, u64)> {
        self.0.expert_memory()
    }

    fn layer_pool_peak(&self) -> u64 {
        self.0.layer_pool_peak()
    }
}
