//! The decode loop: the prompt into the latent cache in chunks of positions (`prefill`), then sampling
//! (greedy, or seeded temperature + top-p) until `max_tokens` or an end-of-sequence token.

use std::time::{Duration, Instant};

use minirun_format::synthetic::SplitMix64;
use sha2::{Digest, Sha256};

use crate::engine::decoder::Decoder;
use minirun_stream::step::{ModelError, StepStats};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 is greedy (the first highest logit).
    pub temperature: f32,
    /// Nucleus: sample among the most likely tokens whose probabilities sum to `top_p`.
    pub top_p: f32,
    pub seed: u64,
}

/// The index of the first highest logit.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Picks tokens from logits as `sampling` says; a seed names one exact sequence of draws.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    /// SplitMix64 (minirun-format's): a seed names one exact continuation.
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Sampler {
        Sampler {
            sampling,
            rng: SplitMix64::new(sampling.seed),
        }
    }

    /// The next token: the first highest logit when greedy, else one draw from the nucleus.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let s = self.sampling;
        if s.temperature <= 0.0 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(f64, u32)> = logits
            .iter()
            .zip(0..)
            .map(|(&l, i)| (f64::from((l - max) / s.temperature).exp(), i))
            .collect();
        probs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let total: f64 = probs.iter().map(|p| p.0).sum();
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.0 / total;
            if kept >= f64::from(s.top_p) {
                cut = i + 1;
                break;
            }
        }
        let nucleus = &probs[..cut];
        let mass: f64 = nucleus.iter().map(|p| p.0).sum();
        // The top 53 bits as a uniform number in [0, 1).
        let unit = (self.rng.next().unwrap_or(0) >> 11) as f64 / (1u64 << 53) as f64;
        let mut target = unit * mass;
        for &(p, id) in nucleus {
            if target < p {
                return id;
            }
            target -= p;
        }
        nucleus[nucleus.len() - 1].1
    }
}

/// What one decode step cost.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StepRecord {
    /// Position of the token the step ran.
    pub position: usize,
    pub seconds: f64,
    /// Of which waiting for reads (experts, streamed layers, table rows).
    pub io_seconds: f64,
    /// Wall time at least one of the step's reads was in flight, hidden under compute or not.
    pub read_busy_seconds: f64,
    pub expert_read_bytes: u64,
    /// Deterministic weights of streamed layers read.
    pub layer_read_bytes: u64,
    /// Rows of the embedding and the head read.
    pub table_read_bytes: u64,
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    pub weight_bytes: u64,
}

/// Figures of one generation.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    /// Forward passes after the prompt (one per generated token but the last).
    pub decode_steps: usize,
    pub decode_time: Duration,
    /// Stored weight bytes read by the decode steps, summed.
    pub decode_weight_bytes: u64,
    /// The decode steps' figures of storage: expert bytes read, cache hits and misses, reads
    /// past and through the page cache, time waiting for reads.
    pub decode_io: StepStats,
    /// The prompt's expert reads, in the same terms.
    pub prompt_io: StepStats,
    pub steps: Vec<StepRecord>,
    pub stop_reason: StopReason,
    /// SHA-256 of the bits of every logits vector the generation computed (the prompt's last,
    /// then each step's, each as little-endian f32): two runs agree bit for bit exactly when
    /// these agree, even where greedy decoding repeats one token.
    pub logits_sha256: [u8; 32],
}

impl Figures {
    pub fn tokens_per_second(&self) -> f64 {
        self.decode_steps as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }

    pub fn weight_bytes_per_token(&self) -> u64 {
        self.decode_weight_bytes / (self.decode_steps as u64).max(1)
    }

    /// [`Figures::logits_sha256`] in lowercase hex.
    pub fn logits_sha256_hex(&self) -> String {
        minirun_format::tile::hex(&self.logits_sha256)
    }

