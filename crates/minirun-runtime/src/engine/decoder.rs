//! What a run asks of a model: a [`Decoder`] runs tokens through its cache of what it has seen.

use minirun_stream::step::{ModelError, StepStats};

/// A model that turns tokens into next-token logits through a cache of what it has seen.
pub trait Decoder {
    type Cache;

    fn new_cache(&self) -> Self::Cache;

    /// Positions the cache holds.
    fn cached(&self, cache: &Self::Cache) -> usize;

    /// The most positions a cache may hold.
    fn max_positions(&self) -> usize;

    /// Runs `tokens` at the next positions of `cache`, returning the logits of the last: the
    /// one prompt of [`Decoder::prefill_batch`].
    fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>, ModelError> {
        let mut one = [cache];
        let mut last = self.prefill_batch(&[tokens], &mut one, stats)?;
        Ok(last.pop().unwrap_or_default())
    }

    /// Runs `token` at the next position of `cache`, returning the logits.
    fn step(
        &self,
        token: u32,
        cache: &mut Self::Cache,
        stats: &mut StepStats,
    ) -> Result<Vec<f32>, ModelError> {
        self.prefill(&[token], cache, stats)
    }

    /// Runs `tokens[i]` at the next position of `caches[i]`, one token for each of several
    /// sequences, as one batch (each weight read once for all), returning each one's logits:
    /// bit for bit what [`Decoder::step`] gives each alone. On an error no cache is to be used
    /// again.
    fn step_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Self::Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// Runs `prompts[i]` at the next positions of `caches[i]`, all their positions as the rows
    /// of shared passes, returning each one's last logits: every position gets the bits
    /// stepping through its prompt one token at a time gives it. On an error no cache is to be
    /// used again.
    fn prefill_batch(
        &self,
        prompts: &[&[u32]],
        caches: &mut [&mut Self::Cache],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// Bytes of routed experts the expert cache holds now, and the most it held at once;
    /// `None` for a resident run.
    fn expert_memory(&self) -> Option<(u64, u64)>;

    /// The most bytes of streamed layer matrices held at once so far (0 where no layer
    /// streams): within the plan's `layer_pool_bytes`.
    fn layer_pool_peak(&self) -> u64;
}
