//! Choosing the next byte (greedy, or seeded sampling with temperature, top-k and top-p) and
//! generating a continuation incrementally with the KV cache.

use std::ops::ControlFlow;

use candle_core::{Result, Tensor};

use crate::model::{Dormouse, KvCache};
use crate::train::SplitMix64;

/// How the next byte is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (the most likely byte); otherwise logits are divided by it.
    pub temperature: f64,
    /// Keep only the `k` most likely bytes (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely bytes whose probability reaches `p` (1: all).
    pub top_p: f64,
    /// Seed of the sampling draws.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Why sampling parameters are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0 (0 is greedy), not {0}")]
    Temperature(f64),
    #[error("top_p must be in (0, 1], not {0}")]
    TopP(f64),
}

impl SamplingParams {
    pub fn validate(&self) -> std::result::Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }
}

/// Draws bytes from logits; one seeded generator per generation.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler {
            params,
            rng: SplitMix64::new(params.seed),
        }
    }

    /// The next byte for one position's 256 logits.
    pub fn next_byte(&mut self, logits: &[f32]) -> u8 {
        let p = self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Descending by logit, ties by byte value, so the draw is a pure function of the seed.
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let max = f64::from(logits[order[0]]);
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i]) - max) / p.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut kept = 0;
        let mut mass = 0.0;
        for w in &weights {
            kept += 1;
            mass += w / total;
            if mass >= p.top_p {
                break;
            }
        }
        let kept_total: f64 = weights[..kept].iter().sum();
        let mut target = self.rng.next_f64() * kept_total;
        for (w, &i) in weights[..kept].iter().zip(&order) {
            if target < *w {
                return i as u8;
            }
            target -= w;
        }
        order[kept - 1] as u8
    }
}

/// The index of the largest logit (the lowest byte among equals).
pub fn argmax(logits: &[f32]) -> u8 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u8
}

/// The logits of the last position, as a vector.
fn last_logits(logits: &Tensor) -> Result<Vec<f32>> {
    let t = logits.dim(1)?;
    logits
        .narrow(1, t - 1, 1)?
        .squeeze(1)?
        .squeeze(0)?
        .to_vec1::<f32>()
}

/// Continues `prompt` by up to `max_new` bytes, calling `on_byte` with each as it is chosen
/// (return `ControlFlow::Break` to stop). Uses the KV cache; when the context reaches the
/// model's `max_seq_len`, the cache is rebuilt from the last half of the context (the model
/// never attends past `max_seq_len`). Returns the number of bytes generated.
pub fn generate(
    model: &Dormouse,
    prompt: &[u8],
    max_new: usize,
    sampler: &mut Sampler,
    mut on_byte: impl FnMut(u8) -> ControlFlow<()>,
) -> Result<usize> {
    if prompt.is_empty() {
        candle_core::bail!("the prompt is empty: give at least one byte to continue");
    }
    let limit = model.config().max_seq_len;
    let keep = (limit / 2).max(1);
    let mut context: Vec<u8> = prompt.to_vec();
    let start = context.len().saturating_sub(limit);
    let mut cache = KvCache::new(model.config());
    let mut logits = last_logits(&model.forward(&[&context[start..]], Some(&mut cache))?)?;
    let mut produced = 0;
    while produced < max_new {
        let byte = sampler.next_byte(&logits);
        produced += 1;
        context.push(byte);
        if on_byte(byte).is_break() || produced == max_new {
            break;
        }
        if cache.position() + 1 > limit {
            cache = KvCache::new(model.config());
            let recent = &context[context.len() - keep.min(context.len())..];
            logits = last_logits(&model.forward(&[recent], Some(&mut cache))?)?;
        } else {
            logits = last_logits(&model.forward(&[&[byte]], Some(&mut cache))?)?;
        }
    }
    Ok(produced)
}
