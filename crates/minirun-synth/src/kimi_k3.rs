//! A random Kimi K3 checkpoint under the upstream names and in the upstream storage (routed
//! experts compressed-tensors MXFP4: U8 codes two a byte, U8 E8M0 scales per 32 columns and
//! each matrix's shape; every other matrix BF16; convolutions, decay and biases F32) at the
//! geometry an upstream `config.json` gives, the published K3's included, cut to its first
//! `layers` layers: for measuring streaming at the sizes the published artifact has
//! (`minirun pack --layout kimi-k3-published` turns it into that layout).
//!
//! Not a model of anything: its outputs mean nothing, but they are exactly determined by its
//! bytes. Values are scaled so that activations stay finite through the layers.

use std::path::Path;

use safetensors::tensor::Dtype;
use serde_json::{Value, json};

use crate::SynthError;
use crate::safetensors_writer::{Shards, Tensor, Writer};

/// A layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Kimi delta attention (linear).
    Kda,
    /// Multi-head latent attention (full).
    Mla,
}

/// The geometry of a K3 checkpoint, as its `config.json`'s `text_config` states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K3Geometry {
    pub hidden: usize,
    pub vocab: usize,
    /// The dense layers' MLP width.
    pub dense_inner: usize,
    /// Layers before the first mixture of experts.
    pub first_dense: usize,
    pub kda_heads: usize,
    pub kda_head_dim: usize,
    pub conv_kernel: usize,
    pub heads: usize,
    pub q_lora: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    pub output_gate: bool,
    pub experts: usize,
    pub experts_per_token: usize,
    /// Rows of w1/w3 (and columns of w2).
    pub expert_inner: usize,
    /// The latent width the routed experts work in.
    pub latent: usize,
    pub latent_norm: bool,
    pub shared: usize,
    /// Per layer.
    pub mixers: Vec<Mixer>,
}

fn refused(what: &str, reason: impl Into<String>) -> SynthError {
    SynthError::Refused {
        what: format!("config.json text_config.{what}"),
        reason: reason.into(),
    }
}

fn field(config: &Value, key: &str) -> Result<usize, SynthError> {
    config
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| refused(key, "missing or not an unsigned integer"))
}

fn flag(config: &Value, key: &str) -> Result<bool, SynthError> {
    config
        .get(key)
        .and_then(Value::as_bool)
        .ok_or_else(|| refused(key, "missing or not a boolean"))
}

/// The 1-indexed layer numbers of `linear_attn_config.key`.
fn layer_list(linear: &Value, key: &str) -> Result<Vec<usize>, SynthError> {
    linear
        .get(key)
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter()
                .map(|n| n.as_u64().map(|n| n as usize))
                .collect()
        })
        .ok_or_else(|| {
            refused(
                &format!("linear_attn_config.{key}"),
                "missing or not a list of layer numbers",
            )
        })
}

