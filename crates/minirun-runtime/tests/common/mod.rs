//! Shared by the runtime's tests: fixture checkpoints and generated ones packed into
//! artifacts, and work on a thread pool of a given size.
#![allow(dead_code)]

pub mod wide_v4;

/// The largest absolute difference between two logit rows.
pub fn max_abs_delta(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// An oracle's logits file: little-endian f32, one row of `vocab` per position.
pub fn read_logits(path: &Path, vocab: usize) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).expect("the logits file");
    assert_eq!(bytes.len() % (vocab * 4), 0, "{}", path.display());
    let all: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    all.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// A JSON list of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|i| i.as_u64().expect("an id") as u32)
        .collect()
}

/// Each value's bit pattern, for comparing logits exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

use std::path::{Path, PathBuf};

use minirun_pack::{PackOptions, pack};
use minirun_synth::tiny_models::{SyntheticArchitecture, SyntheticShape, write_synthetic};

/// A fixture checkpoint under `tests/data/deepseek-v3`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/deepseek-v3")
        .join(name)
}

/// The fixture checkpoint `name`, packed into a fresh artifact.
pub fn packed(name: &str) -> tempfile::TempDir {
    packed_from(&fixture(name))
}

/// `tests/data/{path}`: a fixture of any architecture.
pub fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

