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

use minirun_runtime::Decoder;
use minirun_runtime::argmax;
use minirun_stream::step::{ModelError, StepStats};

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
    /// Bytes of stored weights each pass computed with (every pass the same): what a resident
    /// run reads from memory when the weights outgrow the CPU's caches.
    pub weight_bytes: u64,
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

    /// Weight bytes per token of a pass.
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.weight_bytes / (self.tokens as u64).max(1)
    }

    /// Weight bytes read per second at the mean rate.
    pub fn weight_bytes_per_second(&self) -> f64 {
        self.mean_rate() * self.weight_bytes_per_token() as f64
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

/// What a pass computed and the weight bytes it computed with: both must be the same in every
/// pass.
#[derive(PartialEq)]
struct Computed<T> {
    seen: T,
    weight_bytes: u64,
}

/// `repeats` runs of `pass` (each giving its seconds and what it computed), every one required
/// to compute what the first did: their seconds, and the weight bytes of each.
fn timed_passes<T: PartialEq>(
    test: &str,
    repeats: usize,
    mut pass: impl FnMut() -> Result<(f64, Computed<T>), ModelError>,
) -> Result<(Vec<f64>, u64), BenchError> {
    let mut seconds = Vec::with_capacity(repeats);
    let mut first: Option<Computed<T>> = None;
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
    Ok((seconds, first.map_or(0, |f| f.weight_bytes)))
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
    let pass = || -> Result<(f64, Computed<Vec<u32>>), ModelError> {
        let mut cache = model.new_cache();
        let mut stats = StepStats::default();
        let started = Instant::now();
        let logits = model.prefill(prompt, &mut cache, &mut stats)?;
        let seconds = started.elapsed().as_secs_f64();
        let seen = bits(&logits);
        Ok((
            seconds,
            Computed {
                seen,
                weight_bytes: stats.weight_bytes,
            },
        ))
    };
    pass()?;
    let test = format!("pp{}", prompt.len());
    let (seconds, weight_bytes) = timed_passes(&test, repeats, pass)?;
    Ok(Timings {
        test,
        tokens: prompt.len(),
        seconds,
        weight_bytes,
    })
}

/// What a decode pass computed: the ids it fed, and the bits of its last step's logits.
type Decoded = (Vec<u32>, Vec<u32>);

/// `tokens` greedy steps from `first` through a new cache of `model`, timed.
fn decode_pass<D: Decoder>(
    model: &D,
    first: u32,
    tokens: usize,
) -> Result<(f64, Computed<Decoded>), ModelError> {
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
    let seconds = started.elapsed().as_secs_f64();
    let seen = (fed, bits(&logits));
    Ok((
        seconds,
        Computed {
            seen,
            weight_bytes: stats.weight_bytes,
        },
    ))
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
    let (seconds, weight_bytes) =
        timed_passes(&test, repeats, || decode_pass(model, first, tokens))?;
    Ok(Timings {
        test,
        tokens,
        seconds,
        weight_bytes,
    })
}

/// Timings come from passes that reproduce one another bit for bit; a model whose passes differ
/// is refused, not timed; zero repeats or tokens are refused.
#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::{BenchError, Decoder, ModelError, StepStats, Timings, time_decode, time_prompt};

    #[test]
    fn rates_are_llama_bench_s_mean_and_sample_deviation() {
        let t = Timings {
            test: "pp4".into(),
            tokens: 4,
            seconds: vec![1.0, 0.5, 0.25],
            weight_bytes: 400,
        };
        assert_eq!(t.weight_bytes_per_token(), 100);
        assert!((t.weight_bytes_per_second() - 100.0 * 28.0 / 3.0).abs() < 1e-9);
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

    /// Logits that depend on the tokens seen and, once `drift_after` passes have started, on how
    /// many passes came before: a model that is deterministic for a while and then is not.
    struct Drifting {
        caches_made: Cell<usize>,
        drift_after: usize,
    }

    impl Drifting {
        fn logits(&self, seen: &[u32]) -> Vec<f32> {
            let drift = self.caches_made.get().saturating_sub(self.drift_after) as f32;
            let sum: u32 = seen.iter().sum();
            (0..5).map(|i| ((sum + i) % 5) as f32 + drift).collect()
        }
    }

    impl Decoder for Drifting {
        type Cache = Vec<u32>;

        fn new_cache(&self) -> Vec<u32> {
            self.caches_made.set(self.caches_made.get() + 1);
            Vec::new()
        }

        fn cached(&self, cache: &Vec<u32>) -> usize {
            cache.len()
        }

        fn max_positions(&self) -> usize {
            1 << 20
        }

        fn step_batch(
            &self,
            tokens: &[u32],
            caches: &mut [&mut Vec<u32>],
            stats: &mut StepStats,
        ) -> Result<Vec<Vec<f32>>, ModelError> {
            // A step reads its weights once, whatever the batch.
            stats.weight_bytes += STEP_WEIGHT_BYTES;
            let mut out = Vec::new();
            for (t, c) in tokens.iter().zip(caches.iter_mut()) {
                c.push(*t);
                out.push(self.logits(c));
            }
            Ok(out)
        }

        fn prefill_batch(
            &self,
            prompts: &[&[u32]],
            caches: &mut [&mut Vec<u32>],
            stats: &mut StepStats,
        ) -> Result<Vec<Vec<f32>>, ModelError> {
            stats.weight_bytes += STEP_WEIGHT_BYTES;
            let mut out = Vec::new();
            for (p, c) in prompts.iter().zip(caches.iter_mut()) {
                c.extend_from_slice(p);
                out.push(self.logits(c));
            }
            Ok(out)
        }

        fn expert_memory(&self) -> Option<(u64, u64)> {
            None
        }

        fn layer_pool_peak(&self) -> u64 {
            0
        }
    }

    /// Weight bytes a step or a prefill of [`Drifting`] reports.
    const STEP_WEIGHT_BYTES: u64 = 1000;

    fn model(drift_after: usize) -> Drifting {
        Drifting {
            caches_made: Cell::new(0),
            drift_after,
        }
    }

    #[test]
    fn a_deterministic_model_is_timed_once_per_pass_after_a_warm_up() {
        let m = model(usize::MAX);
        let pp = time_prompt(&m, &[1, 2, 3], 4).unwrap();
        assert_eq!(
            (pp.test.as_str(), pp.tokens, pp.seconds.len()),
            ("pp3", 3, 4)
        );
        assert_eq!(
            m.caches_made.get(),
            5,
            "one warm-up and four passes, each on a new cache"
        );
        let tg = time_decode(&m, 1, 6, 2).unwrap();
        assert_eq!(
            (tg.test.as_str(), tg.tokens, tg.seconds.len()),
            ("tg6", 6, 2)
        );
        assert_eq!(m.caches_made.get(), 8);
        // One pass's weight bytes: one prefill, or one step per decoded token.
        assert_eq!(pp.weight_bytes, STEP_WEIGHT_BYTES);
        assert_eq!(tg.weight_bytes, 6 * STEP_WEIGHT_BYTES);
        for t in [&pp, &tg] {
            assert!(t.seconds.iter().all(|s| *s > 0.0 && s.is_finite()));
            assert_eq!(t.rates().len(), t.seconds.len());
        }
    }

    #[test]
    fn passes_that_compute_other_bits_are_refused() {
        // The warm-up and the first timed pass agree; the second drifts.
        let err = time_prompt(&model(2), &[4, 5], 3).unwrap_err();
        assert!(
            matches!(&err, BenchError::NotRepeatable { test, pass: 2 } if test == "pp2"),
            "{err}"
        );
        // Decoding: the warm-up step, pass 1 and pass 2 agree, pass 3 drifts.
        let err = time_decode(&model(3), 0, 4, 5).unwrap_err();
        assert!(
            matches!(&err, BenchError::NotRepeatable { test, pass: 3 } if test == "tg4"),
            "{err}"
        );
        assert!(err.to_string().contains("not deterministic"), "{err}");
    }

    #[test]
    fn nothing_to_time_is_refused() {
        let m = model(usize::MAX);
        assert!(matches!(
            time_prompt(&m, &[1], 0),
            Err(BenchError::Zero { .. })
        ));
        assert!(matches!(
            time_prompt(&m, &[], 3),
            Err(BenchError::Zero { .. })
        ));
        assert!(matches!(
            time_decode(&m, 1, 0, 3),
            Err(BenchError::Zero { .. })
        ));
        assert!(matches!(
            time_decode(&m, 1, 3, 0),
            Err(BenchError::Zero { .. })
        ));
    }
}
