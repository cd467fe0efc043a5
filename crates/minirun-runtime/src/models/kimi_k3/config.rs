//! A Kimi K3 `config.json` (`model_type: "kimi_k3"`), read fail-closed: the text model's
//! fields under `text_config` (KDA ones under `text_config.linear_attn_config`) as mlx-lm's
//! `kimi_k3` reads them. Every key is one of: used by the forward pass, fixed to the one value
//! the architecture has, or set aside by name (the vision tower's keys, generation and
//! packaging bookkeeping), which the parse reports. Anything else is refused.

use serde_json::{Map, Value};

use crate::engine::config::{ConfigError, Fields, WRITTEN_BY_TRANSFORMERS, eos_ids};

/// The linear-attention (Kimi Delta Attention) layers' settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KdaConfig {
    /// The KDA layers, 0-indexed (the config lists them 1-indexed); every other layer is MLA.
    pub layers: Vec<usize>,
    pub num_heads: usize,
    pub head_dim: usize,
    pub short_conv_kernel_size: usize,
    pub gate_lower_bound: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KimiK3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub kda: KdaConfig,
    pub situ_beta: f32,
    pub situ_linear_beta: f32,
    pub attn_res_block_size: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub mla_use_output_gate: bool,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub moe_renormalize: bool,
    pub routed_scaling_factor: f32,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub num_expert_group: usize,
    pub topk_group: usize,
    /// The latent width the routed experts work in (`routed_expert_down_proj` maps to it).
    pub routed_expert_hidden_size: usize,
    pub latent_moe_use_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub eos_token_ids: Vec<u32>,
    /// Keys present and set aside by name (dotted paths), for the run's report.
    pub set_aside: Vec<String>,
}

/// Top-level keys besides `model_type` and `text_config`: the vision tower's, and bookkeeping.
const TOP_SET_ASIDE: &[&str] = &[
    "auto_map",
    "bos_token_id",
    "eos_token_id",
    "ignore_index",
    "image_placeholder",
    "media_placeholder_token_id",
    "pad_token_id",
    "quantization",
    "quantization_config",
    "tie_word_embeddings",
    "vision_config",
];

/// `text_config` keys that cannot change the text model's logits: Hugging Face's generation
/// and bookkeeping defaults, packaging (the artifact's manifests say how each tensor is stored),
/// and fields mlx-lm's `kimi_k3` has but never reads.
const TEXT_SET_ASIDE: &[&str] = &[
    "add_cross_attention",
    "auto_map",
    "bad_words_ids",
    "begin_suppress_tokens",
    "bos_token_id",
    "chunk_size_feed_forward",
    "cross_attention_hidden_size",
    "decoder_start_token_id",
    "diversity_penalty",
    "do_sample",
    "early_stopping",
    "encoder_no_repeat_ngram_size",
    "exponential_decay_length_penalty",
    "finetuning_task",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "id2label",
    "initializer_range",
    "is_decoder",
    "is_encoder_decoder",
    "label2id",
    "length_penalty",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "num_beam_groups",
    "num_beams",
    "num_key_value_heads",
    "num_nextn_predict_layers",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "pad_token_id",
    "prefix",
    "problem_type",
    "pruned_heads",
    "quantization_config",
    "remove_invalid_values",
    "repetition_penalty",
    "return_dict",
    "return_dict_in_generate",
    "sep_token_id",
    "suppress_tokens",
    "task_specific_params",
    "temperature",
    "tf_legacy_loss",
    "tie_encoder_decoder",
    "tokenizer_class",
    "top_k",
    "top_p",
    "torchscript",
    "typical_p",
    "use_bfloat16",
    "use_cache",
    "use_grouped_topk",
];

/// Keys whose only implemented value is the architecture's own.
const TEXT_FIXED: &[(&str, &str, &str)] = &[
    (
        "model_type",
        "\"kimi_linear\"",
        "the K3 text model names itself kimi_linear",
    ),
    ("hidden_act", "\"situ\"", "K3's MLPs use SiTU"),
    (
        "moe_router_activation_func",
        "\"sigmoid\"",
        "K3 routes with sigmoid scores",
    ),
    ("mla_use_nope", "true", "K3's MLA layers use no RoPE"),
    (
        "topk_method",
        "\"noaux_tc\"",
        "routing is top-k of the bias-corrected scores",
    ),
];

