//! What every architecture's `config.json` reader shares: its errors, typed field reads,
//! YaRN RoPE scaling and the end-of-sequence ids. Every number the forward pass uses must be
//! present; a key a reader does not implement is refused by name, never ignored.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not a JSON object: {0}")]
    NotJson(String),
    #[error("config.json has no {0}, which the model's forward pass needs")]
    Missing(String),
    #[error("config.json: {key} = {value} is not implemented by this runtime ({why})")]
    Unsupported {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error(
        "config.json: {0} is not a field this runtime implements or knows to be inert; refusing rather than ignoring it"
    )]
    Unknown(String),
    #[error("config.json: {key} must be {expected}")]
    Type { key: String, expected: &'static str },
    #[error("config.json: {0}")]
    Inconsistent(String),
    #[error(
        "config.json: {key} = {value} is outside what the model is defined for (it must be {expected}): every logit would come out NaN or meaningless"
    )]
    OutOfDomain {
        key: String,
        value: f64,
        expected: &'static str,
    },
    #[error(
        "config.json names model_type {model_type:?}, which this build does not run; it runs {known}"
    )]
    UnknownModelType { model_type: String, known: String },
}

/// YaRN RoPE scaling as DeepSeek-V3 and gpt-oss configure it.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
    /// Whether the correction range is rounded out to whole dims (floor, ceil): YaRN's own
    /// rule, and both references' when the key is absent; gpt-oss publishes `false`.
    pub truncate: bool,
}

/// Which YaRN keys an architecture's reference reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum YarnKeys {
    /// DeepSeek's: `mscale` and `mscale_all_dim` both present (its attention scale reads the
    /// latter); no `truncate` (mlx-lm always rounds and transformers would not: refused rather
    /// than guessed).
    DeepSeek,
    /// gpt-oss's: `mscale` keys absent meaning YaRN's own `0.1 ln(factor) + 1` on the rotated
    /// dims (mlx-lm's defaults 1 and 0 and transformers' rule both give that); `truncate` read,
    /// absent meaning true.
    GptOss,
}

/// Typed reads from one JSON object of a config; `prefix` names the object in errors
/// (`text_config.`; empty at the top level).
pub(crate) struct Fields<'a> {
    pub map: &'a Map<String, Value>,
    pub prefix: &'static str,
}

impl<'a> Fields<'a> {
    pub fn top(map: &'a Map<String, Value>) -> Fields<'a> {
        Fields { map, prefix: "" }
    }
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
    pub fn get(&self, key: &str) -> Result<&'a Value, ConfigError> {
        self.map
            .get(key)
            .ok_or_else(|| ConfigError::Missing(self.name(key)))
    }
    fn typed<T>(
        &self,
        key: &str,
        expected: &'static str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<T, ConfigError> {
        read(self.get(key)?).ok_or_else(|| ConfigError::Type {
            key: self.name(key),
            expected,
        })
    }
    pub fn size(&self, key: &str) -> Result<usize, ConfigError> {
        self.typed(key, "a positive integer", |v| {
            v.as_u64()
                .filter(|&n| n > 0 && n < (1 << 31))
                .map(|n| n as usize)
        })
    }
    pub fn count(&self, key: &str) -> Result<usize, ConfigError> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_u64().filter(|&n| n < (1 << 31)).map(|n| n as usize)
        })
    }
    /// A finite number, within its key's [`DOMAINS`] where it has one.
    pub fn float(&self, key: &str) -> Result<f64, ConfigError> {
        let value = self.typed(key, "a finite number", |v| {
            v.as_f64().filter(|f| f.is_finite())
        })?;
        self.in_domain(key, value)?;
        Ok(value)
    }
    /// A number that must also be finite as an f32, within its key's [`DOMAINS`].
    pub fn float32(&self, key: &str) -> Result<f32, ConfigError> {
        let value = self.typed(key, "a finite number", |v| {
            v.as_f64().map(|f| f as f32).filter(|f| f.is_finite())
        })?;
        self.in_domain(key, f64::from(value))?;
        Ok(value)
    }
    fn in_domain(&self, key: &str, value: f64) -> Result<(), ConfigError> {
        match DOMAINS.iter().find(|(k, ..)| *k == key) {
            Some((_, holds, expected)) if !holds(value) => Err(ConfigError::OutOfDomain {
                key: self.name(key),
                value,
                expected,
            }),
            _ => Ok(()),
        }
    }
    pub fn flag(&self, key: &str) -> Result<bool, ConfigError> {
        self.typed(key, "true or false", Value::as_bool)
    }
    pub fn layers(&self, key: &str) -> Result<Vec<usize>, ConfigError> {
        self.typed(key, "a list of layer numbers", |v| {
            v.as_array()?
                .iter()
                .map(|n| n.as_u64().filter(|&n| n < (1 << 31)).map(|n| n as usize))
                .collect()
        })
    }
}

/// A key, whether a value is in its domain, and the domain in words.
type Domain = (&'static str, fn(f64) -> bool, &'static str);

