//! Kimi K3 against mlx-lm: each tiny K3 checkpoint under `tests/data/kimi-k3/` (made by
//! `tools/make_k3_fixtures.py`, which records mlx-lm 0.32.2's float32 logits of the full prompt
//! pass) is packed with `minirun pack`'s library, loaded from the artifact and run one token at
//! a time. At every prompt position the logits must be within `TOLERANCE` of mlx-lm's, and the
//! top-1 token the same wherever mlx-lm's top-1 margin exceeds `MARGIN`; the 32-token greedy
//! continuation must be mlx-lm's.
//!
//! Why `TOLERANCE` = 1e-4: both sides compute in f32 on the same stored bits and differ only in
//! the order of their sums; mlx-lm's own full pass and its one-token steps differ by up to
//! 2e-6 on these models (`stepwise_max_abs_delta`). A real error (a dropped scaling factor, a
//! misordered convolution tap, a block closed one layer late) moves logits by 0.01 or more.
//! Some positions' top-1 margins are under 1e-2, so the argmax is compared only above `MARGIN`.

mod common;

use std::path::{Path, PathBuf};

use common::{bits, follow_oracle, ids, read_logits};
use minirun_pack::{PackOptions, pack};
use minirun_runtime::Decoder;
use minirun_runtime::models::kimi_k3::KimiK3;
use minirun_runtime::models::kimi_k3::config::KimiK3Config;
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::step::{ModelError, StepStats};
use serde_json::Value;

const TOLERANCE: f32 = 1e-4;
const MARGIN: f32 = 1e-3;

fn fixture(variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kimi-k3")
        .join(variant)
}

fn packed(variant: &str) -> tempfile::TempDir {
    let out = tempfile::tempdir().expect("a temporary directory");
    pack(
        &fixture(variant),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .expect("it packs");
    out
}

fn matches_mlx(variant: &str) {
    let dir = packed(variant);
    let artifact = Artifact::open(dir.path(), Access::Unverified).expect("the artifact opens");
    let config = KimiK3Config::parse(&artifact.config_json).expect("the config parses");
    let vocab = config.vocab_size;
    let model = KimiK3::load(&artifact, config).expect("the model loads");
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture(variant).join("oracle.json")).unwrap())
            .unwrap();
    let prompt = ids(&oracle["prompt_token_ids"]);
    let margins: Vec<f32> = oracle["top1_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap() as f32)
        .collect();
    let expected = read_logits(&fixture(variant).join("logits.f32"), vocab);

    let (greedy, worst) = follow_oracle(
        &model,
        &prompt,
        &expected,
        &margins,
        (TOLERANCE, MARGIN),
        variant,
    );
    assert_eq!(
        greedy,
        ids(&oracle["greedy_token_ids"]),
        "{variant}: greedy"
    );
    eprintln!("{variant}: max |logit delta| vs mlx-lm {worst:.2e}");
}

#[test]
fn mlx_affine4_group64_matches_mlx_lm() {
    matches_mlx("mlx-affine4-g64");
}

#[test]
fn mlx_mxfp4_matches_mlx_lm() {
    matches_mlx("mlx-mxfp4");
}

#[test]
fn experts_only_mxfp4_as_published_matches_mlx_lm() {
    matches_mlx("mlx-k3mix");
}

/// The same weights under the upstream (Hugging Face) names, which the published K3 artifact
/// uses too: separate q/k/v projections and convolutions, a whole `kv_b_proj`, per-expert
/// `block_sparse_moe.experts.E.w1/w3/w2`, `A_log` padded with zeros. mlx-lm maps them back to
/// exactly mlx-k3mix's model, so its oracle is this checkpoint's.
#[test]
fn hugging_face_names_match_mlx_lm() {
    matches_mlx("hf-k3mix");
}

#[test]
fn a_bad_token_is_refused_before_the_cache_changes() {
    let dir = packed("mlx-mxfp4");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = KimiK3Config::parse(&artifact.config_json).unwrap();
    let model = KimiK3::load(&artifact, config).unwrap();
    let mut cache = model.new_cache();
    let first = model
        .prefill(&[0, 17, 42], &mut cache, &mut StepStats::default())
        .unwrap();
    assert!(matches!(
        model.prefill(&[5, 512], &mut cache, &mut StepStats::default()),
        Err(ModelError::Token(512, 512))
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
    assert!(!first.is_empty());
}

/// A prompt across two chunk boundaries leaves the stepwise cache: the next step's logits have
/// the same bits whichever way the prompt ran.
#[test]
fn a_prompt_across_chunks_gives_the_stepwise_bits() {
    let dir = packed("mlx-k3mix");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = KimiK3Config::parse(&artifact.config_json).unwrap();
    let model = KimiK3::load(&artifact, config).unwrap();
    let prompt: Vec<u32> = (0..2 * minirun_runtime::PREFILL_CHUNK as u32 + 5)
        .map(|i| (i * 37 + 11) % 512)
        .collect();
    let mut stepped = model.new_cache();
    let mut last = Vec::new();
    for &token in &prompt {
        last = model
            .step(token, &mut stepped, &mut StepStats::default())
            .unwrap();
    }
    let mut chunked = model.new_cache();
    let at_once = model
        .prefill(&prompt, &mut chunked, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&at_once), bits(&last));
    let a = model
        .step(3, &mut stepped, &mut StepStats::default())
        .unwrap();
    let b = model
        .step(3, &mut chunked, &mut StepStats::default())
        .unwrap();
    assert_eq!(bits(&a), bits(&b));
}
