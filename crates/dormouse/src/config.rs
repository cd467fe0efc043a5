//! `DormouseConfig`: the shape of a model, as TOML. Every field has a documented default
//! (the `small` preset); [`DormouseConfig::validate`] refuses an invalid config naming the
//! field and the rule it breaks.

use serde::{Deserialize, Serialize};

use crate::engram::MAX_ORDERS;
use crate::engram::hash::MULXOR_V1;

/// The only vocabulary: one token per byte.
pub const VOCAB_SIZE: usize = 256;

/// The model's shape. Unknown keys are refused, so a typo cannot silently become a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DormouseConfig {
    /// Width of the residual stream. Default 384.
    pub d_model: usize,
    /// Number of transformer blocks. Default 3.
    pub n_layers: usize,
    /// Attention heads; must divide `d_model` into an even head width (RoPE rotates pairs). Default 6.
    pub n_heads: usize,
    /// Hidden width of each SwiGLU MLP. Default 1216.
    pub mlp_hidden: usize,
    /// Longest context the model attends over. Default 512.
    pub max_seq_len: usize,
    /// RoPE base frequency. Default 10000.
    pub rope_theta: f64,
    /// RMSNorm epsilon. Default 1e-5.
    pub norm_eps: f64,
    /// Must be 256 (byte-level). Default 256.
    pub vocab_size: usize,
    /// Whether the LM head reuses the byte embedding. Default true.
    pub tie_embeddings: bool,
    /// Whether the Engram memory exists. Default true.
    pub use_engram: bool,
    /// N-gram orders hashed into the memory, each at least 1. Default [2, 3].
    pub engram_orders: Vec<usize>,
    /// Rows per order in the in-model tables. Default 49152. With `engram_ram` the config seam
    /// ([`DormouseConfig::resolve`]) squeezes it to 1: the rows live in the sidecar instead.
    pub engram_rows: usize,
    /// Width of each memory row. Default 32.
    pub engram_dim: usize,
    /// Blocks whose input reads the memory (0-based). Default [0].
    pub engram_layers: Vec<usize>,
    /// Name of the documented n-gram hash. Default "mulxor-v1" (the only one).
    pub engram_hash: String,
    /// Keep the memory in a host-RAM table saved as the run's `<name>.ngram` sidecar instead
    /// of in the model (training only: an export of such a run has one memory row per order
    /// and is refused by `generate`). Default false.
    pub engram_ram: bool,
    /// Rows per order of the host-RAM table when `engram_ram` is set. Default 1000000.
    pub engram_slots: usize,
}

impl Default for DormouseConfig {
    fn default() -> Self {
        DormouseConfig {
            d_model: 384,
            n_layers: 3,
            n_heads: 6,
            mlp_hidden: 1216,
            max_seq_len: 512,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            vocab_size: VOCAB_SIZE,
            tie_embeddings: true,
            use_engram: true,
            engram_orders: vec![2, 3],
            engram_rows: 49_152,
            engram_dim: 32,
            engram_layers: vec![0],
            engram_hash: MULXOR_V1.to_string(),
            engram_ram: false,
            engram_slots: 1_000_000,
        }
    }
}

/// A config field that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config: {field} {rule}")]
pub struct ConfigError {
    pub field: &'static str,
    pub rule: String,
}

/// Why a config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigReadError {
    #[error("the config is not valid TOML for a dormouse model: {0}")]
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("no preset named {name:?}; the presets are {known}")]
    NoSuchPreset { name: String, known: String },
}

/// The presets shipped in this crate's `configs/`, embedded in every binary.
pub const PRESETS: &[(&str, &str)] = &[
    ("nano", include_str!("../configs/nano.toml")),
    ("small", include_str!("../configs/small.toml")),
];

fn rule(field: &'static str, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        rule: rule.into(),
    }
}

impl DormouseConfig {
    /// Parses TOML (missing keys take their defaults), applies the config seam and validates
    /// the result.
    pub fn from_toml(text: &str) -> Result<Self, ConfigReadError> {
        let config: DormouseConfig = toml::from_str(text)?;
        Ok(config.resolve()?)
    }

    /// The config seam, then validation. With `engram_ram` the memory lives in the host-RAM
    /// sidecar (`engram_slots` rows per order), so the in-model tables are squeezed to one row
    /// per order; both values stay in the config, and so in the run's snapshot.
    pub fn resolve(mut self) -> Result<Self, ConfigError> {
        if self.engram_ram {
            self.engram_rows = 1;
        }
        self.validate()?;
        Ok(self)
    }

