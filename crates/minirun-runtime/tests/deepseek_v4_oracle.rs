//! DeepSeek V4 against transformers: the tiny checkpoint under `tests/data/deepseek-v4/` (made
//! by `tools/make_dsv4_fixtures.py` in DeepSeek's own storage: FP8 block-scaled projections, FP4
//! experts, BF16 compressors and router, F32 hyper-connections; its oracle is transformers
//! 5.24.0's `DeepseekV4ForCausalLM` in float32 on the same stored bits) is packed with
//! `minirun pack`'s library, loaded from the artifact and run one token at a time. At every
//! prompt position the logits must be within `TOLERANCE` of transformers' full-prompt pass, the
//! top-1 token the same wherever its margin exceeds `MARGIN`; the 32-token greedy continuation
//! must be transformers'; the prompt in one chunk gives the stepwise bits.
//!
//! Why `TOLERANCE` = 1e-4: both sides compute in f32 from the same stored bits and differ in
//! the order of their sums; transformers' own full and cached passes differ by up to 1.6e-5
//! here (`prefill_vs_decode_max_abs`), and its fixture skips seeds whose router or indexer
//! selections are closer than 1e-4. A real error (a window one key short, a compressor's
//! overlap dropped, the output rotation not undone) moves logits by 0.01 or more.

mod common;

use std::path::{Path, PathBuf};

use common::{bits, follow_oracle, ids, read_logits};
use minirun_pack::{PackOptions, pack};
use minirun_runtime::Decoder;
use minirun_runtime::models::deepseek_v4::DeepSeekV4;
use minirun_runtime::models::deepseek_v4::config::DeepSeekV4Config;
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::step::StepStats;
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;
const MARGIN: f32 = 1e-3;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4/tiny-fp8-fp4")
}

fn packed() -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("a temporary directory");
    pack(&fixture(), out.path(), &PackOptions::default(), &|_| {}).expect("it packs");
    out
}

fn top1_margin(row: &[f32]) -> f32 {
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted[0] - sorted[1]
}

fn matches_transformers(prompt_name: &str) {
    let dir = packed();
    let artifact = Artifact::open(dir.path(), Access::Unverified).expect("the artifact opens");
    let config = DeepSeekV4Config::parse(&artifact.config_json).expect("the config parses");
    let vocab = config.vocab_size;
    let model = DeepSeekV4::load(&artifact, config).expect("the model loads");
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let entry = oracle["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == prompt_name)
        .expect("the prompt is in the oracle");
    let prompt = ids(&entry["token_ids"]);
    let expected = read_logits(
        &fixture().join(entry["logits_file"].as_str().unwrap()),
        vocab,
    );
    assert_eq!(expected.len(), prompt.len());

    let margins: Vec<f32> = expected.iter().map(|row| top1_margin(row)).collect();
    let (greedy, worst) = follow_oracle(
        &model,
        &prompt,
        &expected,
        &margins,
        (TOLERANCE, MARGIN),
        prompt_name,
    );
    assert_eq!(greedy, ids(&entry["greedy_32"]), "{prompt_name}: greedy");
    eprintln!("{prompt_name}: max |logit delta| vs transformers {worst:.2e}");
}

#[test]
fn a_sentence_matches_transformers() {
    matches_transformers("sentence");
}

/// 40 positions: ten CSA windows (the indexer picks 3 of up to 9 visible entries), five HCA
/// windows, the sliding window passed many times over.
#[test]
fn forty_raw_ids_match_transformers() {
    matches_transformers("ids");
}

/// A prompt across two chunk boundaries (and many compressor windows) leaves the stepwise
/// cache: the last logits and the next step's have the same bits whichever way it ran.
#[test]
fn a_prompt_over_chunk_boundaries_gives_the_stepwise_bits() {
    let dir = packed();
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV4Config::parse(&artifact.config_json).unwrap();
    let model = DeepSeekV4::load(&artifact, config).unwrap();
    let prompt: Vec<u32> = (0..133u32).map(|i| (i * 97 + 11) % 512).collect();
    let mut stepped = model.new_cache();
    let mut last = Vec::new();
    for &t in &prompt {
        last = model
            .step(t, &mut stepped, &mut StepStats::default())
            .unwrap();
    }
    let mut chunked = model.new_cache();
    let at_once = model
        .prefill(&prompt, &mut chunked, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&at_once), bits(&last));
    let a = model
        .step(5, &mut stepped, &mut StepStats::default())
        .unwrap();
    let b = model
        .step(5, &mut chunked, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn a_bad_token_or_a_full_context_is_refused_before_the_cache_changes() {
    use minirun_stream::step::ModelError;
    let dir = packed();
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = DeepSeekV4Config::parse(&artifact.config_json).unwrap();
    let model = DeepSeekV4::load(&artifact, config).unwrap();
    let mut cache = model.new_cache();
    model
        .prefill(&[0, 17, 42], &mut cache, &mut StepStats::default())
        .unwrap();
    assert!(matches!(
        model.prefill(&[5, 512], &mut cache, &mut StepStats::default()),
        Err(ModelError::Token(512, 512))
    ));
    let long = vec![1u32; 4096];
    assert!(matches!(
        model.prefill(&long, &mut cache, &mut StepStats::default()),
        Err(ModelError::Position(4098, 4096))
    ));
    assert_eq!(cache.len, 3);
    let mut fresh = model.new_cache();
    model
        .prefill(&[0, 17, 42], &mut fresh, &mut StepStats::default())
        .unwrap();
    let a = model
        .step(5, &mut cache, &mut StepStats::default())
        .unwrap();
    let b = model
        .step(5, &mut fresh, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&a), bits(&b));
}
