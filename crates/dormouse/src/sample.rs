//! Choosing the next byte (greedy, or seeded sampling with temperature, top-k and top-p) and
//! generating a continuation incrementally with the KV cache.

use std::ops::ControlFlow;

use candle_core::{Result, Tensor};

use crate::model::{Dormouse, KvCache};
use crate::rng::SplitMix64;

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
        let mut last_possible = order[0];
        for (w, &i) in weights[..kept].iter().zip(&order) {
            if *w > 0.0 {
                last_possible = i;
            }
            if target < *w {
                return i as u8;
            }
            target -= w;
        }
        // Rounding left a sliver of `target`: the last byte with any probability takes it.
        last_possible as u8
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

/// One sequence between bytes: every byte it has seen and its cache. Lone generation and
/// batched decoding ([`crate::batch`]) both move a sequence on through it, so they rebuild the
/// cache at the same bytes from the same context.
#[derive(Debug)]
pub(crate) struct Continuation {
    context: Vec<u8>,
    cache: KvCache,
}

impl Continuation {
    /// Runs `prompt` (its last `max_seq_len` bytes) and returns the sequence with the logits
    /// of its next byte.
    pub(crate) fn start(model: &Dormouse, prompt: &[u8]) -> Result<(Self, Vec<f32>)> {
        if prompt.is_empty() {
            candle_core::bail!("the prompt is empty: give at least one byte to continue");
        }
        let limit = model.config().max_seq_len;
        let start = prompt.len().saturating_sub(limit);
        let mut cache = KvCache::new(model.config());
        let logits = last_logits(&model.forward(&[&prompt[start..]], Some(&mut cache))?)?;
        let sequence = Continuation {
            context: prompt.to_vec(),
            cache,
        };
        Ok((sequence, logits))
    }

    /// Takes `byte` as the sequence's next byte; [`Continuation::next_logits`] (or a batched
    /// step of [`Continuation::cache_mut`] when the cache is not full) runs it.
    pub(crate) fn push(&mut self, byte: u8) {
        self.context.push(byte);
    }

    /// The byte pushed last.
    pub(crate) fn last_byte(&self) -> u8 {
        self.context.last().copied().unwrap_or_default()
    }

    /// True when the cache holds `max_seq_len` positions: the next byte cannot be stepped and
    /// the cache is rebuilt instead ([`Continuation::rebuild`]).
    pub(crate) fn is_full(&self, model: &Dormouse) -> bool {
        self.cache.position() + 1 > model.config().max_seq_len
    }

    /// A new cache from the last half of the context (the model never attends past
    /// `max_seq_len`), and the logits of the byte after it.
    pub(crate) fn rebuild(&mut self, model: &Dormouse) -> Result<Vec<f32>> {
        let keep = (model.config().max_seq_len / 2).max(1);
        self.cache = KvCache::new(model.config());
        let recent = &self.context[self.context.len() - keep.min(self.context.len())..];
        last_logits(&model.forward(&[recent], Some(&mut self.cache))?)
    }

