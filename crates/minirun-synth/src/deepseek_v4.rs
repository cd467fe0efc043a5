//! A random DeepSeek V4 checkpoint in DeepSeek's own storage (FP8 e4m3 matrices with one E8M0
//! scale per 128 x 128 block, FP4 experts with one E8M0 scale per 32 columns, BF16 and F32
//! plain tensors) at the geometry an upstream `config.json` gives, the published V4 Flash's
//! included, cut to its first `layers` layers: for measuring streaming at the sizes the
//! published artifact has (`minirun pack --layout deepseek-v4-published` turns it into that layout).
//!
//! Not a model of anything: its outputs mean nothing, but they are exactly determined by its
//! bytes. Values are scaled so that activations stay finite through the layers.

use std::path::Path;

use safetensors::tensor::Dtype;
use serde_json::{Value, json};

use crate::SynthError;
use crate::safetensors_writer::{Shards, Tensor, Writer};

/// Hyper-connection mixing terms per stream: pre, post and the `hc x hc` residual mix.
const fn hc_mix(hc: usize) -> usize {
    (2 + hc) * hc
}

/// The geometry of a V4 checkpoint, as its `config.json` states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V4Geometry {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub q_lora: usize,
    pub o_groups: usize,
    pub o_lora: usize,
    pub index_heads: usize,
    pub index_dim: usize,
    pub inner: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub vocab: usize,
    pub hash_layers: usize,
    pub hc: usize,
    /// Per layer: 0 (the sliding window only), 4 (compressed sparse) or another rate
    /// (heavily compressed).
    pub compress_ratios: Vec<usize>,
}

fn field(config: &Value, key: &str) -> Result<usize, SynthError> {
    config
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| SynthError::Refused {
            what: format!("config.json {key}"),
            reason: "missing or not an unsigned integer".into(),
        })
}

impl V4Geometry {
    /// The geometry of `config` (the upstream `compress_ratios` form) cut to its first
    /// `layers` layers.
    pub fn from_config(config: &Value, layers: usize) -> Result<V4Geometry, SynthError> {
        let ratios: Vec<usize> = config
            .get("compress_ratios")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_u64).map(|v| v as usize))
            .into_iter()
            .flatten()
            .take(layers)
            .collect();
        if layers == 0 || ratios.len() != layers || layers > field(config, "num_hidden_layers")? {
            return Err(SynthError::Refused {
                what: "config.json compress_ratios".into(),
                reason: format!(
                    "{layers} layers asked for; the config must have at least that many layers and a rate for each"
                ),
            });
        }
        Ok(V4Geometry {
            hidden: field(config, "hidden_size")?,
            heads: field(config, "num_attention_heads")?,
            head_dim: field(config, "head_dim")?,
            q_lora: field(config, "q_lora_rank")?,
            o_groups: field(config, "o_groups")?,
            o_lora: field(config, "o_lora_rank")?,
            index_heads: field(config, "index_n_heads")?,
            index_dim: field(config, "index_head_dim")?,
            inner: field(config, "moe_intermediate_size")?,
            experts: field(config, "n_routed_experts")?,
            experts_per_token: field(config, "num_experts_per_tok")?,
            vocab: field(config, "vocab_size")?,
            hash_layers: field(config, "num_hash_layers")?,
            hc: field(config, "hc_mult")?,
            compress_ratios: ratios,
        })
    }

    fn layers(&self) -> usize {
        self.compress_ratios.len()
    }
}

/// E4M3 codes of magnitude below 1 (no NaN can occur) and one E8M0 scale per 128 x 128
/// block near `1 / sqrt(cols)`.
fn fp8(w: &mut Writer, module: &str, rows: usize, cols: usize) -> Vec<Tensor> {
    let mut codes = w.random(rows * cols);
    for c in &mut codes {
        *c = ((*c & 0x7F) % 0x38) | (*c & 0x80);
    }
    let grid = (rows.div_ceil(128), cols.div_ceil(128));
    let exponent = 127 - (cols as f32).log2().ceil() as u8 / 2;
    vec![
        (
            format!("{module}.weight"),
            Dtype::F8_E4M3,
            vec![rows, cols],
            codes,
        ),
        (
            format!("{module}.scale"),
            Dtype::F8_E8M0,
            vec![grid.0, grid.1],
            vec![exponent; grid.0 * grid.1],
        ),
    ]
}