/// The values a forward pass is defined for, by key, wherever a config holds the key: outside
/// them every logit comes out NaN or infinite, or RoPE stops encoding positions (a base of 0 or
/// 1e308, a negative norm epsilon, a YaRN factor of 1e-300), so such a config is refused by name
/// rather than run. The bounds hold every published model's values with orders of magnitude to
/// spare.
pub(crate) const DOMAINS: &[Domain] = &[
    (
        "rope_theta",
        |v| v > 1.0 && v <= 1e9,
        "above 1 and at most 1e9",
    ),
    (
        "compress_rope_theta",
        |v| v > 1.0 && v <= 1e9,
        "above 1 and at most 1e9",
    ),
    (
        "rms_norm_eps",
        |v| v > 0.0 && v < 1.0,
        "above 0 and below 1",
    ),
    ("hc_eps", |v| v > 0.0 && v < 1.0, "above 0 and below 1"),
    (
        "factor",
        |v| (1.0..=1e4).contains(&v),
        "at least 1 and at most 1e4",
    ),
    (
        "original_max_position_embeddings",
        |v| (1.0..=16_777_216.0).contains(&v),
        "at least 1 and at most 2^24",
    ),
    (
        "low_freq_factor",
        |v| v > 0.0 && v <= 1e4,
        "above 0 and at most 1e4",
    ),
    (
        "high_freq_factor",
        |v| v > 0.0 && v <= 1e4,
        "above 0 and at most 1e4",
    ),
    (
        "beta_fast",
        |v| v > 0.0 && v <= 1e4,
        "above 0 and at most 1e4",
    ),
    (
        "beta_slow",
        |v| v > 0.0 && v <= 1e4,
        "above 0 and at most 1e4",
    ),
    ("mscale", |v| v > 0.0 && v <= 1e3, "above 0 and at most 1e3"),
    (
        "mscale_all_dim",
        |v| (0.0..=1e3).contains(&v),
        "at least 0 and at most 1e3",
    ),
    (
        "routed_scaling_factor",
        |v| v > 0.0 && v <= 1e3,
        "above 0 and at most 1e3",
    ),
    ("swiglu_limit", |v| v > 0.0, "above 0"),
];

/// Keys the Hugging Face libraries write into every model config they save (the class, the
/// dtype the weights were saved in, the library's version, the name or folder the model was
/// loaded from): they never change a forward pass,
/// and every architecture's reader accepts them alike, at the top level and in a nested
/// `text_config`, so that none refuses what another takes.
pub(crate) const WRITTEN_BY_TRANSFORMERS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "dtype",
    "torch_dtype",
    "transformers_version",
];

/// The keys a reader knows at one level of a config: those it reads, those that cannot change
/// the logits, and those whose only implemented value is the architecture's own.
pub(crate) struct KnownKeys<'k> {
    pub read: &'k [&'k str],
    pub inert: &'k [&'k str],
    /// `(key, JSON value)`: absent means that value (it is the architecture, not a guess).
    pub fixed: &'k [(&'k str, &'k str)],
    /// Why another value of a fixed key is refused (`"only the Qwen3-MoE architecture's value is"`).
    pub why: &'static str,
}

impl KnownKeys<'_> {
    /// Refuses a key none of the lists names, and a fixed key holding another value.
    pub fn check(&self, map: &Map<String, Value>) -> Result<(), ConfigError> {
        for key in map.keys() {
            let key = key.as_str();
            let known = self.read.contains(&key)
                || self.inert.contains(&key)
                || WRITTEN_BY_TRANSFORMERS.contains(&key)
                || self.fixed.iter().any(|(k, _)| *k == key);
            if !known {
                return Err(ConfigError::Unknown(key.to_string()));
            }
        }
        for (key, expected) in self.fixed {
            if let Some(v) = map.get(*key)
                && serde_json::from_str::<Value>(expected).ok().as_ref() != Some(v)
            {
                return Err(ConfigError::Unsupported {
                    key: key.to_string(),
                    value: v.to_string(),
                    why: self.why,
                });
            }
        }
        Ok(())
    }
}

/// The shape rules of grouped-query attention over routed experts: query heads share the
/// key/value heads evenly, a head's width is even (RoPE rotates pairs), and a token chooses at
/// most every expert.
pub(crate) fn check_grouped_moe(
    (heads, kv_heads, head_dim): (usize, usize, usize),
    (experts_per_token, experts): (usize, usize),
) -> Result<(), ConfigError> {
    let bad = |s: String| Err(ConfigError::Inconsistent(s));
    if !heads.is_multiple_of(kv_heads) {
        return bad(format!(
            "{heads} attention heads do not share {kv_heads} key/value heads evenly"
        ));
    }
    if !head_dim.is_multiple_of(2) {
        return bad("head_dim must be even (RoPE rotates pairs)".into());
    }
    if experts_per_token > experts {
        return bad(format!(
            "{experts_per_token} experts per token out of {experts}"
        ));
    }
    Ok(())
}