const TEXT_USED: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "rms_norm_eps",
    "linear_attn_config",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "attn_res_block_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "mla_use_output_gate",
    "num_experts",
    "num_experts_per_token",
    "num_shared_experts",
    "moe_intermediate_size",
    "moe_renormalize",
    "routed_scaling_factor",
    "first_k_dense_replace",
    "moe_layer_freq",
    "num_expert_group",
    "topk_group",
    "routed_expert_hidden_size",
    "latent_moe_use_norm",
    "tie_word_embeddings",
    "max_position_embeddings",
    "eos_token_id",
];

const KDA_KEYS: &[&str] = &[
    "kda_layers",
    "full_attn_layers",
    "num_heads",
    "head_dim",
    "short_conv_kernel_size",
    "gate_lower_bound",
    "use_full_rank_gate",
];

/// Checks every key of `map` is known, returning the set-aside ones as dotted paths.
fn classify(
    map: &Map<String, Value>,
    prefix: &str,
    known: &[&[&str]],
    set_aside: &[&[&str]],
) -> Result<Vec<String>, ConfigError> {
    let mut aside = Vec::new();
    for key in map.keys() {
        if set_aside.iter().any(|list| list.contains(&key.as_str())) {
            aside.push(format!("{prefix}{key}"));
        } else if !known.iter().any(|list| list.contains(&key.as_str())) {
            return Err(ConfigError::Unknown(format!("{prefix}{key}")));
        }
    }
    Ok(aside)
}

fn object<'a>(value: &'a Value, key: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value.as_object().ok_or_else(|| ConfigError::Type {
        key: key.to_string(),
        expected: "an object",
    })
}

impl KimiK3Config {
    pub fn parse(json: &str) -> Result<KimiK3Config, ConfigError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| ConfigError::NotJson(e.to_string()))?;
        let top = object(&value, "config.json")
            .map_err(|_| ConfigError::NotJson("not an object".into()))?;
        match top.get("model_type").and_then(Value::as_str) {
            Some("kimi_k3") => {}
            Some(other) => {
                return Err(ConfigError::Unsupported {
                    key: "model_type".into(),
                    value: format!("{other:?}"),
                    why: "this reader is for \"kimi_k3\"",
                });
            }
            None => return Err(ConfigError::Missing("model_type".into())),
        }
        let text = match top.get("text_config") {
            Some(text) => object(text, "text_config")?,
            None => {
                return Err(ConfigError::Missing(
                    "text_config (K3 keeps its text model's fields there; a flat config is not K3's published form)"
                        .into(),
                ));
            }
        };
        let mut set_aside = classify(
            top,
            "",
            &[&["model_type", "text_config"]],
            &[WRITTEN_BY_TRANSFORMERS, TOP_SET_ASIDE],
        )?;
        let fixed: Vec<&str> = TEXT_FIXED.iter().map(|(k, _, _)| *k).collect();
        set_aside.extend(classify(
            text,
            "text_config.",
            &[TEXT_USED, &fixed],
            &[WRITTEN_BY_TRANSFORMERS, TEXT_SET_ASIDE],
        )?);
        for (key, expected, why) in TEXT_FIXED {
            let got = text
                .get(*key)
                .ok_or_else(|| ConfigError::Missing(format!("text_config.{key}")))?;
            if serde_json::from_str::<Value>(expected).ok().as_ref() != Some(got) {
                return Err(ConfigError::Unsupported {
                    key: format!("text_config.{key}"),
                    value: got.to_string(),
                    why,
                });
            }
        }
        let f = Fields {
            map: text,
            prefix: "text_config.",
        };
        let tie_word_embeddings = f.flag("tie_word_embeddings")?;
        if let Some(top_tie) = top.get("tie_word_embeddings")
            && top_tie.as_bool() != Some(tie_word_embeddings)
        {
            return Err(ConfigError::Inconsistent(
                "tie_word_embeddings differs between the top level and text_config".into(),
            ));
        }
        let num_hidden_layers = f.size("num_hidden_layers")?;
        let config = KimiK3Config {
            vocab_size: f.size("vocab_size")?,
            hidden_size: f.size("hidden_size")?,
            num_hidden_layers,
            num_attention_heads: f.size("num_attention_heads")?,
            intermediate_size: f.size("intermediate_size")?,
            rms_norm_eps: f.float32("rms_norm_eps")?,
            kda: kda(
                object(
                    f.get("linear_attn_config")?,
                    "text_config.linear_attn_config",
                )?,
                num_hidden_layers,
            )?,
            situ_beta: f.float32("activation_situ_beta")?,
            situ_linear_beta: f.float32("activation_situ_linear_beta")?,
            attn_res_block_size: f.size("attn_res_block_size")?,
            q_lora_rank: f.size("q_lora_rank")?,
            kv_lora_rank: f.size("kv_lora_rank")?,
            qk_nope_head_dim: f.size("qk_nope_head_dim")?,
            qk_rope_head_dim: f.size("qk_rope_head_dim")?,
            v_head_dim: f.size("v_head_dim")?,
            mla_use_output_gate: f.flag("mla_use_output_gate")?,
            num_experts: f.size("num_experts")?,
            num_experts_per_token: f.size("num_experts_per_token")?,
            num_shared_experts: f.count("num_shared_experts")?,
            moe_intermediate_size: f.size("moe_intermediate_size")?,
            moe_renormalize: f.flag("moe_renormalize")?,
            routed_scaling_factor: f.float32("routed_scaling_factor")?,
            first_k_dense_replace: f.count("first_k_dense_replace")?,
            moe_layer_freq: f.size("moe_layer_freq")?,
            num_expert_group: f.size("num_expert_group")?,
            topk_group: f.size("topk_group")?,
            routed_expert_hidden_size: f.size("routed_expert_hidden_size")?,
            latent_moe_use_norm: f.flag("latent_moe_use_norm")?,
            tie_word_embeddings,
            max_position_embeddings: f.size("max_position_embeddings")?,
            eos_token_ids: eos_ids(text.get("eos_token_id"), "text_config.eos_token_id")?,
            set_aside,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        if self.num_experts_per_token > self.num_experts {
            return bad(format!(
                "{} experts per token of {}",
                self.num_experts_per_token, self.num_experts
            ));
        }
        if !self.num_experts.is_multiple_of(self.num_expert_group)
            || self.topk_group > self.num_expert_group
        {
            return bad(format!(
                "{} experts in {} groups, {} groups chosen",
                self.num_experts, self.num_expert_group, self.topk_group
            ));
        }
        if self.first_k_dense_replace > self.num_hidden_layers {
            return bad("first_k_dense_replace exceeds num_hidden_layers".into());
        }
        Ok(())
    }

    /// Whether layer `i` (0-indexed) is a KDA layer (else MLA).
    pub fn is_kda(&self, layer: usize) -> bool {
        self.kda.layers.binary_search(&layer).is_ok()
    }

    /// Whether layer `i` is a mixture-of-experts layer (else a dense SiTU MLP).
    pub fn is_moe(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace && layer.is_multiple_of(self.moe_layer_freq)
    }
}

