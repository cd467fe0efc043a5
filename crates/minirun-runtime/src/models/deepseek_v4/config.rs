//! A DeepSeek V4 `config.json` (`model_type: "deepseek_v4"`), read fail-closed as transformers
//! 5.24.0's `DeepseekV4Config` reads it: the upstream keys (`compress_ratios`, `num_hash_layers`,
//! `qk_rope_head_dim`, `rope_scaling`) or transformers' own (`layer_types`, `compress_rates`,
//! `mlp_layer_types`). Every key is used by the forward pass, fixed to the architecture's one
//! value, or set aside by name (generation and packaging bookkeeping, the multi-token
//! prediction and speculative-decoding stages, which are not run); anything else is refused.

use serde_json::{Map, Value};

use crate::engine::config::{ConfigError, Fields, WRITTEN_BY_TRANSFORMERS, eos_ids};

/// How a layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// The sliding window only.
    Sliding,
    /// The window and the compressed entries the lightning indexer picks (rate `m`, windows of
    /// `2m` overlapping by `m`).
    CompressedSparse { rate: usize },
    /// The window and every visible compressed entry (rate `m`, disjoint windows).
    HeavilyCompressed { rate: usize },
}

impl Attention {
    pub fn rate(self) -> Option<usize> {
        match self {
            Attention::Sliding => None,
            Attention::CompressedSparse { rate } | Attention::HeavilyCompressed { rate } => {
                Some(rate)
            }
        }
    }
}

/// YaRN scaling of the compressed layers' rotary embedding (attention factor 1, as V4 fixes it).
#[derive(Debug, Clone, PartialEq)]
pub struct V4Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeepSeekV4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub num_experts_per_tok: usize,
    pub n_routed_experts: usize,
    pub routed_scaling_factor: f32,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    pub yarn: Option<V4Yarn>,
    pub attention: Vec<Attention>,
    /// Layers whose experts the token's `tid2eid` row picks.
    pub hash_layers: usize,
    pub sliding_window: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub swiglu_limit: f32,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    /// Multi-token-prediction layers the checkpoint carries (read and verified, never run).
    pub num_nextn_predict_layers: usize,
    pub eos_token_ids: Vec<u32>,
    /// Keys present and set aside by name, for the run's report.
    pub set_aside: Vec<String>,
}

/// Keys that cannot change the logits of a greedy or sampled decode: bookkeeping, the
/// multi-token-prediction and speculative-decoding stages (never run here), and training-only
/// fields.
const SET_ASIDE: &[&str] = &[
    "bos_token_id",
    "dspark_block_size",
    "dspark_markov_rank",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
    // How the checkpoint stores its experts; the artifact's manifests say how each is stored.
    "expert_dtype",
    "initializer_range",
    "num_nextn_predict_layers",
    "output_router_logits",
    "pad_token_id",
    "quantization_config",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "use_cache",
];

/// Keys whose only implemented value is the architecture's own.
const FIXED: &[(&str, &str, &str)] = &[
    (
        "model_type",
        "\"deepseek_v4\"",
        "this reader is for DeepSeek V4",
    ),
    ("num_key_value_heads", "1", "V4 has one shared K=V head"),
    ("n_shared_experts", "1", "V4 has exactly one shared expert"),
    (
        "scoring_func",
        "\"sqrtsoftplus\"",
        "V4 scores experts by sqrt(softplus)",
    ),
    (
        "norm_topk_prob",
        "true",
        "transformers renormalises the chosen weights always",
    ),
    ("hidden_act", "\"silu\"", "V4's experts gate with SiLU"),
    (
        "topk_method",
        "\"noaux_tc\"",
        "routing is top-k of the bias-corrected scores",
    ),
    ("attention_bias", "false", "V4's projections have no bias"),
    ("mlp_bias", "false", "V4's projections have no bias"),
    ("attention_dropout", "0.0", "inference has no dropout"),
    ("tie_word_embeddings", "false", "V4 has its own LM head"),
];

const USED: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "partial_rotary_factor",
    "q_lora_rank",
    "o_groups",
    "o_lora_rank",
    "num_experts_per_tok",
    "n_routed_experts",
    "routed_scaling_factor",
    "rope_theta",
    "compress_rope_theta",
    "rope_scaling",
    "compress_ratios",
    "layer_types",
    "compress_rates",
    "num_hash_layers",
    "mlp_layer_types",
    "sliding_window",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
    "hc_sinkhorn_iters",
    "hc_eps",
    "swiglu_limit",
    "rms_norm_eps",
    "max_position_embeddings",
    "eos_token_id",
];

fn unsupported(key: &str, value: &Value, why: &'static str) -> ConfigError {
    ConfigError::Unsupported {
        key: key.into(),
        value: value.to_string(),
        why,
    }
}