    /// One of the embedded presets.
    pub fn preset(name: &str) -> Result<Self, ConfigReadError> {
        let (_, text) = PRESETS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            ConfigReadError::NoSuchPreset {
                name: name.to_string(),
                known: PRESETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?;
        Self::from_toml(text)
    }

    /// The config as TOML (for the run's `<name>.config.toml` snapshot and export headers).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Checks every rule, naming the first field that breaks one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vocab_size != VOCAB_SIZE {
            return Err(rule(
                "vocab_size",
                format!(
                    "must be {VOCAB_SIZE} (dormouse is byte-level), not {}",
                    self.vocab_size
                ),
            ));
        }
        for (field, value) in [
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("mlp_hidden", self.mlp_hidden),
            ("max_seq_len", self.max_seq_len),
        ] {
            if value == 0 {
                return Err(rule(field, "must be at least 1"));
            }
        }
        // Upper bounds: a config arrives in export headers that the CRC does not cover, and
        // the model's position tables are max_seq_len x d_model.
        for (field, value, most) in [
            ("d_model", self.d_model, 1 << 16),
            ("n_layers", self.n_layers, 1 << 10),
            ("mlp_hidden", self.mlp_hidden, 1 << 20),
            ("max_seq_len", self.max_seq_len, 1 << 20),
        ] {
            if value > most {
                return Err(rule(field, format!("must be at most {most}")));
            }
        }
        if self.max_seq_len * self.d_model > 1 << 28 {
            return Err(rule(
                "max_seq_len",
                format!(
                    "times d_model must be at most {} (the position tables)",
                    1u64 << 28
                ),
            ));
        }
        if !self.d_model.is_multiple_of(self.n_heads) || !self.head_dim().is_multiple_of(2) {
            return Err(rule(
                "n_heads",
                format!(
                    "must divide d_model ({}) into heads of even width (RoPE rotates pairs)",
                    self.d_model
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(rule("rope_theta", "must be a finite number above 1"));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return Err(rule("norm_eps", "must be in (0, 1)"));
        }
        if self.use_engram {
            self.validate_engram()?;
        } else if self.engram_ram {
            return Err(rule(
                "engram_ram",
                "needs use_engram = true (there is no memory to keep in RAM)",
            ));
        }
        Ok(())
    }

    fn validate_engram(&self) -> Result<(), ConfigError> {
        if self.engram_hash != MULXOR_V1 {
            return Err(rule(
                "engram_hash",
                format!(
                    "{:?} is not a documented hash; the only one is {MULXOR_V1:?}",
                    self.engram_hash
                ),
            ));
        }
        if self.engram_orders.is_empty() || self.engram_orders.contains(&0) {
            return Err(rule(
                "engram_orders",
                "must list at least one order, each at least 1",
            ));
        }
        let mut sorted = self.engram_orders.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.engram_orders.len() {
            return Err(rule("engram_orders", "must not repeat an order"));
        }
        if self.engram_orders.iter().any(|&n| n > self.max_seq_len) {
            return Err(rule(
                "engram_orders",
                format!("must not exceed max_seq_len ({})", self.max_seq_len),
            ));
        }
        if self.engram_rows > 1 << 30 || self.engram_dim > 1 << 12 || self.engram_slots > 1 << 36 {
            return Err(rule(
                match (self.engram_rows > 1 << 30, self.engram_dim > 1 << 12) {
                    (true, _) => "engram_rows",
                    (_, true) => "engram_dim",
                    _ => "engram_slots",
                },
                "is beyond any memory this program can hold (rows 2^30, dim 4096, slots 2^36)",
            ));
        }
        if self.engram_rows == 0 || self.engram_dim == 0 {
            return Err(rule(
                if self.engram_rows == 0 {
                    "engram_rows"
                } else {
                    "engram_dim"
                },
                "must be at least 1",
            ));
        }
        if self.engram_layers.is_empty() || self.engram_layers.iter().any(|&l| l >= self.n_layers) {
            return Err(rule(
                "engram_layers",
                format!(
                    "must name at least one block, each below n_layers ({})",
                    self.n_layers
                ),
            ));
        }
        if self.engram_ram && self.engram_slots < 2 {
            return Err(rule(
                "engram_slots",
                "must be at least 2 when engram_ram is set",
            ));
        }
        if self.engram_ram && self.engram_rows != 1 {
            return Err(rule(
                "engram_rows",
                "must be 1 when engram_ram is set (the rows live in the sidecar; DormouseConfig::resolve squeezes it)",
            ));
        }
        if self.engram_ram && self.engram_orders.len() > MAX_ORDERS {
            return Err(rule(
                "engram_orders",
                format!(
                    "lists at most {MAX_ORDERS} orders when engram_ram is set (the sidecar's limit)"
                ),
            ));
        }
        Ok(())
    }
}