/// FP4 codes two a byte and E8M0 scales per 32 columns, in DeepSeek's dtypes.
fn fp4(w: &mut Writer, module: &str, rows: usize, cols: usize) -> Vec<Tensor> {
    let (codes, scales) = w.fp4_codes(rows, cols);
    vec![
        (
            format!("{module}.weight"),
            Dtype::I8,
            vec![rows, cols / 2],
            codes,
        ),
        (
            format!("{module}.scale"),
            Dtype::F8_E8M0,
            vec![rows, cols / 32],
            scales,
        ),
    ]
}

fn globals(w: &mut Writer, g: &V4Geometry) -> Vec<Tensor> {
    let (h, hc) = (g.hidden, g.hc);
    vec![
        w.bf16("embed.weight".into(), g.vocab, h),
        w.bf16("head.weight".into(), g.vocab, h),
        w.norm("norm.weight".into(), h),
        w.f32("hc_head_fn".into(), vec![hc, hc * h], 0.0, 0.05),
        w.f32("hc_head_base".into(), vec![hc], 0.0, 0.5),
        w.f32("hc_head_scale".into(), vec![1], 1.0, 0.2),
    ]
}

/// Layer `i`'s tensors but its routed experts.
fn layer_dense(w: &mut Writer, g: &V4Geometry, i: usize) -> Vec<Tensor> {
    let p = format!("layers.{i}.");
    let (h, hd) = (g.hidden, g.head_dim);
    let mut t = Vec::new();
    for which in ["attn", "ffn"] {
        let mix = hc_mix(g.hc);
        t.push(w.f32(format!("{p}hc_{which}_fn"), vec![mix, g.hc * h], 0.0, 0.05));
        t.push(w.f32(format!("{p}hc_{which}_base"), vec![mix], 0.0, 0.5));
        t.push(w.f32(format!("{p}hc_{which}_scale"), vec![3], 1.0, 0.2));
        t.push(w.norm(format!("{p}{which}_norm.weight"), h));
    }
    t.extend(fp8(w, &format!("{p}attn.wq_a"), g.q_lora, h));
    t.push(w.norm(format!("{p}attn.q_norm.weight"), g.q_lora));
    t.extend(fp8(w, &format!("{p}attn.wq_b"), g.heads * hd, g.q_lora));
    t.extend(fp8(w, &format!("{p}attn.wkv"), hd, h));
    t.push(w.norm(format!("{p}attn.kv_norm.weight"), hd));
    let o_cols = g.heads * hd / g.o_groups;
    t.extend(fp8(
        w,
        &format!("{p}attn.wo_a"),
        g.o_groups * g.o_lora,
        o_cols,
    ));
    t.extend(fp8(w, &format!("{p}attn.wo_b"), h, g.o_groups * g.o_lora));
    t.push(w.f32(format!("{p}attn.attn_sink"), vec![g.heads], 0.0, 1.0));
    t.push(w.bf16(format!("{p}ffn.gate.weight"), g.experts, h));
    for (name, rows, cols) in [("w1", g.inner, h), ("w3", g.inner, h), ("w2", h, g.inner)] {
        t.extend(fp8(w, &format!("{p}ffn.shared_experts.{name}"), rows, cols));
    }
    if i < g.hash_layers {
        t.push(hash_table(g, &p));
    } else {
        t.push(w.f32(format!("{p}ffn.gate.bias"), vec![g.experts], 0.0, 0.1));
    }
    let mut compressor = |prefix: String, rate: usize, dim: usize, width: usize| {
        vec![
            w.bf16(format!("{prefix}.wkv.weight"), width, h),
            w.bf16(format!("{prefix}.wgate.weight"), width, h),
            w.f32(format!("{prefix}.ape"), vec![rate, width], 0.0, 0.5),
            w.norm(format!("{prefix}.norm.weight"), dim),
        ]
    };
    match g.compress_ratios[i] {
        0 => {}
        4 => {
            t.extend(compressor(format!("{p}attn.compressor"), 4, hd, 2 * hd));
            let (ih, id) = (g.index_heads, g.index_dim);
            t.extend(compressor(
                format!("{p}attn.indexer.compressor"),
                4,
                id,
                2 * id,
            ));
            t.extend(fp8(w, &format!("{p}attn.indexer.wq_b"), ih * id, g.q_lora));
            t.push(w.bf16(format!("{p}attn.indexer.weights_proj.weight"), ih, h));
        }
        rate => t.extend(compressor(format!("{p}attn.compressor"), rate, hd, hd)),
    }
    t
}

