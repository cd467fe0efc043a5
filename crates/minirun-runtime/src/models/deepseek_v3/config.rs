//! A DeepSeek-V3-family `config.json`, read field by field (mlx-lm / Hugging Face names).
//! Every number the forward pass uses must be present; a key this runtime does not implement
//! is refused by name, never ignored; keys that cannot change the logits (training, serving
//! and packaging details) are listed in `INERT`.

use serde_json::Value;

use crate::engine::config::{
    ConfigError, Fields, KnownKeys, Yarn, YarnKeys, eos_ids, rope_scaling, top_object,
};

#[derive(Debug, Clone, PartialEq)]
pub struct DeepSeekV3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub first_k_dense_replace: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub rope_scaling: Option<Yarn>,
    pub eos_token_ids: Vec<u32>,
}

/// Keys that do not change a forward pass: training hyper-parameters, serving hints, and
/// packaging (the artifact's manifests, not these keys, say how each tensor is stored).
const INERT: &[&str] = &[
    "attention_dropout",
    "auto_map",
    "aux_loss_alpha",
    "bos_token_id",
    "ep_size",
    "initializer_range",
    "num_key_value_heads",
    "num_nextn_predict_layers",
    "pad_token_id",
    "pretraining_tp",
    "quantization",
    "quantization_config",
    "seq_aux",
    "use_cache",
];

/// Keys whose only implemented value is DeepSeek-V3's: present with another value, refused.
/// (Absent, they mean that value: it is the architecture, not a guessed number.)
const FIXED: &[(&str, &str)] = &[
    ("model_type", "\"deepseek_v3\""),
    ("hidden_act", "\"silu\""),
    ("scoring_func", "\"sigmoid\""),
    ("topk_method", "\"noaux_tc\""),
    ("moe_layer_freq", "1"),
    ("attention_bias", "false"),
    ("tie_word_embeddings", "false"),
    ("rope_interleave", "true"),
];

const NUMBERS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "norm_topk_prob",
    "first_k_dense_replace",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "rope_scaling",
    "eos_token_id",
];

impl DeepSeekV3Config {
    pub fn parse(json: &str) -> Result<DeepSeekV3Config, ConfigError> {
        let map = &top_object(json)?;
        KnownKeys {
            read: NUMBERS,
            inert: INERT,
            fixed: FIXED,
            why: "only the DeepSeek-V3 architecture's value is",
        }
        .check(map)?;
        if map.get("model_type").is_none() {
            return Err(ConfigError::Missing("model_type".into()));
        }
        let f = Fields::top(map);
        let q_lora_rank = match f.get("q_lora_rank")? {
            Value::Null => None,
            _ => Some(f.size("q_lora_rank")?),
        };
        let norm_topk_prob = f
            .get("norm_topk_prob")?
            .as_bool()
            .ok_or(ConfigError::Type {
                key: "norm_topk_prob".into(),
                expected: "true or false",
            })?;
        let config = DeepSeekV3Config {
            vocab_size: f.size("vocab_size")?,
            hidden_size: f.size("hidden_size")?,
            intermediate_size: f.size("intermediate_size")?,
            moe_intermediate_size: f.size("moe_intermediate_size")?,
            num_hidden_layers: f.size("num_hidden_layers")?,
            num_attention_heads: f.size("num_attention_heads")?,
            q_lora_rank,
            kv_lora_rank: f.size("kv_lora_rank")?,
            qk_rope_head_dim: f.size("qk_rope_head_dim")?,
            qk_nope_head_dim: f.size("qk_nope_head_dim")?,
            v_head_dim: f.size("v_head_dim")?,
            n_routed_experts: f.size("n_routed_experts")?,
            // null is mlx-lm's and Hugging Face's way of saying "no shared experts".
            n_shared_experts: match f.get("n_shared_experts")? {
                Value::Null => 0,
                _ => f.count("n_shared_experts")?,
            },
            num_experts_per_tok: f.size("num_experts_per_tok")?,
            n_group: f.size("n_group")?,
            topk_group: f.size("topk_group")?,
            routed_scaling_factor: f.float("routed_scaling_factor")? as f32,
            norm_topk_prob,
            first_k_dense_replace: f.count("first_k_dense_replace")?,
            rms_norm_eps: f.float("rms_norm_eps")? as f32,
            rope_theta: f.float("rope_theta")?,
            max_position_embeddings: f.size("max_position_embeddings")?,
            rope_scaling: rope_scaling(f.get("rope_scaling")?, YarnKeys::DeepSeek)?,
            eos_token_ids: eos_ids(map.get("eos_token_id"), "eos_token_id")?,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        if !self.n_routed_experts.is_multiple_of(self.n_group) {
            return bad(format!(
                "{} routed experts do not split into {} groups",
                self.n_routed_experts, self.n_group
            ));
        }
        if self.topk_group > self.n_group {
            return bad(format!(
                "topk_group {} exceeds n_group {}",
                self.topk_group, self.n_group
            ));
        }
        let in_groups = self.topk_group * (self.n_routed_experts / self.n_group);
        if self.num_experts_per_tok > in_groups {
            return bad(format!(
                "{} experts per token cannot come from {in_groups} experts in the chosen groups",
                self.num_experts_per_tok
            ));
        }
        if self.n_routed_experts / self.n_group < 2 && self.n_group > 1 {
            return bad(
                "group scores sum each group's top 2 experts: groups need at least 2".into(),
            );
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return bad("qk_rope_head_dim must be even".into());
        }
        Ok(())
    }

    /// Whether layer `i` is a mixture-of-experts layer.
    pub fn is_moe(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
    }

    pub fn q_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}
