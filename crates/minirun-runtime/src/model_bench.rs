//! Prompt processing and decoding timed the way llama.cpp's `llama-bench` times them, so that
//! the two programs' figures compare like for like on one machine:
//!
//! - **prompt** (`pp N`): a warm-up pass of the whole prompt, then `repeats` passes, each into
//!   a new (empty) cache; one figure per pass, `N / seconds`.
//! - **decode** (`tg N`): a warm-up step, then `repeats` runs of `N` steps, each from an empty
//!   cache; one figure per run, `N / seconds`.
//!
//! The reported rate is the mean of the per-pass figures, and its spread their sample standard
//! deviation (llama-bench's `avg_ts` and `stddev_ts`). Unlike llama-bench, which feeds random
//! tokens while decoding, each decode step here takes the greedy token of the step before, as
//! a real run does (the argmax is timed too).
//!
//! Every timed pass must reproduce the first one bit for bit (the prompt's last logits; the
//! decoded ids and the last step's logits): a model whose repeated runs differ is refused
//! rather than timed, since it would be timing something other than what `minirun run`
//! computes.

use std::time::Instant;

use crate::decoder::Decoder;
use crate::generate::argmax;
use crate::step::{ModelError, StepStats};

/// Why a measurement was refused.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error(
        "{test} pass {pass} computed other bits than pass 1: the model is not deterministic across runs, so its timings would not describe one computation"
    )]
    NotRepeatable { test: String, pass: usize },
}

/// The timed passes of one test.
#[derive(Debug, Clone)]
pub struct Timings {
    /// `pp N` or `tg N`, as llama-bench names its tests.
    pub test: String,
    /// Tokens each pass processed.
    pub tokens: usize,
    /// Wall seconds of each timed pass (the warm-up is not among them).
    pub seconds: Vec<f64>,
}

impl Timings {
    /// Tokens per second of each pass.
    pub fn rates(&self) -> Vec<f64> {
        self.seconds
            .iter()
            .map(|s| self.tokens as f64 / s)
            .collect()
    }

    /// The mean of the per-pass rates.
    pub fn mean_rate(&self) -> f64 {
        let rates = self.rates();
        rates.iter().sum::<f64>() / rates.len() as f64
    }

    /// The sample standard deviation of the per-pass rates (0 for a single pass).
    pub fn stdev_rate(&self) -> f64 {
        let rates = self.rates();
        if rates.len() < 2 {
            return 0.0;
        }
        let mean = self.mean_rate();
        let square_sum: f64 = rates.iter().map(|r| (r - mean) * (r - mean)).sum();
        (square_sum / (rates.len() - 1) as f64).sqrt()
    }
}

/// Bits of logits, for comparing passes exactly (NaN payloads included).
fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|v| v.to_bits()).collect()
}

/// `repeats` runs of `pass` (each giving its seconds and what it computed), every one required
/// to compute what the first did: their seconds.
fn timed_passes<T: PartialEq>(
    test: &str,
    repeats: usize,
    mut pass: impl FnMut() -> Result<(f64, T), ModelError>,
) -> Result<Vec<f64>, BenchError> {
    let mut seconds = Vec::with_capacity(repeats);
    let mut first: Option<T> = None;
    for p in 0..repeats {
        let (s, seen) = pass()?;
        match &first {
            None => first = Some(seen),
            Some(want) if *want != seen => {
                return Err(BenchError::NotRepeatable {
                    test: test.to_string(),
                    pass: p + 1,
                });
            }
            Some(_) => {}
        }
        seconds.push(s);
    }
    Ok(seconds)
}

/// `prompt` through a new cache of `model`, once to warm up and then `repeats` times, timed.
pub fn time_prompt<D: Decoder>(
    model: &D,
    prompt: &[u32],
    repeats: usize,
) -> Result<Timings, BenchError> {
    if repeats == 0 {
        return Err(BenchError::Zero { what: "repeats" });
    }
    if prompt.is_empty() {
        return Err(BenchError::Zero {
            what: "the prompt's length",
        });
    }
    let pass = || -> Result<(f64, Vec<u32>), ModelError> {
        let mut cache = model.new_cache();
        let started = Instant::now();
        let logits = model.prefill(prompt, &mut cache, &mut StepStats::default())?;
        Ok((started.elapsed().as_secs_f64(), bits(&logits)))
    };
    pass()?;
    let test = format!("pp{}", prompt.len());
    let seconds = timed_passes(&test, repeats, pass)?;
    Ok(Timings {
        test,
        tokens: prompt.len(),
        seconds,
    })
}

/// What a decode pass computed: the ids it fed, and the bits of its last step's logits.
type Decoded = (Vec<u32>, Vec<u32>);

/// `tokens` greedy steps from `first` through a new cache of `model`, timed.
fn decode_pass<D: Decoder>(
    model: &D,
    first: u32,
    tokens: usize,
) -> Result<(f64, Decoded), ModelError> {
    let mut cache = model.new_cache();
    let mut stats = StepStats::default();
    let mut token = first;
    let mut fed = Vec::with_capacity(tokens);
    let mut logits = Vec::new();
    let started = Instant::now();
    for _ in 0..tokens {
        fed.push(token);
        logits = model.step(token, &mut cache, &mut stats)?;
        token = argmax(&logits);
    }
    Ok((started.elapsed().as_secs_f64(), (fed, bits(&logits))))
}

/// `tokens` decode steps from an empty cache, starting from `first` and then greedy: one step
/// to warm up, then `repeats` timed runs.
pub fn time_decode<D: Decoder>(
    model: &D,
    first: u32,
    tokens: usize,
    repeats: usize,
) -> Result<Timings, BenchError> {
    if repeats == 0 {
        return Err(BenchError::Zero { what: "repeats" });
    }
    if tokens == 0 {
        return Err(BenchError::Zero {
            what: "the tokens to decode",
        });
    }
    decode_pass(model, first, 1)?;
    let test = format!("tg{tokens}");
    let seconds = timed_passes(&test, repeats, || decode_pass(model, first, tokens))?;
    Ok(Timings {
        test,
        tokens,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::Timings;

    #[test]
    fn rates_are_llama_bench_s_mean_and_sample_deviation() {
        let t = Timings {
            test: "pp4".into(),
            tokens: 4,
            seconds: vec![1.0, 0.5, 0.25],
        };
        assert_eq!(t.rates(), vec![4.0, 8.0, 16.0]);
        let mean = 28.0 / 3.0;
        assert!((t.mean_rate() - mean).abs() < 1e-12);
        let var = ((4.0 - mean) * (4.0f64 - mean)
            + (8.0 - mean) * (8.0 - mean)
            + (16.0 - mean) * (16.0 - mean))
            / 2.0;
        assert!((t.stdev_rate() - var.sqrt()).abs() < 1e-12);
        let one = Timings {
            seconds: vec![2.0],
            ..t
        };
        assert_eq!(one.stdev_rate(), 0.0);
    }
}
