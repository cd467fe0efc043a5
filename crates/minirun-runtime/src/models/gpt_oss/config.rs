//! A gpt-oss `config.json` (OpenAI's and mlx-lm's names), read field by field. Every number the
//! forward pass uses must be present; a key this runtime does not implement is refused by name;
//! keys that cannot change the logits are listed in `INERT`.

use serde_json::Value;

use crate::engine::config::{
    ConfigError, Fields, KnownKeys, Yarn, YarnKeys, check_grouped_moe, eos_ids, rope_scaling,
    top_object,
};

/// How one layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAttention {
    /// To the last `sliding_window` positions, its own included.
    Sliding,
    /// To every position so far.
    Full,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GptOssConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// One routed expert's width.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    pub sliding_window: usize,
    pub layer_types: Vec<LayerAttention>,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<Yarn>,
    /// The clamp of the experts' SwiGLU (`swiglu_limit`).
    pub swiglu_limit: f32,
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
}

/// The experts' SwiGLU's `α`: a constant of the architecture in both references (no config
/// key names it).
pub const SWIGLU_ALPHA: f32 = 1.702;

/// Keys that do not change a forward pass: training and serving details, packaging (the
/// artifact's manifests say how each tensor is stored), and the context the model was first
/// trained at (YaRN's `original_max_position_embeddings` is what the rotation reads).
const INERT: &[&str] = &[
    "attention_dropout",
    "bos_token_id",
    "initial_context_length",
    "initializer_range",
    "output_router_logits",
    "pad_token_id",
    "quantization",
    "quantization_config",
    "router_aux_loss_coef",
    "use_cache",
];

/// Keys whose only implemented value is gpt-oss's own.
const FIXED: &[(&str, &str)] = &[
    ("model_type", "\"gpt_oss\""),
    // The experts' activation is SwiGLU-OAI whatever this says: both references ignore it.
    ("hidden_act", "\"silu\""),
    ("attention_bias", "true"),
    ("tie_word_embeddings", "false"),
];

const READ: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_local_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "sliding_window",
    "layer_types",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "swiglu_limit",
    "max_position_embeddings",
    "eos_token_id",
];

impl GptOssConfig {
    pub fn parse(json: &str) -> Result<GptOssConfig, ConfigError> {
        let map = &top_object(json)?;
        KnownKeys {
            read: READ,
            inert: INERT,
            fixed: FIXED,
            why: "only the gpt-oss architecture's value is",
        }
        .check(map)?;
        if map.get("model_type").is_none() {
            return Err(ConfigError::Missing("model_type".into()));
        }
        let f = Fields::top(map);
        let num_hidden_layers = f.size("num_hidden_layers")?;
        let config = GptOssConfig {
            vocab_size: f.size("vocab_size")?,
            hidden_size: f.size("hidden_size")?,
            intermediate_size: f.size("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads: f.size("num_attention_heads")?,
            num_key_value_heads: f.size("num_key_value_heads")?,
            head_dim: f.size("head_dim")?,
            num_local_experts: f.size("num_local_experts")?,
            num_experts_per_tok: experts_per_token(&f)?,
            sliding_window: f.size("sliding_window")?,
            layer_types: layer_types(map.get("layer_types"), num_hidden_layers)?,
            rms_norm_eps: f.float32("rms_norm_eps")?,
            rope_theta: f.float("rope_theta")?,
            rope_scaling: rope_scaling(f.get("rope_scaling")?, YarnKeys::GptOss)?,
            swiglu_limit: match map.get("swiglu_limit") {
                // Both references' value when the key is absent (mlx-lm never reads it).
                None => 7.0,
                Some(_) => f.float32("swiglu_limit")?,
            },
            max_position_embeddings: f.size("max_position_embeddings")?,
            eos_token_ids: eos_ids(map.get("eos_token_id"), "eos_token_id")?,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        check_grouped_moe(
            (
                self.num_attention_heads,
                self.num_key_value_heads,
                self.head_dim,
            ),
            (self.num_experts_per_tok, self.num_local_experts),
        )?;
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        if self.swiglu_limit <= 0.0 {
            return bad("swiglu_limit must be positive".into());
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

/// `num_experts_per_tok`, and `experts_per_token` (OpenAI's configs carry both) agreeing with it.
fn experts_per_token(f: &Fields) -> Result<usize, ConfigError> {
    let k = f.size("num_experts_per_tok")?;
    if f.map.contains_key("experts_per_token") && f.size("experts_per_token")? != k {
        return Err(ConfigError::Inconsistent(format!(
            "experts_per_token differs from num_experts_per_tok ({k})"
        )));
    }
    Ok(k)
}

/// `layer_types`, one per layer. Absent, both references alternate sliding and full from the
/// first layer; with an odd layer count they disagree (mlx-lm's list is a layer short), so the
/// config must say.
fn layer_types(v: Option<&Value>, layers: usize) -> Result<Vec<LayerAttention>, ConfigError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        if !layers.is_multiple_of(2) {
            return Err(ConfigError::Missing(format!(
                "layer_types (with {layers} layers, an odd count, the references' defaults differ)"
            )));
        }
        return Ok((0..layers)
            .map(|i| match i % 2 {
                0 => LayerAttention::Sliding,
                _ => LayerAttention::Full,
            })
            .collect());
    };
    let kinds = v.as_array().ok_or_else(|| ConfigError::Type {
        key: "layer_types".into(),
        expected: "a list of \"sliding_attention\" or \"full_attention\"",
    })?;
    if kinds.len() != layers {
        return Err(ConfigError::Inconsistent(format!(
            "layer_types lists {} layers; num_hidden_layers is {layers}",
            kinds.len()
        )));
    }
    kinds
        .iter()
        .map(|kind| match kind.as_str() {
            Some("sliding_attention") => Ok(LayerAttention::Sliding),
            Some("full_attention") => Ok(LayerAttention::Full),
            _ => Err(ConfigError::Unsupported {
                key: "layer_types".into(),
                value: kind.to_string(),
                why: "only \"sliding_attention\" and \"full_attention\" are",
            }),
        })
        .collect()
}
