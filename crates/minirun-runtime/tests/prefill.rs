//! Batched prefill: a prompt run through the layers `PREFILL_CHUNK` positions at a time gives
//! every position the bits stepping through it one token at a time gives, resident and
//! streamed at the floor, on one thread and on two; the cache it leaves decodes the same
//! continuation; a bad token anywhere leaves the cache as it was.

mod common;

use common::{STREAMED_SHAPE, on_threads, packed, packed_synthetic};
use minirun_kernels::Activations;
use minirun_runtime::Decoder;
use minirun_runtime::PREFILL_CHUNK;
use minirun_runtime::argmax;
use minirun_runtime::models::deepseek_v3::DeepSeekV3;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::budget::Budget;
use minirun_stream::plan::Plan;
use minirun_stream::step::ModelError;
use minirun_stream::step::StepStats;

const FIXTURES: [&str; 3] = ["mlx-affine4-g64", "mlx-mxfp4", "hf-fp8-e8m0"];

/// A prompt longer than one chunk, so that a chunk boundary is crossed.
fn prompt(vocab: usize) -> Vec<u32> {
    (0..PREFILL_CHUNK + 7)
        .map(|i| ((i * 37 + 5) % vocab) as u32)
        .collect()
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|l| l.to_bits()).collect()
}

/// The logits after the prompt, then after each of four greedy steps, as bits.
fn decode(model: &DeepSeekV3, prompt: &[u32], batched: bool) -> Vec<Vec<u32>> {
    let mut cache = model.new_cache();
    let mut stats = StepStats::default();
    let mut logits = match batched {
        true => model.prefill(prompt, &mut cache, &mut stats).unwrap(),
        false => {
            let mut last = Vec::new();
            for &t in prompt {
                last = model.step(t, &mut cache, &mut stats).unwrap();
            }
            last
        }
    };
    assert_eq!(cache.len, prompt.len());
    let mut all = vec![bits(&logits)];
    for _ in 0..4 {
        let next = argmax(&logits);
        logits = model.step(next, &mut cache, &mut stats).unwrap();
        all.push(bits(&logits));
    }
    all
}

/// Loads `artifact` resident and streamed at the floor, and checks that a prefill gives every
/// position the bits stepping gives, with both models on one thread and on two; returns the
/// stepped bits.
fn assert_prefill_matches_stepping(artifact: &Artifact, what: &str) -> Vec<Vec<u32>> {
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let prompt = prompt(config.vocab_size);
    let resident = DeepSeekV3::load(artifact, config.clone()).unwrap();
    let stepped = decode(&resident, &prompt, false);

    let experts = DeepSeekV3::weights(artifact, &config).unwrap();
    let floor = Plan::new(artifact, &config, &experts, Budget::Floor, 128).unwrap();
    let streamed = DeepSeekV3::load_planned(artifact, config, &floor, &experts).unwrap();
    for threads in [1, 2] {
        for (how, model) in [("resident", &resident), ("streamed", &streamed)] {
            let batched = on_threads(threads, || decode(model, &prompt, true));
            assert!(
                batched == stepped,
                "{what}, {how}, {threads} threads: prefill differs from stepping"
            );
        }
    }
    stepped
}

#[test]
fn a_prefilled_prompt_has_the_bits_of_stepping_through_it_resident_and_streamed() {
    for fixture in FIXTURES {
        let dir = packed(fixture);
        let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
        assert_prefill_matches_stepping(&artifact, fixture);
    }
}

/// With 8-bit activations a position's rows are quantized once for all the products that read
/// them (gate and up, every routed expert) instead of once per product; a prefill must still
/// give every position stepping's bits, resident and streamed, on one thread and on two.
#[test]
fn with_eight_bit_activations_a_prefill_has_the_bits_of_stepping() {
    for fixture in ["mlx-affine4-g64", "mlx-affine8-g32", "mlx-mxfp4"] {
        let dir = packed(fixture);
        let exact = Artifact::open(dir.path(), Access::Unverified).unwrap();
        let config = DeepSeekV3Config::parse(&exact.config_json).unwrap();
        let prompt = prompt(config.vocab_size);
        let exact_bits = decode(&DeepSeekV3::load(&exact, config).unwrap(), &prompt, false);
        let mut artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
        artifact.set_activations(Activations::Int8);
        let int8_bits = assert_prefill_matches_stepping(&artifact, &format!("{fixture} int8"));
        assert!(
            int8_bits != exact_bits,
            "{fixture}: int8 gave the f32 path's bits"
        );
    }
}

#[test]
fn a_prefill_with_every_layer_streamed_reads_each_layer_once_and_keeps_the_bits() {
    let dir = packed_synthetic(&STREAMED_SHAPE);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let floor = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
    assert_eq!(floor.streamed_layers.len(), config.num_hidden_layers);
    let model = DeepSeekV3::load_planned(&artifact, config.clone(), &floor, &experts).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 41 + 3) % 512).collect();
    let batched = decode(&model, &prompt, true);
    assert!(
        batched == decode(&model, &prompt, false),
        "prefill differs from stepping"
    );

    let mut one = StepStats::default();
    model
        .step(prompt[0], &mut model.new_cache(), &mut one)
        .unwrap();
    let mut all = StepStats::default();
    model
        .prefill(&prompt, &mut model.new_cache(), &mut all)
        .unwrap();
    assert!(one.layer_read_bytes > 0);
    assert_eq!(
        all.layer_read_bytes, one.layer_read_bytes,
        "one chunk reads each streamed layer once"
    );
}

#[test]
fn read_ahead_reads_the_first_streamed_matrices_for_the_next_step_during_this_one() {
    let dir = packed_synthetic(&STREAMED_SHAPE);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let experts = DeepSeekV3::weights(&artifact, &config).unwrap();
    let floor = Plan::new(&artifact, &config, &experts, Budget::Floor, 64).unwrap();
    let mut per_step = Vec::new();
    for read_ahead in [true, false] {
        let plan = Plan {
            read_ahead,
            ..floor.clone()
        };
        let model = DeepSeekV3::load_planned(&artifact, config.clone(), &plan, &experts).unwrap();
        let mut cache = model.new_cache();
        let mut bytes = Vec::new();
        for token in [5, 9, 11] {
            let mut stats = StepStats::default();
            model.step(token, &mut cache, &mut stats).unwrap();
            bytes.push(stats.layer_read_bytes);
            let kept = model.matrices_read_for_next_step();
            assert_eq!(
                kept > 0,
                read_ahead,
                "{kept} matrices read for the next step"
            );
        }
        per_step.push(bytes);
    }
    assert_eq!(
        per_step[0], per_step[1],
        "a step is charged the layers it uses, whenever they were read"
    );
}

#[test]
fn a_bad_token_anywhere_in_the_prompt_leaves_the_cache_as_it_was() {
    let dir = packed("mlx-affine4-g64");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    let model = DeepSeekV3::load(&artifact, config.clone()).unwrap();
    let mut cache = model.new_cache();
    let mut stats = StepStats::default();
    model.prefill(&[1, 2, 3], &mut cache, &mut stats).unwrap();
    let mut bad = prompt(config.vocab_size);
    bad[PREFILL_CHUNK + 2] = config.vocab_size as u32;
    let err = model.prefill(&bad, &mut cache, &mut stats).unwrap_err();
    assert!(matches!(err, ModelError::Token(..)), "{err}");
    assert_eq!(cache.len, 3);
    let after = model.step(4, &mut cache, &mut stats).unwrap();
    let mut fresh = model.new_cache();
    let expected = model
        .prefill(&[1, 2, 3, 4], &mut fresh, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&after), bits(&expected));
}