impl DeepSeekV4Config {
    pub fn parse(json: &str) -> Result<DeepSeekV4Config, ConfigError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| ConfigError::NotJson(e.to_string()))?;
        let map = value
            .as_object()
            .ok_or_else(|| ConfigError::NotJson("not an object".into()))?;
        let mut set_aside = Vec::new();
        for key in map.keys() {
            if SET_ASIDE.contains(&key.as_str()) || WRITTEN_BY_TRANSFORMERS.contains(&key.as_str())
            {
                set_aside.push(key.clone());
            } else if !USED.contains(&key.as_str()) && !FIXED.iter().any(|(k, _, _)| k == key) {
                return Err(ConfigError::Unknown(key.clone()));
            }
        }
        for (key, expected, why) in FIXED {
            let Some(got) = map.get(*key) else {
                // Absent means transformers' default, which is the fixed value; model_type
                // must be present.
                if *key == "model_type" {
                    return Err(ConfigError::Missing("model_type".into()));
                }
                continue;
            };
            let want: Value = serde_json::from_str(expected).unwrap_or(Value::Null);
            let same = match (got.as_f64(), want.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => *got == want,
            };
            if !same {
                return Err(unsupported(key, got, why));
            }
        }
        let f = Fields::top(map);
        let num_hidden_layers = f.size("num_hidden_layers")?;
        let head_dim = f.size("head_dim")?;
        let qk_rope_head_dim = rope_dims(map, head_dim)?;
        let config = DeepSeekV4Config {
            vocab_size: f.size("vocab_size")?,
            hidden_size: f.size("hidden_size")?,
            moe_intermediate_size: f.size("moe_intermediate_size")?,
            num_hidden_layers,
            num_attention_heads: f.size("num_attention_heads")?,
            head_dim,
            qk_rope_head_dim,
            q_lora_rank: f.size("q_lora_rank")?,
            o_groups: f.size("o_groups")?,
            o_lora_rank: f.size("o_lora_rank")?,
            num_experts_per_tok: f.size("num_experts_per_tok")?,
            n_routed_experts: f.size("n_routed_experts")?,
            routed_scaling_factor: f.float32("routed_scaling_factor")?,
            rope_theta: f.float("rope_theta")?,
            compress_rope_theta: f.float("compress_rope_theta")?,
            yarn: yarn(map.get("rope_scaling"))?,
            attention: attention(map, num_hidden_layers)?,
            hash_layers: hash_layers(map, num_hidden_layers)?,
            sliding_window: f.size("sliding_window")?,
            index_n_heads: f.size("index_n_heads")?,
            index_head_dim: f.size("index_head_dim")?,
            index_topk: f.size("index_topk")?,
            hc_mult: f.size("hc_mult")?,
            hc_sinkhorn_iters: f.size("hc_sinkhorn_iters")?,
            hc_eps: f.float32("hc_eps")?,
            swiglu_limit: f.float32("swiglu_limit")?,
            rms_norm_eps: f.float32("rms_norm_eps")?,
            max_position_embeddings: f.size("max_position_embeddings")?,
            num_nextn_predict_layers: match map.get("num_nextn_predict_layers") {
                Some(_) => f.count("num_nextn_predict_layers")?,
                None => 0,
            },
            eos_token_ids: eos_ids(map.get("eos_token_id"), "eos_token_id")?,
            set_aside,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        if self.num_experts_per_tok > self.n_routed_experts {
            return bad(format!(
                "{} experts per token of {}",
                self.num_experts_per_tok, self.n_routed_experts
            ));
        }
        if self.qk_rope_head_dim > self.head_dim || !self.qk_rope_head_dim.is_multiple_of(2) {
            return bad(format!(
                "{} rotary dims of a {}-wide head",
                self.qk_rope_head_dim, self.head_dim
            ));
        }
        if !(self.num_attention_heads * self.head_dim).is_multiple_of(self.o_groups)
            || !self.num_attention_heads.is_multiple_of(self.o_groups)
        {
            return bad(format!(
                "{} heads do not split into {} output groups",
                self.num_attention_heads, self.o_groups
            ));
        }
        if !self.index_head_dim.is_multiple_of(2) || self.qk_rope_head_dim > self.index_head_dim {
            return bad(format!(
                "the indexer's {}-wide heads cannot hold {} rotary dims",
                self.index_head_dim, self.qk_rope_head_dim
            ));
        }
        // The hyper-connection weights, `[(2 + n) n, n hidden]`, the one size of three factors
        // the model reads: it must fit before anything multiplies it.
        let hc_weights = [self.hc_mult, self.hc_mult, self.hidden_size]
            .iter()
            .try_fold(2 + self.hc_mult, |acc, &d| acc.checked_mul(d));
        if hc_weights.is_none_or(|n| n > isize::MAX as usize / 4) {
            return bad(format!(
                "hc_mult {} with hidden_size {} gives hyper-connection weights too large to hold",
                self.hc_mult, self.hidden_size
            ));
        }
        if self.hc_sinkhorn_iters == 0 {
            return bad("hc_sinkhorn_iters must be at least 1".into());
        }
        Ok(())
    }

    /// Whether layer `i` routes by the token's `tid2eid` row.
    pub fn is_hash(&self, layer: usize) -> bool {
        layer < self.hash_layers
    }

    /// Bytes of one cached position in every layer (the window's K=V rows are bounded by the
    /// window, the compressed entries grow with the context), f32.
    pub fn cache_bytes(&self, context_tokens: usize) -> u64 {
        // Saturating throughout: a context or a config field near usize::MAX says "more than
        // any memory", never wraps to a small number.
        let product = |terms: &[u64]| terms.iter().fold(1u64, |acc, &t| acc.saturating_mul(t));
        let [head, index_head, layers, window_rows] = [
            self.head_dim,
            self.index_head_dim,
            self.num_hidden_layers,
            self.sliding_window,
        ]
        .map(|n| n as u64);
        let entries = |rate: usize| (context_tokens as u64 / rate.max(1) as u64).saturating_add(1);
        let both_heads = head.saturating_add(index_head);
        let window = product(&[window_rows, head, layers]);
        let compressed: u64 = self
            .attention
            .iter()
            .map(|a| match a {
                Attention::Sliding => 0,
                Attention::CompressedSparse { rate } => {
                    // The entries, the indexer's, and the open window's projections.
                    product(&[entries(*rate), both_heads]).saturating_add(product(&[
                        2,
                        *rate as u64,
                        4,
                        both_heads,
                    ]))
                }
                Attention::HeavilyCompressed { rate } => product(&[entries(*rate), head])
                    .saturating_add(product(&[*rate as u64, 2, head])),
            })
            .fold(0u64, u64::saturating_add);
        window.saturating_add(compressed).saturating_mul(4)
    }
}

