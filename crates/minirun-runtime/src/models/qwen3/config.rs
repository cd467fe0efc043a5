//! A dense Qwen3 `config.json` (Qwen3-0.6B to Qwen3-32B, Hugging Face's and mlx-lm's names),
//! read field by field into the Llama model's config with its q/k norms on: dense Qwen3 is
//! Llama's architecture with a per-head RMSNorm of queries and keys. Every number the forward
//! pass uses must be present (mlx-lm requires each of them too); a key this runtime does not
//! implement is refused by name; keys that cannot change the logits are listed in `INERT`.

use crate::engine::config::{ConfigError, Fields, KnownKeys, eos_ids, top_object};
use crate::models::llama::LlamaConfig;

/// Keys that do not change a forward pass: training and serving details, packaging (the
/// artifact's manifests say how each tensor is stored), and the sliding window, which
/// `use_sliding_window: false` (fixed below) turns off.
const INERT: &[&str] = &[
    "attention_dropout",
    "bos_token_id",
    "initializer_range",
    "max_window_layers",
    "pad_token_id",
    "quantization",
    "quantization_config",
    "sliding_window",
    "use_cache",
];

/// Keys whose only implemented value is dense Qwen3's own.
const FIXED: &[(&str, &str)] = &[
    ("model_type", "\"qwen3\""),
    ("hidden_act", "\"silu\""),
    ("attention_bias", "false"),
    ("use_sliding_window", "false"),
    // mlx-lm's Qwen3 honours rope_scaling (YaRN beyond the native context); every published
    // dense Qwen3 sets none, and this runtime implements none for it.
    ("rope_scaling", "null"),
];

const READ: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
];

/// Dense Qwen3's config as the Llama model runs it.
pub fn parse(json: &str) -> Result<LlamaConfig, ConfigError> {
    let map = &top_object(json)?;
    KnownKeys {
        read: READ,
        inert: INERT,
        fixed: FIXED,
        why: "only the Qwen3 architecture's value is",
    }
    .check(map)?;
    if map.get("model_type").is_none() {
        return Err(ConfigError::Missing("model_type".into()));
    }
    let f = Fields::top(map);
    let config = LlamaConfig {
        model_type: "qwen3",
        vocab_size: f.size("vocab_size")?,
        hidden_size: f.size("hidden_size")?,
        intermediate_size: f.size("intermediate_size")?,
        num_hidden_layers: f.size("num_hidden_layers")?,
        num_attention_heads: f.size("num_attention_heads")?,
        num_key_value_heads: f.size("num_key_value_heads")?,
        head_dim: f.size("head_dim")?,
        rms_norm_eps: f.float32("rms_norm_eps")?,
        rope_theta: f.float("rope_theta")?,
        rope_scaling: None,
        max_position_embeddings: f.size("max_position_embeddings")?,
        tie_word_embeddings: f.flag("tie_word_embeddings")?,
        qk_norm: true,
        eos_token_ids: eos_ids(map.get("eos_token_id"), "eos_token_id")?,
    };
    config.check()?;
    Ok(config)
}