    /// Routed-expert bytes read from storage per decode step.
    pub fn expert_read_bytes_per_token(&self) -> u64 {
        self.decode_io.expert_read_bytes / (self.decode_steps as u64).max(1)
    }

    /// Deterministic bytes of streamed layers read from storage per decode step.
    pub fn layer_read_bytes_per_token(&self) -> u64 {
        self.decode_io.layer_read_bytes / (self.decode_steps as u64).max(1)
    }

    /// Bytes of the embedding's and head's rows read from storage per decode step.
    pub fn table_read_bytes_per_token(&self) -> u64 {
        self.decode_io.table_read_bytes / (self.decode_steps as u64).max(1)
    }
}

/// Why generation stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    #[default]
    MaxTokens,
    /// A stop token was sampled; it is not part of the output.
    EndOfSequence,
    /// The next position would pass `max_position_embeddings`.
    ContextFull,
}

/// Runs `prompt` then generates up to `max_tokens`, calling `on_token` with each new id. A
/// sampled stop token ends generation and is not returned (as in mlx-lm). The decode time counts
/// the model's steps only, not the caller's `on_token`.
pub fn generate<D: Decoder>(
    model: &D,
    prompt: &[u32],
    max_tokens: usize,
    sampling: Sampling,
    stop: &[u32],
    mut on_token: impl FnMut(u32, Option<&StepRecord>),
) -> Result<(Vec<u32>, Figures), ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    let mut figures = Figures {
        prompt_tokens: prompt.len(),
        ..Figures::default()
    };
    let mut cache = model.new_cache();
    let mut sampler = Sampler::new(sampling);
    let started = Instant::now();
    let mut logits = model.prefill(prompt, &mut cache, &mut figures.prompt_io)?;
    figures.prompt_time = started.elapsed();
    let mut digest = Sha256::new();
    hash_bits(&mut digest, &logits);
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let token = sampler.sample(&logits);
        if stop.contains(&token) {
            figures.stop_reason = StopReason::EndOfSequence;
            break;
        }
        out.push(token);
        on_token(token, figures.steps.last());
        if out.len() == max_tokens {
            break;
        }
        if model.cached(&cache) >= model.max_positions() {
            figures.stop_reason = StopReason::ContextFull;
            break;
        }
        let mut stats = StepStats::default();
        let step = Instant::now();
        let position = model.cached(&cache);
        logits = model.step(token, &mut cache, &mut stats)?;
        let seconds = step.elapsed();
        hash_bits(&mut digest, &logits);
        figures.decode_time += seconds;
        figures.decode_weight_bytes += stats.weight_bytes;
        figures.decode_steps += 1;
        figures.decode_io.add(&stats);
        figures.steps.push(StepRecord {
            position,
            seconds: seconds.as_secs_f64(),
            io_seconds: stats.io_time.as_secs_f64(),
            read_busy_seconds: stats.read_busy.as_secs_f64(),
            expert_read_bytes: stats.expert_read_bytes,
            layer_read_bytes: stats.layer_read_bytes,
            table_read_bytes: stats.table_read_bytes,
            expert_cache_hits: stats.expert_cache_hits,
            expert_cache_misses: stats.expert_cache_misses,
            weight_bytes: stats.weight_bytes,
        });
    }
    figures.generated_tokens = out.len();
    figures.logits_sha256 = digest.finalize().into();
    Ok((out, figures))
}

/// Feeds the logits' little-endian bytes to `digest` through a small stack buffer, so a step
/// allocates nothing for its digest whatever the vocabulary.
fn hash_bits(digest: &mut Sha256, logits: &[f32]) {
    let mut bytes = [0u8; 4096];
    for chunk in logits.chunks(bytes.len() / 4) {
        for (out, value) in bytes.chunks_exact_mut(4).zip(chunk) {
            out.copy_from_slice(&value.to_le_bytes());
        }
        digest.update(&bytes[..chunk.len() * 4]);
    }
}