/// `qk_rope_head_dim` (upstream), or `partial_rotary_factor · head_dim` (transformers).
fn rope_dims(map: &Map<String, Value>, head_dim: usize) -> Result<usize, ConfigError> {
    let f = Fields::top(map);
    match (
        map.get("qk_rope_head_dim"),
        map.get("partial_rotary_factor"),
    ) {
        (Some(_), None) => f.size("qk_rope_head_dim"),
        (None, Some(_)) => {
            let factor = f.float("partial_rotary_factor")?;
            let dims = head_dim as f64 * factor;
            if dims.fract() != 0.0 || dims <= 0.0 {
                return Err(ConfigError::Inconsistent(format!(
                    "partial_rotary_factor {factor} of head_dim {head_dim} is not a whole number of dims"
                )));
            }
            Ok(dims as usize)
        }
        (Some(_), Some(_)) => Err(ConfigError::Inconsistent(
            "both qk_rope_head_dim and partial_rotary_factor: give one".into(),
        )),
        (None, None) => Err(ConfigError::Missing(
            "qk_rope_head_dim (or partial_rotary_factor)".into(),
        )),
    }
}

fn yarn(value: Option<&Value>) -> Result<Option<V4Yarn>, ConfigError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ConfigError::Type {
                key: "rope_scaling".into(),
                expected: "null or an object",
            });
        }
    };
    let kind = map
        .get("type")
        .or_else(|| map.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind != "yarn" {
        return Err(ConfigError::Unsupported {
            key: "rope_scaling.type".into(),
            value: format!("{kind:?}"),
            why: "only YaRN is",
        });
    }
    for key in map.keys() {
        let known = [
            "type",
            "rope_type",
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
        ];
        if !known.contains(&key.as_str()) {
            return Err(ConfigError::Unknown(format!("rope_scaling.{key}")));
        }
    }
    let f = Fields::top(map);
    let or_default = |key: &str, default: f64| match map.get(key) {
        None => Ok(default),
        Some(_) => f.float(key),
    };
    let yarn = V4Yarn {
        factor: f.float("factor")?,
        original_max_position_embeddings: f.float("original_max_position_embeddings")?,
        // transformers' defaults when absent.
        beta_fast: or_default("beta_fast", 32.0)?,
        beta_slow: or_default("beta_slow", 1.0)?,
    };
    if yarn.factor <= 0.0 || yarn.original_max_position_embeddings <= 0.0 {
        return Err(ConfigError::Inconsistent(
            "rope_scaling factor and original_max_position_embeddings must be positive".into(),
        ));
    }
    Ok(Some(yarn))
}

