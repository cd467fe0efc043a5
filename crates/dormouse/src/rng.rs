//! The only source of randomness in dormouse: SplitMix64, and independent streams derived from
//! (seed, purpose, step).
//!
//! Every random choice of a run (its initialisation, its batches, the host memory's rows) is a
//! pure function of (seed, purpose, step), never of how many draws came before: a resumed run
//! draws exactly what the uninterrupted run would have, and adding a draw for one purpose never
//! shifts another's. Sampling during generation uses the same generator, seeded by the caller.

/// SplitMix64: small, fast, and the same sequence on every platform.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal sample (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// What a stream is drawn for. The numbers are part of every saved run (they pick the
/// streams), so they live here together: two purposes can never share a number by accident,
/// and none may ever change.
pub mod purpose {
    /// The windows of each training step's batch (`step` = the training step).
    pub const BATCHES: u64 = 1;
    /// The model's initial parameters (`step` = the variable's index in name order).
    pub const MODEL_INIT: u64 = 2;
    /// The initial rows of an `--engram-ram` run's host memory (`step` = the chunk of rows).
    pub const HOST_MEMORY_INIT: u64 = 3;
}

/// A generator for one purpose at one step, independent of every other draw.
pub fn stream(seed: u64, purpose: u64, step: u64) -> SplitMix64 {
    let mut mixer = SplitMix64::new(seed ^ purpose.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let base = mixer.next_u64();
    SplitMix64::new(base ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_gives_the_reference_sequence() {
        // The first outputs of the reference implementation (Vigna's splitmix64.c) from seed 0.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn streams_depend_on_seed_purpose_and_step_alone() {
        let first = |seed, purpose, step| stream(seed, purpose, step).next_u64();
        assert_eq!(first(1, purpose::BATCHES, 5), first(1, purpose::BATCHES, 5));
        assert_ne!(first(1, purpose::BATCHES, 5), first(1, purpose::BATCHES, 6));
        assert_ne!(
            first(1, purpose::BATCHES, 5),
            first(1, purpose::MODEL_INIT, 5)
        );
        assert_ne!(first(1, purpose::BATCHES, 5), first(2, purpose::BATCHES, 5));
    }
}