/// A hash-routed layer's token-to-experts table: `experts_per_token` distinct experts per
/// token, spread over all of them.
fn hash_table(g: &V4Geometry, prefix: &str) -> Tensor {
    let k = g.experts_per_token;
    let table = (0..g.vocab)
        .flat_map(|t| {
            let first = t * 7 % g.experts;
            (0..k).flat_map(move |j| {
                (((first + j * (g.experts / k).max(1)) % g.experts) as i64).to_le_bytes()
            })
        })
        .collect();
    (
        format!("{prefix}ffn.gate.tid2eid"),
        Dtype::I64,
        vec![g.vocab, k],
        table,
    )
}

/// The config of the cut checkpoint: `upstream` with its layer count and rates cut to the
/// geometry's, and without the stages that are not generated (multi-token prediction, the
/// speculative decoder's layer picks).
fn cut_config(upstream: &Value, g: &V4Geometry) -> Value {
    let mut config = upstream.clone();
    if let Some(map) = config.as_object_mut() {
        map.insert("num_hidden_layers".into(), json!(g.layers()));
        map.insert("compress_ratios".into(), json!(g.compress_ratios));
        map.insert("num_nextn_predict_layers".into(), json!(0));
        map.retain(|k, _| !k.starts_with("dspark_"));
    }
    config
}

/// Writes the first `layers` layers of a random checkpoint of `upstream`'s geometry into `out`
/// (shards of about 512 MiB, built one at a time), with `upstream` cut to them as its config
/// and the tokenizer files of `tokenizer_from` beside it. `progress` hears each layer written.
pub fn write_synthetic_v4(
    out: &Path,
    upstream: &Value,
    layers: usize,
    tokenizer_from: &Path,
    progress: &dyn Fn(usize),
) -> Result<V4Geometry, SynthError> {
    let g = V4Geometry::from_config(upstream, layers)?;
    let mut w = Writer::new(42);
    let mut shards = Shards::new(out)?;
    shards.push(globals(&mut w, &g))?;
    for i in 0..layers {
        shards.push(layer_dense(&mut w, &g, i))?;
        for e in 0..g.experts {
            for (name, rows, cols) in [
                ("w1", g.inner, g.hidden),
                ("w3", g.inner, g.hidden),
                ("w2", g.hidden, g.inner),
            ] {
                let module = format!("layers.{i}.ffn.experts.{e}.{name}");
                shards.push(fp4(&mut w, &module, rows, cols))?;
            }
        }
        progress(i);
    }
    shards.finish(&cut_config(upstream, &g))?;
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        let from = tokenizer_from.join(file);
        std::fs::copy(&from, out.join(file)).map_err(|e| SynthError::io(&from, e))?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../minirun-runtime/tests/data/deepseek-v4/config.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn the_geometry_is_the_published_flash_s_cut_to_the_layers_asked_for() {
        let g = V4Geometry::from_config(&upstream(), 5).unwrap();
        assert_eq!(
            (g.hidden, g.heads, g.head_dim, g.inner, g.experts, g.vocab),
            (4096, 64, 512, 2048, 256, 129280)
        );
        assert_eq!(g.compress_ratios, [0, 0, 4, 128, 4]);
        let config = cut_config(&upstream(), &g);
        assert_eq!(config["num_hidden_layers"], 5);
        assert_eq!(config["num_nextn_predict_layers"], 0);
        assert!(config.get("dspark_target_layer_ids").is_none());
        assert!(V4Geometry::from_config(&upstream(), 0).is_err());
        assert!(V4Geometry::from_config(&upstream(), 44).is_err());
    }

    #[test]
    fn a_hash_table_names_distinct_experts_for_every_token() {
        let g = V4Geometry::from_config(&upstream(), 1).unwrap();
        let (_, _, dims, bytes) = hash_table(&g, "layers.0.");
        assert_eq!(dims, [129280, 6]);
        for row in bytes.chunks_exact(6 * 8).take(1000) {
            let mut ids: Vec<i64> = row
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert!(ids.iter().all(|&e| (0..256).contains(&e)));
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), 6);
        }
    }
}