/// A config's top-level object.
pub(crate) fn top_object(json: &str) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_str(json).map_err(|e| ConfigError::NotJson(e.to_string()))? {
        Value::Object(map) => Ok(map),
        _ => Err(ConfigError::NotJson("not an object".into())),
    }
}

pub(crate) fn rope_scaling(v: &Value, keys: YarnKeys) -> Result<Option<Yarn>, ConfigError> {
    let map = match v {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        _ => {
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
    if !matches!(kind, "yarn" | "deepseek_yarn") {
        return Err(ConfigError::Unsupported {
            key: "rope_scaling.type".into(),
            value: format!("{kind:?}"),
            why: "only YaRN (\"yarn\", \"deepseek_yarn\") is",
        });
    }
    const KEYS: [&str; 7] = [
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ];
    for key in map.keys() {
        let known = KEYS.contains(&key.as_str()) && (key != "truncate" || keys == YarnKeys::GptOss);
        if !known && key != "type" && key != "rope_type" {
            return Err(ConfigError::Unknown(format!("rope_scaling.{key}")));
        }
    }
    let f = Fields::top(map);
    let yarn = Yarn {
        factor: f.float("factor")?,
        original_max_position_embeddings: f.float("original_max_position_embeddings")?,
        beta_fast: f.float("beta_fast")?,
        beta_slow: f.float("beta_slow")?,
        mscale: match (keys, map.get("mscale")) {
            (YarnKeys::GptOss, None) => 1.0,
            _ => f.float("mscale")?,
        },
        mscale_all_dim: match (keys, map.get("mscale_all_dim")) {
            (YarnKeys::GptOss, None) => 0.0,
            _ => f.float("mscale_all_dim")?,
        },
        truncate: match map.get("truncate") {
            None => true,
            Some(_) => f.flag("truncate")?,
        },
    };
    if yarn.factor <= 0.0 || yarn.original_max_position_embeddings <= 0.0 {
        return Err(ConfigError::Inconsistent(
            "rope_scaling factor and original_max_position_embeddings must be positive".into(),
        ));
    }
    Ok(Some(yarn))
}

/// `eos_token_id` (at `key`): absent or null, one id, or a list of them.
pub(crate) fn eos_ids(v: Option<&Value>, key: &str) -> Result<Vec<u32>, ConfigError> {
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let err = || ConfigError::Type {
        key: key.into(),
        expected: "a token id or a list of them",
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| id(v).ok_or_else(err)).collect(),
        Some(v) => Ok(vec![id(v).ok_or_else(err)?]),
    }
}

/// What a run needs to know of any architecture's config.
pub trait ModelConfig {
    fn vocab_size(&self) -> usize;
    /// The most positions a sequence may have (`max_position_embeddings`).
    fn max_positions(&self) -> usize;
    /// The ids that end generation (config.json's `eos_token_id`).
    fn eos_token_ids(&self) -> &[u32];
    /// One line saying what the model is.
    fn describe(&self) -> String;
}

/// [`ModelConfig`]'s three limits for a config that keeps them under their `config.json` names
/// (`vocab_size`, `max_position_embeddings`, `eos_token_ids`): written once here, used inside
/// each architecture's `impl ModelConfig`.
macro_rules! limits_from_fields {
    () => {
        fn vocab_size(&self) -> usize {
            self.vocab_size
        }

        fn max_positions(&self) -> usize {
            self.max_position_embeddings
        }

        fn eos_token_ids(&self) -> &[u32] {
            &self.eos_token_ids
        }
    };
}
pub(crate) use limits_from_fields;

#[cfg(test)]
mod tests {
    use super::*;

    fn read(key: &str, value: f64) -> Result<f64, ConfigError> {
        let map = serde_json::json!({ key: value });
        Fields::top(map.as_object().unwrap()).float(key)
    }

    #[test]
    fn values_every_logit_would_be_nan_for_are_refused_by_name() {
        for (key, value) in [
            ("rope_theta", 0.0),
            ("rope_theta", -10_000.0),
            ("rope_theta", 1e308),
            ("rms_norm_eps", -1.0),
            ("rms_norm_eps", 0.0),
            ("factor", 1e-300),
            ("beta_fast", 0.0),
        ] {
            match read(key, value) {
                Err(e @ ConfigError::OutOfDomain { .. }) => {
                    assert!(e.to_string().contains(key), "{e}")
                }
                other => panic!("{key} = {value}: {other:?}"),
            }
        }
    }

    #[test]
    fn published_values_are_in_their_domains() {
        for (key, value) in [
            ("rope_theta", 10_000.0),
            ("rope_theta", 150_000.0),
            ("rope_theta", 1e6),
            ("rms_norm_eps", 1e-6),
            ("factor", 40.0),
            ("factor", 1.0),
            ("original_max_position_embeddings", 4096.0),
            ("beta_fast", 32.0),
            ("mscale_all_dim", 0.0),
        ] {
            assert_eq!(read(key, value), Ok(value), "{key}");
        }
        // Keys without a domain read any finite number.
        assert_eq!(read("gate_lower_bound", -5.0), Ok(-5.0));
    }
}