/// The layers' attention: the upstream `compress_ratios` (0, 4 or 128 per layer; entries past
/// the layer count, the MTP stages', are not read), or `layer_types` with `compress_rates`.
fn attention(map: &Map<String, Value>, layers: usize) -> Result<Vec<Attention>, ConfigError> {
    let rates = match map.get("compress_rates") {
        None if map.contains_key("layer_types") => {
            return Err(ConfigError::Missing(
                "compress_rates (layer_types names the kinds; the rates must be given too)".into(),
            ));
        }
        None => (4, 128),
        Some(Value::Object(r)) => {
            for key in r.keys() {
                if !matches!(
                    key.as_str(),
                    "compressed_sparse_attention" | "heavily_compressed_attention"
                ) {
                    return Err(ConfigError::Unknown(format!("compress_rates.{key}")));
                }
            }
            let f = Fields::top(r);
            let get = |key: &str, default: usize| match r.get(key) {
                None => Ok(default),
                Some(_) => f.size(key),
            };
            (
                get("compressed_sparse_attention", 4)?,
                get("heavily_compressed_attention", 128)?,
            )
        }
        Some(_) => {
            return Err(ConfigError::Type {
                key: "compress_rates".into(),
                expected: "an object of rates",
            });
        }
    };
    let kinds: Vec<Attention> = match (map.get("layer_types"), map.get("compress_ratios")) {
        (Some(Value::Array(types)), None) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(Attention::Sliding),
                Some("compressed_sparse_attention") => {
                    Ok(Attention::CompressedSparse { rate: rates.0 })
                }
                Some("heavily_compressed_attention") => {
                    Ok(Attention::HeavilyCompressed { rate: rates.1 })
                }
                _ => Err(unsupported(
                    "layer_types",
                    t,
                    "layer types are sliding, compressed sparse or heavily compressed attention",
                )),
            })
            .collect::<Result<_, _>>()?,
        (None, Some(Value::Array(ratios))) => {
            if map.contains_key("compress_rates") {
                return Err(ConfigError::Inconsistent(
                    "compress_ratios fixes the rates (4 and 128); compress_rates goes with layer_types".into(),
                ));
            }
            ratios
                .iter()
                .map(|r| match r.as_u64() {
                    Some(0) => Ok(Attention::Sliding),
                    Some(4) => Ok(Attention::CompressedSparse { rate: 4 }),
                    Some(128) => Ok(Attention::HeavilyCompressed { rate: 128 }),
                    _ => Err(unsupported(
                        "compress_ratios",
                        r,
                        "a ratio is 0, 4 or 128 (transformers maps no other; use layer_types and compress_rates)",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::Inconsistent(
                "both layer_types and compress_ratios: give one".into(),
            ));
        }
        _ => {
            return Err(ConfigError::Missing(
                "compress_ratios (or layer_types): which layers compress their attention".into(),
            ));
        }
    };
    if kinds.len() < layers {
        return Err(ConfigError::Inconsistent(format!(
            "{} attention kinds for {layers} layers",
            kinds.len()
        )));
    }
    if map.contains_key("layer_types") && kinds.len() != layers {
        return Err(ConfigError::Inconsistent(format!(
            "layer_types lists {} layers, num_hidden_layers is {layers}",
            kinds.len()
        )));
    }
    Ok(kinds.into_iter().take(layers).collect())
}

/// How many leading layers route by hash: `num_hash_layers` (upstream), or the `hash_moe` run
/// at the start of `mlp_layer_types`.
fn hash_layers(map: &Map<String, Value>, layers: usize) -> Result<usize, ConfigError> {
    match (map.get("num_hash_layers"), map.get("mlp_layer_types")) {
        (Some(_), None) => Ok(Fields::top(map).count("num_hash_layers")?.min(layers)),
        (None, Some(Value::Array(types))) => {
            if types.len() != layers {
                return Err(ConfigError::Inconsistent(format!(
                    "mlp_layer_types lists {} layers, num_hidden_layers is {layers}",
                    types.len()
                )));
            }
            let hash = types
                .iter()
                .take_while(|t| t.as_str() == Some("hash_moe"))
                .count();
            match types[hash..].iter().all(|t| t.as_str() == Some("moe")) {
                true => Ok(hash),
                false => Err(ConfigError::Inconsistent(
                    "mlp_layer_types must be hash_moe layers first, then moe".into(),
                )),
            }
        }
        (Some(_), Some(_)) => Err(ConfigError::Inconsistent(
            "both num_hash_layers and mlp_layer_types: give one".into(),
        )),
        (None, _) => Err(ConfigError::Missing(
            "num_hash_layers (or mlp_layer_types): which layers route by token hash".into(),
        )),
    }
}
