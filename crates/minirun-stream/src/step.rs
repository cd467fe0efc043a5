//! What a step reports: why it failed ([`ModelError`]) and what it read ([`StepStats`]).

use std::time::Duration;

use crate::artifact::ArtifactError;
use minirun_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("token id {0} is outside the vocabulary of {1}")]
    Token(u32, usize),
    #[error("position {0} is past max_position_embeddings {1}")]
    Position(usize, usize),
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error(
        "this cache was left part-way through a step by an earlier error (its recurrent state is not that of any prefix); start a new generation"
    )]
    BrokenCache,
    #[error("this cache was made by a model of another architecture")]
    ForeignCache,
    #[error("a batch step was given {tokens} tokens for {caches} caches: one token per cache")]
    BatchShape { tokens: usize, caches: usize },
    #[error(
        "the step computed a logit of {value} (token id {token}): the weights or config.json make this model compute NaN or infinity, so no token is picked from it"
    )]
    NonFinite { token: usize, value: f32 },
}

/// What one step read, for the run's figures.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepStats {
    /// Stored weight bytes the step's products read (an embedding row counts its row).
    pub weight_bytes: u64,
    /// Routed-expert bytes read from storage (cache misses).
    pub expert_read_bytes: u64,
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    /// Experts read ahead on a guess of a router's choice (see [`crate::guessed_experts`]),
    /// those of them the router chose, those of these computed from the guess's read (each also
    /// a cache miss, its bytes in `expert_read_bytes`; all of the chosen unless a read failed)
    /// and their bytes, and every byte the guesses read.
    pub expert_guessed: u64,
    pub expert_guess_right: u64,
    pub expert_guess_hits: u64,
    pub expert_guess_hit_bytes: u64,
    pub expert_guess_read_bytes: u64,
    /// Deterministic weights of streamed layers read from storage.
    pub layer_read_bytes: u64,
    /// Streamed matrices read a second time in a pass (asked for after the pass let them go):
    /// 0 where a model asks for its matrices in the order it was built with.
    pub layer_rereads: u64,
    /// Rows of the tables outside the layers (embedding, head) read from storage.
    pub table_read_bytes: u64,
    /// Reads that bypassed the page cache (`O_DIRECT`) and reads that went through it.
    pub direct_reads: u64,
    pub buffered_reads: u64,
    /// Wall time the step waited for reads (experts, streamed layers, table rows).
    pub io_time: Duration,
    /// Wall time during which at least one of the step's reads was in flight (overlapping
    /// reads count once): the I/O the step needed, whether or not compute hid it.
    pub read_busy: Duration,
    /// Wall time outside the layers: the embedding before them and the logits after them.
    /// What is left of a step is the layers' (benchmarks extrapolate a model's time per token
    /// to more layers from it).
    pub outside_layers: Duration,
}

impl StepStats {
    /// Bytes the guesses read that no expert computed from.
    pub fn expert_guess_wasted_bytes(&self) -> u64 {
        self.expert_guess_read_bytes
            .saturating_sub(self.expert_guess_hit_bytes)
    }

    /// Adds what `other` read.
    pub fn add(&mut self, other: &StepStats) {
        self.weight_bytes += other.weight_bytes;
        self.expert_read_bytes += other.expert_read_bytes;
        self.layer_read_bytes += other.layer_read_bytes;
        self.layer_rereads += other.layer_rereads;
        self.table_read_bytes += other.table_read_bytes;
        self.expert_cache_hits += other.expert_cache_hits;
        self.expert_cache_misses += other.expert_cache_misses;
        self.expert_guessed += other.expert_guessed;
        self.expert_guess_right += other.expert_guess_right;
        self.expert_guess_hits += other.expert_guess_hits;
        self.expert_guess_hit_bytes += other.expert_guess_hit_bytes;
        self.expert_guess_read_bytes += other.expert_guess_read_bytes;
        self.direct_reads += other.direct_reads;
        self.buffered_reads += other.buffered_reads;
        self.io_time += other.io_time;
        self.read_busy += other.read_busy;
        self.outside_layers += other.outside_layers;
    }
}
