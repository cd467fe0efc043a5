//! Qwen3-MoE against mlx-lm, and as `minirun run` runs it. Each tiny checkpoint under
//! `tests/data/qwen3-moe/` (made by `tools/make_qwen3_moe_fixtures.py`, which records mlx-lm
//! 0.32.2's float32 logits) is packed, loaded and stepped one token at a time: every position
//! within `TOLERANCE` of mlx-lm's with its top-1, the prompt prefilled at once giving the stepped
//! bits, the 32-token greedy continuation identical (`common::follow_oracle`).
//! Streamed at the floor and at the deterministic floor: `tests/streamed_architectures.rs`.
//!
//! `TOLERANCE` is the DeepSeek-V3 oracle's (`tests/deepseek_v3_oracle.rs` says why 2e-4): both sides compute
//! in f32 from the same stored bits in different orders, so they differ by rounding only, while
//! a wrong scale, rotation or expert moves logits by 0.1 or more. The fixtures keep every top-1
//! margin above 2e-3 and every routing decision's router-logit gap above 1e-4.

mod common;

use std::path::PathBuf;

use minirun_runtime::ConfigError;
use minirun_runtime::models::qwen3_moe::{Qwen3Moe, Qwen3MoeConfig};
use minirun_stream::artifact::{Access, Artifact};
use serde_json::Value;

const TOLERANCE: f32 = 2e-4;

fn fixture(variant: &str) -> PathBuf {
    common::data("qwen3-moe").join(variant)
}

fn packed(variant: &str) -> tempfile::TempDir {
    common::packed_from(&fixture(variant))
}

fn oracle(variant: &str) -> Value {
    common::json_file(&fixture(variant).join("oracle.json"))
}

fn matches_mlx(variant: &str) {
    let dir = packed(variant);
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let config = Qwen3MoeConfig::parse(&artifact.config_json).unwrap();
    let model = Qwen3Moe::load(&artifact, config).unwrap();
    let oracle = oracle(variant);
    assert_eq!(oracle["mlx_lm"], "0.32.2");
    let worst = common::follow_every_prompt(&model, &fixture(variant), &oracle, TOLERANCE, variant);
    eprintln!("{variant}: max |logit delta| vs mlx-lm {worst:.2e}");
}

#[test]
fn mlx_affine4_group64_matches_mlx_lm() {
    matches_mlx("mlx-affine4-g64");
}

/// No dense layer, tied embeddings, routing weights not renormalised, 8-bit experts.
#[test]
fn mlx_affine8_tied_unnormalised_matches_mlx_lm() {
    matches_mlx("mlx-affine8-g32-alt");
}

/// Hugging Face's layout: per-expert tensors, BF16.
#[test]
fn hugging_face_bf16_matches_mlx_lm() {
    matches_mlx("hf-bf16");
}

/// The tiny fixtures hold their layers at the floor (16 KiB-aligned buffers for two of their
/// small layers cost more than holding all four) and stream their experts; a generated
/// checkpoint with more layers streams every layer's attention and router at the floor too. Both
/// with the resident run's logit bits and exactly the plan's bytes, on 1 and 2 threads, with
/// read-ahead on and off.
/// Qwen's FP8 layout: F8_E4M3 projections with BF16 `weight_scale_inv` per 128 x 128 block.
#[test]
fn hugging_face_fp8_with_bf16_block_scales_matches_mlx_lm() {
    matches_mlx("hf-fp8");
}

#[test]
fn what_qwen3_moe_does_not_implement_is_refused_by_name() {
    let config: Value =
        serde_json::from_slice(&std::fs::read(fixture("hf-bf16").join("config.json")).unwrap())
            .unwrap();
    let with = |key: &str, value: Value| {
        let mut c = config.clone();
        c[key] = value;
        Qwen3MoeConfig::parse(&c.to_string())
    };
    assert!(with("rms_norm_eps", Value::from(1e-6)).is_ok());
    let yarn = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    assert!(matches!(
        with("rope_scaling", yarn),
        Err(ConfigError::Unsupported { key, .. }) if key == "rope_scaling"
    ));
    assert!(matches!(
        with("use_sliding_window", Value::Bool(true)),
        Err(ConfigError::Unsupported { key, .. }) if key == "use_sliding_window"
    ));
    assert!(matches!(
        with("some_new_knob", Value::from(1)),
        Err(ConfigError::Unknown(key)) if key == "some_new_knob"
    ));
    assert!(matches!(
        with("num_key_value_heads", Value::from(3)),
        Err(ConfigError::Inconsistent(_))
    ));
    assert!(matches!(
        with("mlp_only_layers", serde_json::json!([9])),
        Err(ConfigError::Inconsistent(_))
    ));
    let mut no_head_dim = config.clone();
    no_head_dim.as_object_mut().unwrap().remove("head_dim");
    assert!(matches!(
        Qwen3MoeConfig::parse(&no_head_dim.to_string()),
        Err(ConfigError::Missing(key)) if key == "head_dim"
    ));
}
