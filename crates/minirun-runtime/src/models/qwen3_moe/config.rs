//! A Qwen3-MoE `config.json` (Hugging Face's and mlx-lm's names), read field by field. Every
//! number the forward pass uses must be present; a key this runtime does not implement is
//! refused by name; keys that cannot change the logits are listed in `INERT`.

use serde_json::Value;

use crate::engine::config::{
    ConfigError, Fields, KnownKeys, check_grouped_moe, eos_ids, top_object,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3MoeConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The dense layers' MLP width.
    pub intermediate_size: usize,
    /// One routed expert's width.
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Every `decoder_sparse_step`-th layer (counting from 1) is sparse, unless listed in
    /// `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub norm_topk_prob: bool,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
}

/// Keys that do not change a forward pass: training and serving details, packaging (the
/// artifact's manifests say how each tensor is stored), and the sliding window, which
/// `use_sliding_window: false` (fixed below) turns off.
const INERT: &[&str] = &[
    "attention_dropout",
    "bos_token_id",
    "initializer_range",
    "max_window_layers",
    "output_router_logits",
    "pad_token_id",
    "quantization",
    "quantization_config",
    "router_aux_loss_coef",
    "sliding_window",
    "use_cache",
];

/// Keys whose only implemented value is Qwen3-MoE's own.
const FIXED: &[(&str, &str)] = &[
    ("model_type", "\"qwen3_moe\""),
    ("hidden_act", "\"silu\""),
    ("attention_bias", "false"),
    ("use_sliding_window", "false"),
    // mlx-lm's Qwen3-MoE ignores rope_scaling (YaRN beyond the native context); running a
    // config that sets it would compute other logits than the reference does.
    ("rope_scaling", "null"),
];

const READ: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_experts",
    "num_experts_per_tok",
    "decoder_sparse_step",
    "mlp_only_layers",
    "norm_topk_prob",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
];

impl Qwen3MoeConfig {
    pub fn parse(json: &str) -> Result<Qwen3MoeConfig, ConfigError> {
        let map = &top_object(json)?;
        KnownKeys {
            read: READ,
            inert: INERT,
            fixed: FIXED,
            why: "only the Qwen3-MoE architecture's value is",
        }
        .check(map)?;
        if map.get("model_type").is_none() {
            return Err(ConfigError::Missing("model_type".into()));
        }
        let f = Fields::top(map);
        let config = Qwen3MoeConfig {
            vocab_size: f.size("vocab_size")?,
            hidden_size: f.size("hidden_size")?,
            intermediate_size: f.size("intermediate_size")?,
            moe_intermediate_size: f.size("moe_intermediate_size")?,
            num_hidden_layers: f.size("num_hidden_layers")?,
            num_attention_heads: f.size("num_attention_heads")?,
            num_key_value_heads: f.size("num_key_value_heads")?,
            head_dim: f.size("head_dim")?,
            num_experts: f.size("num_experts")?,
            num_experts_per_tok: f.size("num_experts_per_tok")?,
            decoder_sparse_step: f.size("decoder_sparse_step")?,
            mlp_only_layers: f.layers("mlp_only_layers")?,
            norm_topk_prob: f.flag("norm_topk_prob")?,
            rms_norm_eps: f.float32("rms_norm_eps")?,
            rope_theta: f.float("rope_theta")?,
            max_position_embeddings: f.size("max_position_embeddings")?,
            tie_word_embeddings: match map.get("tie_word_embeddings") {
                None | Some(Value::Null) => false,
                Some(_) => f.flag("tie_word_embeddings")?,
            },
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
            (self.num_experts_per_tok, self.num_experts),
        )?;
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        if let Some(&past) = self
            .mlp_only_layers
            .iter()
            .find(|&&l| l >= self.num_hidden_layers)
        {
            return bad(format!(
                "mlp_only_layers names layer {past}; the model has {} layers",
                self.num_hidden_layers
            ));
        }
        Ok(())
    }

    /// Whether layer `i` routes to experts (mlx-lm's and transformers' rule).
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}
