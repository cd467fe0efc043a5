//! Every fuzz target's property on a stable toolchain: the kept seeds (`fuzz/seeds/TARGET/`,
//! golden and real files) and then, for a bounded time per target, a deterministic stream of
//! their mutations (bit flips, format-shaped bytes, inserted, deleted and repeated ranges,
//! extreme numbers in text, splices of two seeds). Not coverage-guided, as libFuzzer is
//! (`fuzz/run_all.sh`), but it runs in every `cargo test` and so on every submission.
//!
//! `FUZZ_SECONDS` sets the time per target (default 2), `FUZZ_SEED` the stream (default 0). An
//! input that breaks a property is written under the test's temporary directory, named in the
//! failure, so it can be replayed and kept as a seed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fuzz_properties::{Property, TARGETS};

/// Mutated inputs grow no larger than this.
const MAX_INPUT: usize = 1 << 20;

/// Bytes that mean something to the formats under test: JSON punctuation, digits, the
/// extremes of a byte.
const SHAPED: &[u8] = b"{}[]\",:-.0123456789eE \n\x00\x01\x7f\x80\xff";

/// Numbers that test bounds when they replace one in a text.
const EXTREME_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "65536",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e309",
    "-0.0",
    "999999999999999999999999",
];

/// SplitMix64: a small, well-known generator, so every run of a seed is the same run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut inputs: Vec<Vec<u8>> = files.iter().filter_map(|f| std::fs::read(f).ok()).collect();
    inputs.extend([Vec::new(), b"{}".to_vec()]);
    inputs
}

/// One to four edits of `input`, each drawn from the kinds above; `other` is another seed to
/// splice with.
fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        let last = bytes.len().saturating_sub(1);
        match rng.below(8) {
            0 if !bytes.is_empty() => bytes[at.min(last)] ^= 1 << rng.below(8),
            1 if !bytes.is_empty() => bytes[at.min(last)] = SHAPED[rng.below(SHAPED.len())],
            2 => {
                let inserted: Vec<u8> = (0..1 + rng.below(8))
                    .map(|_| SHAPED[rng.below(SHAPED.len())])
                    .collect();
                bytes.splice(at..at, inserted);
            }
            3 => {
                let end = (at + 1 + rng.below(64)).min(bytes.len());
                bytes.drain(at.min(end)..end);
            }
            4 => {
                let end = (at + 1 + rng.below(256)).min(bytes.len());
                let repeated = bytes[at.min(end)..end].to_vec();
                for _ in 0..1 + rng.below(4) {
                    bytes.splice(at..at, repeated.iter().copied());
                }
            }
            5 => replace_a_number(&mut bytes, rng),
            6 => {
                let cut = rng.below(other.len() + 1);
                bytes.truncate(at);
                bytes.extend_from_slice(&other[cut..]);
            }
            _ => bytes.truncate(at),
        }
        bytes.truncate(MAX_INPUT);
    }
    bytes
}

/// Replaces the run of digits at or after a random place with an extreme number.
fn replace_a_number(bytes: &mut Vec<u8>, rng: &mut Rng) {
    let from = rng.below(bytes.len() + 1);
    let Some(start) = (from..bytes.len()).find(|&i| bytes[i].is_ascii_digit()) else {
        return;
    };
    let end = (start..bytes.len())
        .find(|&i| !bytes[i].is_ascii_digit())
        .unwrap_or(bytes.len());
    let number = EXTREME_NUMBERS[rng.below(EXTREME_NUMBERS.len())];
    bytes.splice(start..end, number.bytes());
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `property` on `input`; a panic is kept as a file and named.
fn check(target: &str, property: Property, input: &[u8], findings: &mut Vec<String>) {
    if catch_unwind(AssertUnwindSafe(|| property(input))).is_ok() {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("{target}-{}.bin", findings.len()));
    let _ = std::fs::write(&file, input);
    findings.push(format!(
        "{target}: {} ({} bytes)",
        file.display(),
        input.len()
    ));
}

#[test]
fn every_target_holds_on_its_seeds_and_their_mutations() {
    let per_target = Duration::from_secs(env_number("FUZZ_SECONDS", 2));
    let stream = env_number("FUZZ_SEED", 0);
    let mut findings = Vec::new();
    for (k, &(target, property)) in TARGETS.iter().enumerate() {
        let inputs = seeds(target);
        for input in &inputs {
            check(target, property, input, &mut findings);
        }
        let mut rng = Rng(stream ^ (k as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let started = Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < per_target && findings.len() < 16 {
            let input = &inputs[rng.below(inputs.len())];
            let other = &inputs[rng.below(inputs.len())];
            check(
                target,
                property,
                &mutate(input, other, &mut rng),
                &mut findings,
            );
            runs += 1;
        }
        eprintln!(
            "{target}: {} seeds, {runs} mutations in {:.1} s",
            inputs.len(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(
        findings.is_empty(),
        "inputs that break a property (replay them through fuzz_properties::TARGET):\n{}",
        findings.join("\n")
    );
}

#[test]
fn every_fuzz_target_is_run_here_and_has_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| Some(e.path().file_stem()?.to_str()?.to_string()))
        .collect();
    on_disk.sort();
    let listed: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(on_disk, listed, "fuzz/fuzz_targets and TARGETS differ");
    for name in &listed {
        assert!(seeds(name).len() > 2, "fuzz/seeds/{name}/ holds no seed");
    }
}
