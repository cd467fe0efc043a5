//! What a streamed run reads its routed experts with: the artifact, the cache of loaded
//! experts, how many reads may be in flight, and where each streamed layer's experts are.

use crate::artifact::Artifact;
use crate::experts::ExpertCache;
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
}

impl ExpertStream<'_> {
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
}
