//! What the random real-geometry checkpoints ([`crate::deepseek_v4`], [`crate::kimi_k3`])
//! share: seeded random tensors scaled so that activations stay finite, and safetensors shards
//! of about 512 MiB written as they fill, with the index of where every tensor went.

use std::collections::HashMap;
use std::path::Path;

use minirun_format::synthetic::{SplitMix64, fill_content};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};

use crate::SynthError;

/// The most bytes of tensors one shard is built from in memory.
const SHARD_BYTES: usize = 512 << 20;

/// One tensor: name, dtype, shape and its little-endian bytes.
pub(crate) type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// Seeded random tensors.
pub(crate) struct Writer {
    rng: SplitMix64,
    seed: u64,
}

fn bf16_bits(value: f32) -> [u8; 2] {
    ((value.to_bits() >> 16) as u16).to_le_bytes()
}

impl Writer {
    pub(crate) fn new(seed: u64) -> Writer {
        Writer {
            rng: SplitMix64::new(seed),
            seed: seed << 20,
        }
    }

    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.rng.next().unwrap_or(0) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `len` random bytes (a fresh stream each call).
    pub(crate) fn random(&mut self, len: usize) -> Vec<u8> {
        self.seed += 1;
        let mut out = vec![0u8; len];
        fill_content(self.seed, 0, &mut out);
        out
    }

    /// F32 values uniform in `mean ± spread`.
    pub(crate) fn f32(
        &mut self,
        name: String,
        shape: Vec<usize>,
        mean: f32,
        spread: f32,
    ) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .flat_map(|_| (mean + spread * self.unit()).to_le_bytes())
            .collect();
        (name, Dtype::F32, shape, data)
    }

    /// A norm's weights: BF16 near `1`, as the published checkpoints store them.
    pub(crate) fn norm(&mut self, name: String, len: usize) -> Tensor {
        let data = (0..len)
            .flat_map(|_| bf16_bits(1.0 + 0.1 * self.unit()))
            .collect();
        (name, Dtype::BF16, vec![len], data)
    }

    /// A `rows x cols` FP4 (E2M1) matrix: random codes two a byte, and one E8M0 scale per 32
    /// columns near `1 / sqrt(cols)`.
    pub(crate) fn fp4_codes(&mut self, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let exponent = 125 - (cols as f32).log2().ceil() as u8 / 2;
        (
            self.random(rows * cols / 2),
            vec![exponent; rows * cols / 32],
        )
    }

    /// A BF16 matrix of values within `1 / sqrt(cols)`.
    pub(crate) fn bf16(&mut self, name: String, rows: usize, cols: usize) -> Tensor {
        let spread = 1.0 / (cols as f32).sqrt();
        let data = (0..rows * cols)
            .flat_map(|_| bf16_bits(spread * self.unit()))
            .collect();
        (name, Dtype::BF16, vec![rows, cols], data)
    }
}

/// Shards of at most about [`SHARD_BYTES`] each, written as they fill, and the index of where
/// every tensor went.
pub(crate) struct Shards<'o> {
    out: &'o Path,
    pending: Vec<Tensor>,
    pending_bytes: usize,
    written: usize,
    weight_map: serde_json::Map<String, Value>,
}

impl<'o> Shards<'o> {
    pub(crate) fn new(out: &'o Path) -> Result<Shards<'o>, SynthError> {
        std::fs::create_dir_all(out).map_err(|e| SynthError::io(out, e))?;
        Ok(Shards {
            out,
            pending: Vec::new(),
            pending_bytes: 0,
            written: 0,
            weight_map: serde_json::Map::new(),
        })
    }

    pub(crate) fn push(&mut self, tensors: Vec<Tensor>) -> Result<(), SynthError> {
        for t in tensors {
            self.pending_bytes += t.3.len();
            self.pending.push(t);
            if self.pending_bytes >= SHARD_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SynthError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.written += 1;
        let name = format!("model-{:05}.safetensors", self.written);
        write_shard(&self.out.join(&name), &self.pending, "pt")?;
        for (n, ..) in &self.pending {
            self.weight_map.insert(n.clone(), json!(name));
        }
        self.pending.clear();
        self.pending_bytes = 0;
        Ok(())
    }

    /// Writes the last shard, the shards' index, `config` as `config.json` and a licence that
    /// says what the data is.
    pub(crate) fn finish(mut self, config: &Value) -> Result<(), SynthError> {
        self.flush()?;
        write_root_files(self.out, self.weight_map, config)
    }
}

/// Writes `tensors` as one safetensors file at `path`, its metadata's `format` being `format`.
pub(crate) fn write_shard(path: &Path, tensors: &[Tensor], format: &str) -> Result<(), SynthError> {
    let bad = |e: safetensors::SafeTensorError| SynthError::BadShard {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let views = tensors
        .iter()
        .map(|(n, dtype, dims, bytes)| {
            TensorView::new(*dtype, dims.clone(), bytes).map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    let metadata: HashMap<String, String> = [("format".to_string(), format.to_string())].into();
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(bad)
}

/// Writes the shards' index (`weight_map`: tensor name to shard file), `config` as
/// `config.json` and a licence that says what the data is.
pub(crate) fn write_root_files(
    out: &Path,
    weight_map: serde_json::Map<String, Value>,
    config: &Value,
) -> Result<(), SynthError> {
    let index = json!({ "metadata": {}, "weight_map": weight_map });
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        std::fs::write(&path, bytes).map_err(|e| SynthError::io(&path, e))
    };
    let json_bytes = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    write("model.safetensors.index.json", &json_bytes(&index))?;
    write("config.json", &json_bytes(config))?;
    write(
        "LICENSE",
        b"Synthetic test data made by minirun-synth; not a model.\n",
    )
}