/// The checkpoint at `source`, packed into a fresh artifact.
pub fn packed_from(source: &Path) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    pack(source, out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

/// A JSON file (an oracle, a config).
pub fn json_file(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A generated DeepSeek-V3 checkpoint of `shape` (with a fixture's tokenizer), packed.
pub fn packed_synthetic(shape: &SyntheticShape) -> tempfile::TempDir {
    packed_synthetic_of(shape, SyntheticArchitecture::DeepSeekV3)
}

/// A generated checkpoint of `shape` and `architecture` (with a fixture's tokenizer), packed.
pub fn packed_synthetic_of(
    shape: &SyntheticShape,
    architecture: SyntheticArchitecture,
) -> tempfile::TempDir {
    let checkpoint = tempfile::tempdir().unwrap();
    let tokenizer = fixture("mlx-affine4-g64");
    write_synthetic(checkpoint.path(), shape, architecture, &tokenizer).unwrap();
    let out = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    out
}

/// Large enough that at the floor every layer's deterministic weights stream too.
pub const STREAMED_SHAPE: SyntheticShape = SyntheticShape {
    hidden: 512,
    layers: 5,
    experts: 32,
    experts_per_token: 4,
    moe_intermediate: 1024,
    vocab: 512,
    seed: 11,
};

pub fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// The prompt, then `steps` greedy steps: every logit's bits, and the decode steps' figures.
pub fn greedy_bits(
    model: &minirun_runtime::Model,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, minirun_stream::step::StepStats) {
    use minirun_runtime::Decoder;
    use minirun_stream::step::StepStats;
    let mut cache = model.new_cache();
    let mut logits = model
        .prefill(prompt, &mut cache, &mut StepStats::default())
        .unwrap();
    let mut bits: Vec<u32> = logits.iter().map(|l| l.to_bits()).collect();
    let mut decode = StepStats::default();
    for _ in 0..steps {
        let mut stats = StepStats::default();
        let token = minirun_runtime::argmax(&logits);
        logits = model.step(token, &mut cache, &mut stats).unwrap();
        decode.add(&stats);
        bits.extend(logits.iter().map(|l| l.to_bits()));
    }
    (bits, decode)
}

/// A streamed run under `plan` (read-ahead as given, on `threads` threads) gives `resident`'s
/// logit bits, hits no cached expert, reads exactly the plan's expert, layer and table bytes per
/// step (no streamed matrix read twice in a pass), and holds at most the plan's cache and slot
/// pool of experts and its layer pool of streamed matrices.
pub fn assert_streams_as_planned(
    session: &minirun_runtime::Session,
    plan: &minirun_stream::plan::Plan,
    experts: &minirun_stream::model_weights::ModelWeights,
    (read_ahead, threads): (bool, usize),
    (prompt, steps): (&[u32], usize),
    resident: &[u32],
    label: &str,
) {
    use minirun_runtime::Decoder;
    let plan = minirun_stream::plan::Plan {
        read_ahead,
        ..plan.clone()
    };
    let streamed = session.planned_model(&plan, experts).unwrap();
    let (bits, decode) = on_threads(threads, || greedy_bits(&streamed, prompt, steps));
    let case = format!(
        "{label}: {} layers streamed, read-ahead {read_ahead}, {threads} threads",
        plan.streamed_layers.len()
    );
    assert!(bits == resident, "{case}: other logits than resident");
    assert_eq!(decode.expert_cache_hits, 0, "{case}");
    let steps = steps as u64;
    assert_eq!(
        decode.expert_read_bytes,
        plan.uncached_read_per_token * steps,
        "{case}"
    );
    assert_eq!(
        decode.layer_read_bytes,
        plan.layer_read_per_token * steps,
        "{case}"
    );
    assert_eq!(
        decode.table_read_bytes,
        plan.table_read_per_token * steps,
        "{case}"
    );
    assert_eq!(
        decode.layer_rereads, 0,
        "{case}: a matrix read twice in a pass"
    );
    let (_, peak) = streamed.expert_memory().unwrap();
    assert!(peak <= plan.cache_bytes + plan.slot_pool_bytes, "{case}");
    let layer_peak = streamed.layer_pool_peak();
    assert!(
        layer_peak <= plan.layer_pool_bytes,
        "{case}: {layer_peak} B of streamed matrices at once, the pool is {}",
        plan.layer_pool_bytes
    );
    assert_eq!(
        layer_peak > 0,
        !plan.streamed_layers.is_empty(),
        "{case}: streamed matrices went through the pool"
    );
}

/// At the floor no expert is guessed (its budget has no room for a guess's slot pool). With
/// every layer's experts streamed and a cache of two slot pools for guesses and one more for
/// each layer's cached experts (`experts_only`, the deterministic floor's plan, given that
/// cache), a run that reads each layer's experts ahead on a guess (one layer at a time, then
/// two) gives `resident`'s logit bits, even where guesses were wrong, and counts what the
/// guesses read: every guessed expert the router chose is a hit (read once, as a cache miss;
/// none the cache held is guessed), and no more bytes were used than read. Without guesses
/// none is counted, and a prefill (many rows a step) guesses nothing.
pub fn assert_guesses_keep_the_bits(
    session: &minirun_runtime::Session,
    (floor, experts_only): (&minirun_stream::plan::Plan, &minirun_stream::plan::Plan),
    experts: &minirun_stream::model_weights::ModelWeights,
    (prompt, steps): (&[u32], usize),
    resident: &[u32],
    label: &str,
) {
    use minirun_runtime::Decoder;
    use minirun_stream::step::StepStats;
    assert_eq!(
        floor.guessed_layers, 0,
        "{label}: the floor has no room for a guess"
    );
    let pools = (2 + experts_only.moe_layers as u64) * experts_only.slot_pool_bytes;
    let plan = minirun_stream::plan::Plan {
        budget: experts_only.budget + pools,
        cache_bytes: experts_only.cache_bytes + pools,
        ..experts_only.clone()
    };
    let mut wrong = 0;
    for layers in [1, 2, 0] {
        let mut plan = plan.clone();
        plan.guess_ahead(layers);
        assert_eq!(
            plan.guessed_layers, layers,
            "{label}: room for {layers} guesses"
        );
        let model = session.planned_model(&plan, experts).unwrap();
        let case = format!("{label}, {layers} layers guessed");
        let mut prefill = StepStats::default();
        model
            .prefill(prompt, &mut model.new_cache(), &mut prefill)
            .unwrap();
        assert_eq!(
            prefill.expert_guessed, 0,
            "{case}: a prefill's rows guessed"
        );
        let (bits, decode) = greedy_bits(&model, prompt, steps);
        assert!(bits == resident, "{case}: other logits than resident");
        if layers == 0 {
            assert_eq!(decode.expert_guessed, 0, "{case}");
            assert_eq!(decode.expert_guess_read_bytes, 0, "{case}");
            continue;
        }
        assert!(decode.expert_guess_hits > 0, "{case}: no guess was right");
        // Every guessed expert the router chose was computed from the guess's read (none
        // failed), whether it was whole when the router chose or still arriving; none the cache
        // held was guessed.
        assert_eq!(
            decode.expert_guess_hits, decode.expert_guess_right,
            "{case}"
        );
        assert!(decode.expert_guess_hits <= decode.expert_guessed, "{case}");
        assert!(
            decode.expert_guess_hits <= decode.expert_cache_misses,
            "{case}"
        );
        assert!(
            decode.expert_guess_hit_bytes <= decode.expert_guess_read_bytes,
            "{case}: used more guessed bytes than were read"
        );
        assert!(
            decode.expert_cache_hits > 0,
            "{case}: the cache held nothing"
        );
        wrong += decode.expert_guessed - decode.expert_guess_hits;
    }
    assert!(
        wrong > 0,
        "{label}: every guess was right, so none was shown harmless"
    );
}

/// Steps `model` through `prompt` against an oracle's logits: every position within
/// `tolerance` of `expected`, with the oracle's top-1 where `margins[position]` exceeds
/// `margin`. Then the prompt prefilled at once must give the last position the stepped bits,
/// and 32 greedy tokens from both caches the same bits each step. Returns the greedy tokens and
/// the worst |delta|.
pub fn follow_oracle<D: minirun_runtime::Decoder>(
    model: &D,
    prompt: &[u32],
    expected: &[Vec<f32>],
    margins: &[f32],
    (tolerance, margin): (f32, f32),
    label: &str,
) -> (Vec<u32>, f32) {
    use minirun_runtime::argmax;
    use minirun_stream::step::StepStats;
    assert_eq!(
        expected.len(),
        prompt.len(),
        "{label}: one row per position"
    );
    assert_eq!(
        margins.len(),
        prompt.len(),
        "{label}: one margin per position"
    );
    let mut cache = model.new_cache();
    let mut logits = Vec::new();
    let mut worst = 0f32;
    for (position, (&token, want)) in prompt.iter().zip(expected).enumerate() {
        logits = model
            .step(token, &mut cache, &mut StepStats::default())
            .unwrap();
        let delta = max_abs_delta(&logits, want);
        worst = worst.max(delta);
        assert!(
            delta <= tolerance,
            "{label} position {position}: max |logit delta| {delta}"
        );
        if margins[position] > margin {
            assert_eq!(
                argmax(&logits),
                argmax(want),
                "{label} position {position}: top-1 differs"
            );
        }
    }
    let mut batched = model.new_cache();
    let at_once = model
        .prefill(prompt, &mut batched, &mut StepStats::default())
        .unwrap();
    assert_eq!(
        bits(&at_once),
        bits(&logits),
        "{label}: the prompt in one chunk gives the last position other bits than stepping"
    );
    let mut greedy = Vec::new();
    for _ in 0..32 {
        let token = argmax(&logits);
        greedy.push(token);
        logits = model
            .step(token, &mut cache, &mut StepStats::default())
            .unwrap();
        let chunked = model
            .step(token, &mut batched, &mut StepStats::default())
            .unwrap();
        assert_eq!(bits(&chunked), bits(&logits), "{label}: caches diverge");
    }
    (greedy, worst)
}

/// Every prompt of `oracle` (an oracle file in `fixture`'s folder, as the fixture generators
/// write it: each prompt's `token_ids`, `vocab`, `logits_file` and `greedy_32`) followed within
/// `tolerance` by [`follow_oracle`], with the oracle's top-1 at every position (the generators
/// keep every top-1 margin above 2e-3), and its 32 greedy tokens. Returns the worst |delta|.
pub fn follow_every_prompt<D: minirun_runtime::Decoder>(
    model: &D,
    fixture: &Path,
    oracle: &serde_json::Value,
    tolerance: f32,
    label: &str,
) -> f32 {
    let mut worst = 0f32;
    for prompt in oracle["prompts"].as_array().unwrap() {
        let tokens = ids(&prompt["token_ids"]);
        let vocab = prompt["vocab"].as_u64().unwrap() as usize;
        let logits_file = fixture.join(prompt["logits_file"].as_str().unwrap());
        let expected = read_logits(&logits_file, vocab);
        let margins = vec![f32::INFINITY; tokens.len()];
        let label = format!("{label} {}", prompt["name"].as_str().unwrap());
        let (greedy, delta) = follow_oracle(
            model,
            &tokens,
            &expected,
            &margins,
            (tolerance, 0.0),
            &label,
        );
        worst = worst.max(delta);
        assert_eq!(greedy, ids(&prompt["greedy_32"]), "{label}");
    }
    worst
}

/// Logits of a generated random-weight model are worth comparing: all finite, not one value.
pub fn assert_logits_mean_something(bits: &[u32]) {
    assert!(
        bits.iter().all(|&b| f32::from_bits(b).is_finite()),
        "the generated weights keep the logits finite"
    );
    assert!(
        bits.iter()
            .any(|&b| f32::from_bits(b) != f32::from_bits(bits[0])),
        "the logits are not all one value"
    );
}