impl K3Geometry {
    /// The geometry of `config` (a K3 `config.json`, `text_config` inside) cut to its first
    /// `layers` layers.
    pub fn from_config(config: &Value, layers: usize) -> Result<K3Geometry, SynthError> {
        let text = config
            .get("text_config")
            .ok_or_else(|| refused("", "no text_config: not a Kimi K3 configuration"))?;
        let total = field(text, "num_hidden_layers")?;
        if layers == 0 || layers > total {
            return Err(refused(
                "num_hidden_layers",
                format!("{layers} layers asked for, of {total}"),
            ));
        }
        if field(text, "moe_layer_freq")? != 1 {
            return Err(refused(
                "moe_layer_freq",
                "is not 1: this generator writes every layer after the dense ones as a mixture of experts",
            ));
        }
        let linear = text
            .get("linear_attn_config")
            .ok_or_else(|| refused("linear_attn_config", "missing"))?;
        let (kda, full) = (
            layer_list(linear, "kda_layers")?,
            layer_list(linear, "full_attn_layers")?,
        );
        let mixers = (1..=layers)
            .map(|n| match (kda.contains(&n), full.contains(&n)) {
                (true, false) => Ok(Mixer::Kda),
                (false, true) => Ok(Mixer::Mla),
                _ => Err(refused(
                    "linear_attn_config",
                    format!("layer {n} is not in exactly one of kda_layers and full_attn_layers"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(K3Geometry {
            hidden: field(text, "hidden_size")?,
            vocab: field(text, "vocab_size")?,
            dense_inner: field(text, "intermediate_size")?,
            first_dense: field(text, "first_k_dense_replace")?,
            kda_heads: field(linear, "num_heads")?,
            kda_head_dim: field(linear, "head_dim")?,
            conv_kernel: field(linear, "short_conv_kernel_size")?,
            heads: field(text, "num_attention_heads")?,
            q_lora: field(text, "q_lora_rank")?,
            kv_lora: field(text, "kv_lora_rank")?,
            nope: field(text, "qk_nope_head_dim")?,
            rope: field(text, "qk_rope_head_dim")?,
            v_dim: field(text, "v_head_dim")?,
            output_gate: flag(text, "mla_use_output_gate")?,
            experts: field(text, "num_experts")?,
            experts_per_token: field(text, "num_experts_per_token")?,
            expert_inner: field(text, "moe_intermediate_size")?,
            latent: field(text, "routed_expert_hidden_size")?,
            latent_norm: flag(text, "latent_moe_use_norm")?,
            shared: field(text, "num_shared_experts")?,
            mixers,
        })
    }

    pub fn layers(&self) -> usize {
        self.mixers.len()
    }

    /// `(projection, rows, cols)` of the routed experts, in container order.
    pub fn expert_shapes(&self) -> [(&'static str, usize, usize); 3] {
        [
            ("w1", self.expert_inner, self.latent),
            ("w3", self.expert_inner, self.latent),
            ("w2", self.latent, self.expert_inner),
        ]
    }
}

const ROOT: &str = "language_model.";

fn globals(w: &mut Writer, g: &K3Geometry) -> Vec<Tensor> {
    let (h, m) = (g.hidden, format!("{ROOT}model."));
    vec![
        w.bf16(format!("{m}embed_tokens.weight"), g.vocab, h),
        w.bf16(format!("{ROOT}lm_head.weight"), g.vocab, h),
        w.norm(format!("{m}norm.weight"), h),
        w.norm(format!("{m}output_attn_res.norm_weight"), h),
        w.bf16(format!("{m}output_attn_res.proj_weight"), 1, h),
    ]
}

fn kda(w: &mut Writer, g: &K3Geometry, a: &str) -> Vec<Tensor> {
    let (h, d) = (g.hidden, g.kda_head_dim);
    let projection = g.kda_heads * d;
    let mut t = Vec::new();
    for p in ["q", "k", "v"] {
        t.push(w.bf16(format!("{a}{p}_proj.weight"), projection, h));
        let shape = vec![projection, 1, g.conv_kernel];
        t.push(w.f32(format!("{a}{p}_conv1d.weight"), shape, 0.0, 0.5));
    }
    t.push(a_log(w, g, a));
    t.push(w.f32(format!("{a}dt_bias"), vec![projection], 0.0, 0.5));
    t.push(w.bf16(format!("{a}b_proj.weight"), g.kda_heads, h));
    t.push(w.bf16(format!("{a}f_a_proj.weight"), d, h));
    t.push(w.bf16(format!("{a}f_b_proj.weight"), projection, d));
    t.push(w.bf16(format!("{a}g_proj.weight"), projection, h));
    t.push(w.norm(format!("{a}o_norm.weight"), d));
    t.push(w.bf16(format!("{a}o_proj.weight"), h, projection));
    t
}

/// `A_log` as the upstream stores it: one per head, then zeros up to `head_dim` when the heads
/// are fewer.
fn a_log(w: &mut Writer, g: &K3Geometry, a: &str) -> Tensor {
    let len = g.kda_heads.max(g.kda_head_dim);
    let data = (0..len)
        .flat_map(|i| match i < g.kda_heads {
            true => (0.5 + 0.5 * w.unit()).to_le_bytes(),
            false => 0f32.to_le_bytes(),
        })
        .collect();
    (format!("{a}A_log"), Dtype::F32, vec![len], data)
}

fn mla(w: &mut Writer, g: &K3Geometry, a: &str) -> Vec<Tensor> {
    let h = g.hidden;
    let mut t = vec![
        w.bf16(format!("{a}q_a_proj.weight"), g.q_lora, h),
        w.norm(format!("{a}q_a_layernorm.weight"), g.q_lora),
        w.bf16(
            format!("{a}q_b_proj.weight"),
            g.heads * (g.nope + g.rope),
            g.q_lora,
        ),
        w.bf16(
            format!("{a}kv_a_proj_with_mqa.weight"),
            g.kv_lora + g.rope,
            h,
        ),
        w.norm(format!("{a}kv_a_layernorm.weight"), g.kv_lora),
        w.bf16(
            format!("{a}kv_b_proj.weight"),
            g.heads * (g.nope + g.v_dim),
            g.kv_lora,
        ),
        w.bf16(format!("{a}o_proj.weight"), h, g.heads * g.v_dim),
    ];
    if g.output_gate {
        t.push(w.bf16(format!("{a}g_proj.weight"), g.heads * g.v_dim, h));
    }
    t
}

fn mlp(w: &mut Writer, prefix: &str, hidden: usize, inner: usize) -> Vec<Tensor> {
    vec![
        w.bf16(format!("{prefix}gate_proj.weight"), inner, hidden),
        w.bf16(format!("{prefix}up_proj.weight"), inner, hidden),
        w.bf16(format!("{prefix}down_proj.weight"), hidden, inner),
    ]
}

/// A mixture-of-experts layer's router, latent projections and shared experts.
fn moe_dense(w: &mut Writer, g: &K3Geometry, moe: &str) -> Vec<Tensor> {
    let h = g.hidden;
    let mut t = vec![
        w.bf16(format!("{moe}gate.weight"), g.experts, h),
        w.f32(
            format!("{moe}gate.e_score_correction_bias"),
            vec![g.experts],
            0.0,
            0.05,
        ),
        w.bf16(format!("{moe}routed_expert_down_proj.weight"), g.latent, h),
        w.bf16(format!("{moe}routed_expert_up_proj.weight"), h, g.latent),
    ];
    if g.latent_norm {
        t.push(w.norm(format!("{moe}routed_expert_norm.weight"), g.latent));
    }
    if g.shared > 0 {
        let inner = g.expert_inner * g.shared;
        t.extend(mlp(w, &format!("{moe}shared_experts."), h, inner));
    }
    t
}

/// Layer `i`'s tensors but its routed experts.
fn layer_dense(w: &mut Writer, g: &K3Geometry, i: usize) -> Vec<Tensor> {
    let (p, h) = (format!("{ROOT}model.layers.{i}."), g.hidden);
    let mut t = vec![
        w.norm(format!("{p}input_layernorm.weight"), h),
        w.norm(format!("{p}post_attention_layernorm.weight"), h),
    ];
    for residual in ["self_attention_res", "mlp_res"] {
        t.push(w.norm(format!("{p}{residual}.norm_weight"), h));
        t.push(w.bf16(format!("{p}{residual}.proj_weight"), 1, h));
    }
    let attention = format!("{p}self_attn.");
    t.extend(match g.mixers[i] {
        Mixer::Kda => kda(w, g, &attention),
        Mixer::Mla => mla(w, g, &attention),
    });
    match i < g.first_dense {
        true => t.extend(mlp(w, &format!("{p}mlp."), h, g.dense_inner)),
        false => t.extend(moe_dense(w, g, &format!("{p}block_sparse_moe."))),
    }
    t
}

/// One routed expert's matrix in compressed-tensors `mxfp4-pack-quantized` storage.
fn mxfp4(w: &mut Writer, module: &str, rows: usize, cols: usize) -> Vec<Tensor> {
    let (codes, scales) = w.fp4_codes(rows, cols);
    let shape = [rows as i64, cols as i64]
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    vec![
        (
            format!("{module}.weight_packed"),
            Dtype::U8,
            vec![rows, cols / 2],
            codes,
        ),
        (
            format!("{module}.weight_scale"),
            Dtype::U8,
            vec![rows, cols / 32],
            scales,
        ),
        (format!("{module}.weight_shape"), Dtype::I64, vec![2], shape),
    ]
}

/// The config of the cut checkpoint: `upstream` with its layer count and layer lists cut to
/// the geometry's.
fn cut_config(upstream: &Value, g: &K3Geometry) -> Value {
    let mut config = upstream.clone();
    let layers = g.layers();
    let text = &mut config["text_config"];
    text["num_hidden_layers"] = json!(layers);
    for (key, mixer) in [("kda_layers", Mixer::Kda), ("full_attn_layers", Mixer::Mla)] {
        let numbers: Vec<usize> = (1..=layers).filter(|&n| g.mixers[n - 1] == mixer).collect();
        text["linear_attn_config"][key] = json!(numbers);
    }
    config
}

/// K3's reserved ids, after the mergeable tokens.
const RESERVED_TOKENS: usize = 256;

/// A byte-pair vocabulary in `tiktoken.model` form (`base64(bytes) SP rank` lines) of
/// `mergeable` tokens: the 256 single bytes, then two-byte and three-byte strings in
/// lexicographic order. Every token is made by merging its parts in rank order, so it is a
/// vocabulary a byte-pair encoder takes; every id a model of `mergeable` + 256 ids can pick
/// decodes.
pub fn tiktoken_model(mergeable: usize) -> Vec<u8> {
    use base64::Engine;
    let strings = (0..=255u8)
        .map(|b| vec![b])
        .chain((0..=u16::MAX).map(|v| v.to_be_bytes().to_vec()))
        .chain((0..1u32 << 24).map(|v| v.to_be_bytes()[1..].to_vec()));
    let mut out = Vec::new();
    for (rank, token) in strings.take(mergeable).enumerate() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(token);
        out.extend_from_slice(format!("{encoded} {rank}\n").as_bytes());
    }
    out
}

/// Writes the first `layers` layers of a random checkpoint of `upstream`'s geometry into `out`
/// (shards of about 512 MiB, built one at a time), with `upstream` cut to them as its config
/// and a `tiktoken.model` of the config's vocabulary ([`tiktoken_model`]: the vocabulary less
/// K3's 256 reserved ids) beside it. `progress` hears each layer written.
pub fn write_synthetic_k3(
    out: &Path,
    upstream: &Value,
    layers: usize,
    progress: &dyn Fn(usize),
) -> Result<K3Geometry, SynthError> {
    let g = K3Geometry::from_config(upstream, layers)?;
    if g.vocab <= RESERVED_TOKENS {
        return Err(refused(
            "vocab_size",
            format!(
                "{} leaves no ids beside K3's {RESERVED_TOKENS} reserved ones",
                g.vocab
            ),
        ));
    }
    let mut w = Writer::new(43);
    let mut shards = Shards::new(out)?;
    shards.push(globals(&mut w, &g))?;
    for i in 0..layers {
        shards.push(layer_dense(&mut w, &g, i))?;
        if i >= g.first_dense {
            for e in 0..g.experts {
                for (name, rows, cols) in g.expert_shapes() {
                    let module =
                        format!("{ROOT}model.layers.{i}.block_sparse_moe.experts.{e}.{name}");
                    shards.push(mxfp4(&mut w, &module, rows, cols))?;
                }
            }
        }
        progress(i);
    }
    shards.finish(&cut_config(upstream, &g))?;
    let tokenizer = out.join("tiktoken.model");
    std::fs::write(&tokenizer, tiktoken_model(g.vocab - RESERVED_TOKENS))
        .map_err(|e| SynthError::io(&tokenizer, e))?;
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(dir: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../minirun-runtime/tests/data/kimi-k3")
            .join(dir)
    }

    fn config(dir: &str) -> Value {
        serde_json::from_slice(&std::fs::read(data(dir).join("config.json")).unwrap()).unwrap()
    }

    #[test]
    fn the_geometry_is_the_published_k3_s_cut_to_the_layers_asked_for() {
        let g = K3Geometry::from_config(&config(""), 5).unwrap();
        assert_eq!(
            (g.hidden, g.experts, g.expert_inner, g.latent, g.vocab),
            (7168, 896, 3072, 3584, 163840)
        );
        assert_eq!(
            g.mixers,
            [Mixer::Kda, Mixer::Kda, Mixer::Kda, Mixer::Mla, Mixer::Kda]
        );
        let cut = cut_config(&config(""), &g);
        assert_eq!(cut["text_config"]["num_hidden_layers"], 5);
        let linear = &cut["text_config"]["linear_attn_config"];
        assert_eq!(linear["kda_layers"], json!([1, 2, 3, 5]));
        assert_eq!(linear["full_attn_layers"], json!([4]));
        assert!(K3Geometry::from_config(&config(""), 0).is_err());
        assert!(K3Geometry::from_config(&config(""), 94).is_err());
    }

    #[test]
    fn a_layer_in_neither_list_or_both_is_refused() {
        let mut both = config("");
        let linear = &mut both["text_config"]["linear_attn_config"];
        linear["full_attn_layers"] = json!([1, 4]);
        let err = K3Geometry::from_config(&both, 2).unwrap_err().to_string();
        assert!(err.contains("layer 1 is not in exactly one"), "{err}");
        let mut neither = config("");
        neither["text_config"]["linear_attn_config"]["kda_layers"] = json!([1, 3]);
        let err = K3Geometry::from_config(&neither, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer 2 is not in exactly one"), "{err}");
        let mut not_numbers = config("");
        not_numbers["text_config"]["linear_attn_config"]["kda_layers"] = json!([1, "2"]);
        let err = K3Geometry::from_config(&not_numbers, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a list of layer numbers"), "{err}");
    }

    /// Name, dtype and shape of every tensor in a safetensors file.
    fn header(path: &Path) -> Vec<(String, Dtype, Vec<usize>)> {
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(n, t)| (n, t.dtype(), t.shape().to_vec()))
            .collect()
    }

    /// The generator's tensor list, at the tiny fixture's config, is the fixture's: the same
    /// names, dtypes and shapes (made with mlx-lm and loaded back by it), its experts in the
    /// upstream compressed-tensors storage instead of MLX's.
    #[test]
    fn at_the_tiny_fixture_s_config_the_tensors_are_the_fixture_s() {
        let out = tempfile::tempdir().unwrap();
        let upstream = config("hf-k3mix");
        let layers = upstream["text_config"]["num_hidden_layers"]
            .as_u64()
            .unwrap() as usize;
        write_synthetic_k3(out.path(), &upstream, layers, &|_| {}).unwrap();
        let index: Value = serde_json::from_slice(
            &std::fs::read(out.path().join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let shards: std::collections::BTreeSet<&str> = index["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(Value::as_str)
            .collect();
        let mut got: Vec<_> = shards
            .iter()
            .flat_map(|s| header(&out.path().join(s)))
            .filter(|(n, _, _)| !n.ends_with(".weight_shape"))
            .collect();
        got.sort();
        let mut want: Vec<_> = header(&data("hf-k3mix").join("model.safetensors"))
            .into_iter()
            .map(|(n, dtype, shape)| match n.strip_suffix(".scales") {
                Some(module) => (format!("{module}.weight_scale"), Dtype::U8, shape),
                None if n.contains(".experts.") => {
                    let codes = vec![shape[0], shape[1] * 4];
                    (n.replace(".weight", ".weight_packed"), Dtype::U8, codes)
                }
                None => (n, dtype, shape),
            })
            .collect();
        want.sort();
        assert_eq!(got, want);
        assert!(out.path().join("tiktoken.model").is_file());
        // Cut to all its layers, the fixture's config is written back unchanged.
        let written: Value =
            serde_json::from_slice(&std::fs::read(out.path().join("config.json")).unwrap())
                .unwrap();
        assert_eq!(written, upstream);
    }

    #[test]
    fn the_vocabulary_is_single_bytes_then_pairs_then_triples() {
        let model = String::from_utf8(tiktoken_model(256 + 65536 + 2)).unwrap();
        let lines: Vec<&str> = model.lines().collect();
        assert_eq!(lines.len(), 256 + 65536 + 2);
        assert_eq!(lines[0], "AA== 0");
        assert_eq!(lines[255], "/w== 255");
        assert_eq!(lines[256], "AAA= 256");
        assert_eq!(lines[256 + 65535], "//8= 65791");
        assert_eq!(lines[256 + 65536], "AAAA 65792");
        assert_eq!(lines[256 + 65537], "AAAB 65793");
    }
}