    pub(crate) fn cache_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    /// The logits after the byte pushed last, run alone.
    fn next_logits(&mut self, model: &Dormouse) -> Result<Vec<f32>> {
        if self.is_full(model) {
            return self.rebuild(model);
        }
        let byte = self.last_byte();
        model
            .step(&[byte], &mut [&mut self.cache])?
            .squeeze(0)?
            .to_vec1()
    }
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
    let (mut sequence, mut logits) = Continuation::start(model, prompt)?;
    let mut produced = 0;
    while produced < max_new {
        let byte = sampler.next_byte(&logits);
        produced += 1;
        sequence.push(byte);
        if on_byte(byte).is_break() || produced == max_new {
            break;
        }
        logits = sequence.next_logits(model)?;
    }
    Ok(produced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(probabilities: &[(usize, f64)]) -> Vec<f32> {
        let mut l = vec![f32::NEG_INFINITY; 256];
        for &(byte, p) in probabilities {
            l[byte] = p.ln() as f32;
        }
        l
    }

    fn sampler(temperature: f64, top_k: usize, top_p: f64, seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        })
    }

    #[test]
    fn greedy_takes_the_largest_logit_and_the_lowest_byte_among_ties() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.next_byte(&logits(&[(7, 0.2), (9, 0.5), (200, 0.3)])), 9);
        let mut tied = vec![0.0f32; 256];
        tied[3] = 1.0;
        tied[4] = 1.0;
        assert_eq!(s.next_byte(&tied), 3);
    }

    #[test]
    fn sampling_follows_the_softmax_and_top_k_top_p_cut_the_tail() {
        let l = logits(&[(10, 0.5), (20, 0.3), (30, 0.2)]);
        let mut s = sampler(1.0, 0, 1.0, 42);
        let mut counts = [0usize; 256];
        let draws = 40_000;
        for _ in 0..draws {
            counts[s.next_byte(&l) as usize] += 1;
        }
        for (byte, p) in [(10, 0.5), (20, 0.3), (30, 0.2)] {
            let seen = counts[byte] as f64 / draws as f64;
            assert!((seen - p).abs() < 0.01, "byte {byte}: {seen} vs {p}");
        }
        assert_eq!(
            counts.iter().sum::<usize>(),
            draws,
            "nothing outside the support"
        );

        let mut top1 = sampler(1.0, 1, 1.0, 1);
        assert!((0..200).all(|_| top1.next_byte(&l) == 10));
        let mut nucleus = sampler(1.0, 0, 0.8, 1);
        assert!(
            (0..500).all(|_| nucleus.next_byte(&l) != 30),
            "0.5 + 0.3 reach 0.8"
        );
        let mut cold = sampler(1e-4, 0, 1.0, 1);
        assert!((0..200).all(|_| cold.next_byte(&l) == 10));
    }

    #[test]
    fn the_same_seed_draws_the_same_bytes_and_bad_params_are_refused() {
        let l = logits(&[(1, 0.25), (2, 0.25), (3, 0.25), (4, 0.25)]);
        let draw = |seed| {
            let mut s = sampler(1.0, 0, 1.0, seed);
            (0..64).map(|_| s.next_byte(&l)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
        let params = |temperature, top_p| SamplingParams {
            temperature,
            top_p,
            ..SamplingParams::default()
        };
        assert!(params(-1.0, 1.0).validate().is_err());
        assert!(params(f64::NAN, 1.0).validate().is_err());
        assert!(params(1.0, 0.0).validate().is_err());
        assert!(params(1.0, 1.5).validate().is_err());
        assert!(params(0.0, 1.0).validate().is_ok());
    }

    #[test]
    fn generation_runs_past_max_seq_len_and_takes_long_prompts() {
        let cfg = crate::DormouseConfig {
            max_seq_len: 16,
            ..crate::DormouseConfig::preset("nano").unwrap()
        };
        let (_, model) = crate::init::seeded_model(&cfg, 3, &candle_core::Device::Cpu).unwrap();
        let mut bytes = Vec::new();
        let produced = generate(
            &model,
            &[b'a'; 40],
            50,
            &mut Sampler::new(SamplingParams::default()),
            |b| {
                bytes.push(b);
                ControlFlow::Continue(())
            },
        )
        .unwrap();
        assert_eq!((produced, bytes.len()), (50, 50));
        let stopped = generate(
            &model,
            b"x",
            50,
            &mut Sampler::new(SamplingParams::default()),
            |_| ControlFlow::Break(()),
        )
        .unwrap();
        assert_eq!(stopped, 1);
        assert!(
            generate(
                &model,
                b"",
                5,
                &mut Sampler::new(SamplingParams::default()),
                |_| { ControlFlow::Continue(()) }
            )
            .is_err()
        );
    }
}
