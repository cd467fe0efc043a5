//! `model_bench`: timings come from passes that reproduce one another bit for bit; a model whose
//! passes differ is refused, not timed; zero repeats or tokens are refused.

use std::cell::Cell;

use minirun_runtime::decoder::Decoder;
use minirun_runtime::model_bench::{BenchError, time_decode, time_prompt};
use minirun_runtime::step::{ModelError, StepStats};

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
        _stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
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
        _stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
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
}

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