fn kda(map: &Map<String, Value>, layers: usize) -> Result<KdaConfig, ConfigError> {
    let prefix = "text_config.linear_attn_config.";
    classify(map, prefix, &[KDA_KEYS], &[])?;
    let f = Fields { map, prefix };
    if !f.flag("use_full_rank_gate")? {
        return Err(ConfigError::Unsupported {
            key: format!("{prefix}use_full_rank_gate"),
            value: "false".into(),
            why: "only K3's full-rank gate is",
        });
    }
    let numbered = f.layers("kda_layers")?;
    let ascending = numbered.windows(2).all(|w| w[0] < w[1]);
    if !ascending || numbered.iter().any(|&n| n == 0 || n > layers) {
        return Err(ConfigError::Inconsistent(format!(
            "{prefix}kda_layers must be ascending layer numbers from 1 to {layers}"
        )));
    }
    // mlx-lm never reads full_attn_layers; when present it must be the other layers exactly.
    if map.contains_key("full_attn_layers") {
        let full = f.layers("full_attn_layers")?;
        let others: Vec<usize> = (1..=layers).filter(|n| !numbered.contains(n)).collect();
        if full != others {
            return Err(ConfigError::Inconsistent(format!(
                "{prefix}full_attn_layers is not the complement of kda_layers: a layer would be both or neither"
            )));
        }
    }
    Ok(KdaConfig {
        layers: numbered.iter().map(|n| n - 1).collect(),
        num_heads: f.size("num_heads")?,
        head_dim: f.size("head_dim")?,
        short_conv_kernel_size: f.size("short_conv_kernel_size")?,
        gate_lower_bound: f.float32("gate_lower_bound")?,
    })
}
