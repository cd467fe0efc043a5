//! A Llama `config.json` (Llama 3.x as Meta and mlx-community publish it), read field by
//! field. Every number the forward pass uses must be present; a key this runtime does not
//! implement is refused by name; keys that cannot change the logits are listed in `INERT`.
//!
//! Dense Qwen3 is this architecture with a per-head RMSNorm of queries and keys: its own
//! reader (`models/qwen3/config.rs`) fills the same type, with `qk_norm` set.

use serde_json::{Map, Value};

use crate::blocks::rope::Llama3Scaling;
use crate::engine::config::{ConfigError, Fields, KnownKeys, eos_ids, top_object};

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `llama`, or `qwen3` for dense Qwen3.
    pub model_type: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    /// Llama 3.1's frequency rule (`rope_scaling.rope_type: llama3`), where set.
    pub rope_scaling: Option<Llama3Scaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Qwen3's RMSNorm of each query and key head (`q_norm`, `k_norm`) before the rotation.
    pub qk_norm: bool,
    pub eos_token_ids: Vec<u32>,
}

/// Keys that do not change a forward pass: training and serving details, and packaging (the
/// artifact's manifests say how each tensor is stored).
const INERT: &[&str] = &[
    "attention_dropout",
    "bos_token_id",
    "initializer_range",
    "pad_token_id",
    "quantization",
    "quantization_config",
    "use_cache",
];

/// Keys whose only implemented value is Llama's own.
const FIXED: &[(&str, &str)] = &[
    ("model_type", "\"llama\""),
    ("hidden_act", "\"silu\""),
    ("attention_bias", "false"),
    ("mlp_bias", "false"),
    // Hugging Face splits the products into this many slices when it is above 1; mlx-lm never
    // does, and the sums' order would differ.
    ("pretraining_tp", "1"),
    ("rope_traditional", "false"),
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
    "rope_scaling",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
];

impl LlamaConfig {
    pub fn parse(json: &str) -> Result<LlamaConfig, ConfigError> {
        let map = &top_object(json)?;
        KnownKeys {
            read: READ,
            inert: INERT,
            fixed: FIXED,
            why: "only the Llama architecture's value is",
        }
        .check(map)?;
        if map.get("model_type").is_none() {
            return Err(ConfigError::Missing("model_type".into()));
        }
        let f = Fields::top(map);
        let heads = f.size("num_attention_heads")?;
        let hidden = f.size("hidden_size")?;
        // Absent, null or 0 all mean the hidden size split evenly over the heads (mlx-lm's
        // and transformers' rule alike).
        let head_dim = match map.get("head_dim") {
            None | Some(Value::Null) => 0,
            Some(_) => f.count("head_dim")?,
        };
        let config = LlamaConfig {
            model_type: "llama",
            vocab_size: f.size("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: f.size("intermediate_size")?,
            num_hidden_layers: f.size("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: match map.get("num_key_value_heads") {
                None | Some(Value::Null) => heads,
                Some(_) => f.size("num_key_value_heads")?,
            },
            head_dim: match head_dim {
                0 => hidden / heads,
                d => d,
            },
            rms_norm_eps: f.float32("rms_norm_eps")?,
            rope_theta: f.float("rope_theta")?,
            rope_scaling: llama3_scaling(map)?,
            max_position_embeddings: f.size("max_position_embeddings")?,
            // mlx-lm takes an absent key as tied and transformers as untied: the references
            // disagree, so a config must say.
            tie_word_embeddings: f.flag("tie_word_embeddings")?,
            qk_norm: false,
            eos_token_ids: eos_ids(map.get("eos_token_id"), "eos_token_id")?,
        };
        config.check()?;
        Ok(config)
    }

    /// The shape rules of grouped-query attention: query heads share the key/value heads
    /// evenly, a head's width is even (RoPE rotates pairs).
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        let (heads, kv_heads) = (self.num_attention_heads, self.num_key_value_heads);
        if !heads.is_multiple_of(kv_heads) {
            return bad(format!(
                "{heads} attention heads do not share {kv_heads} key/value heads evenly"
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even and non-zero (RoPE rotates pairs)",
                self.head_dim
            ));
        }
        Ok(())
    }
}

/// `rope_scaling`: null, or Llama 3.1's rule (`rope_type` or `type` "llama3", as mlx-lm reads
/// it: `factor` required, the others defaulting as mlx-lm's `Llama3RoPE` does). Any other rule
/// is refused by name.
fn llama3_scaling(map: &Map<String, Value>) -> Result<Option<Llama3Scaling>, ConfigError> {
    let scaling = match map.get("rope_scaling") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(scaling)) => scaling,
        Some(_) => {
            return Err(ConfigError::Type {
                key: "rope_scaling".into(),
                expected: "null or an object",
            });
        }
    };
    let kind = scaling
        .get("type")
        .or_else(|| scaling.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind != "llama3" {
        return Err(ConfigError::Unsupported {
            key: "rope_scaling.rope_type".into(),
            value: format!("{kind:?}"),
            why: "only Llama 3.1's \"llama3\" rule is",
        });
    }
    const KEYS: [&str; 6] = [
        "type",
        "rope_type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ];
    if let Some(key) = scaling.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ConfigError::Unknown(format!("rope_scaling.{key}")));
    }
    let f = Fields::top(scaling);
    let or = |key: &str, default: f64| match scaling.get(key) {
        None => Ok(default),
        Some(_) => f.float(key),
    };
    let rule = Llama3Scaling {
        factor: f.float("factor")?,
        low_freq_factor: or("low_freq_factor", 1.0)?,
        high_freq_factor: or("high_freq_factor", 4.0)?,
        original_max_position_embeddings: or("original_max_position_embeddings", 8192.0)?,
    };
    let positive = [
        rule.factor,
        rule.low_freq_factor,
        rule.original_max_position_embeddings,
    ]
    .iter()
    .all(|&v| v > 0.0);
    if !positive || rule.high_freq_factor <= rule.low_freq_factor {
        return Err(ConfigError::Inconsistent(
            "rope_scaling: factor, low_freq_factor and original_max_position_embeddings must be positive, and high_freq_factor above low_freq_factor".into(),
        ));
    }
    Ok(Some(rule))
}
