//! A synthetic DeepSeek-V3 or Qwen3-MoE checkpoint in the MLX layout (affine 4-bit, group 64,
//! bf16 scales and biases, stacked `switch_mlp` experts), of any size: for tests and benchmarks
//! of runs larger than their memory budget. Packed weights are SplitMix64 bytes; scales, biases and
//! norms are small bf16 values, so activations stay finite. Not a model of anything: its
//! outputs mean nothing, but they are exactly determined by its bytes, which is what a
//! streamed-versus-resident comparison needs.

use std::path::Path;

use minirun_format::synthetic::{SplitMix64, fill_content};
use safetensors::tensor::Dtype;
use serde_json::json;

use crate::safetensors_writer::{write_root_files, write_shard};

const GROUP: usize = 64;
const HEADS: usize = 4;
const NOPE: usize = 32;
const ROPE: usize = 16;
const V_DIM: usize = 32;
const KV_LORA: usize = 64;
const Q_LORA: usize = 64;
/// Qwen3-MoE's and gpt-oss's key/value heads and head width (their query heads are `HEADS`).
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;

/// The architecture a synthetic checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticArchitecture {
    /// Multi-head latent attention; the first layer dense, the rest MoE with a shared expert.
    DeepSeekV3,
    /// Grouped-query attention with q/k norms; every layer MoE, no shared expert.
    Qwen3Moe,
    /// gpt-oss in MLX's layout (affine 4-bit here): grouped-query attention with biases and
    /// sinks, sliding and full layers alternating; every layer MoE with biased experts stacked
    /// under `mlp.experts`, a biased router.
    GptOss,
}

/// The shape of a synthetic checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct SyntheticShape {
    pub hidden: usize,
    /// Layers in all (DeepSeek-V3's first is dense, the rest MoE; Qwen3-MoE's and gpt-oss's are
    /// all MoE).
    pub layers: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub moe_intermediate: usize,
    pub vocab: usize,
    pub seed: u64,
}

impl SyntheticShape {
    /// Bytes of one routed expert's packed weights, scales and biases.
    pub fn expert_bytes(&self) -> u64 {
        let elements = 3 * self.hidden * self.moe_intermediate;
        (elements / 2 + elements / GROUP * 4) as u64
    }
}

type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

struct Writer {
    rng: SplitMix64,
    seed: u64,
}

impl Writer {
    fn random(&mut self, len: usize) -> Vec<u8> {
        self.seed += 1;
        let mut out = vec![0u8; len];
        fill_content(self.seed, 0, &mut out);
        out
    }

    /// bf16 values of magnitude about `2^exponent`, random mantissa and (optionally) sign.
    fn bf16(&mut self, count: usize, exponent: i32, signed: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(count * 2);
        for _ in 0..count {
            let r = self.rng.next().unwrap_or(0);
            let sign = if signed && r & 1 == 1 { 0x8000 } else { 0 };
            let bits: u16 = sign | (((127 + exponent) as u16) << 7) | ((r >> 8) as u16 & 0x7F);
            out.extend_from_slice(&bits.to_le_bytes());
        }
        out
    }

    /// An affine 4-bit matrix (stack) `[lead.., rows, cols]`: weight, scales, biases.
    fn quantized(&mut self, name: &str, lead: &[usize], rows: usize, cols: usize) -> Vec<Tensor> {
        let n: usize = lead.iter().product::<usize>() * rows;
        let shape = |last: usize| [lead, &[rows, last]].concat();
        let groups = n * cols / GROUP;
        // Weights about scale * (q - 8): q uniform in 0..16, scale 2^-6 / sqrt(cols / 64).
        let exponent = -6 - (cols as f64 / 64.0).log2().round() as i32 / 2;
        let scales = self.bf16(groups, exponent, false);
        let biases: Vec<u8> = scales
            .chunks_exact(2)
            .flat_map(|s| {
                let scale = half_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
                f32_to_bf16(-8.0 * scale).to_le_bytes()
            })
            .collect();
        vec![
            (
                format!("{name}.weight"),
                Dtype::U32,
                shape(cols / 8),
                self.random(n * cols / 2),
            ),
            (
                format!("{name}.scales"),
                Dtype::BF16,
                shape(cols / GROUP),
                scales,
            ),
            (
                format!("{name}.biases"),
                Dtype::BF16,
                shape(cols / GROUP),
                biases,
            ),
        ]
    }

    fn norm(&mut self, name: &str, len: usize) -> Tensor {
        let ones: Vec<u8> = (0..len).flat_map(|_| 0x3F80u16.to_le_bytes()).collect();
        (name.to_string(), Dtype::BF16, vec![len], ones)
    }
}

fn half_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

fn f32_to_bf16(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn attention(w: &mut Writer, p: &str, hidden: usize) -> Vec<Tensor> {
    let mut t = Vec::new();
    t.extend(w.quantized(&format!("{p}.q_a_proj"), &[], Q_LORA, hidden));
    t.push(w.norm(&format!("{p}.q_a_layernorm.weight"), Q_LORA));
    t.extend(w.quantized(&format!("{p}.q_b_proj"), &[], HEADS * (NOPE + ROPE), Q_LORA));
    t.extend(w.quantized(
        &format!("{p}.kv_a_proj_with_mqa"),
        &[],
        KV_LORA + ROPE,
        hidden,
    ));
    t.push(w.norm(&format!("{p}.kv_a_layernorm.weight"), KV_LORA));
    t.push((
        format!("{p}.embed_q.weight"),
        Dtype::BF16,
        vec![HEADS, KV_LORA, NOPE],
        w.bf16(HEADS * KV_LORA * NOPE, -3, true),
    ));
    t.extend(w.quantized(&format!("{p}.unembed_out"), &[HEADS], V_DIM, KV_LORA));
    t.extend(w.quantized(&format!("{p}.o_proj"), &[], hidden, HEADS * V_DIM));
    t
}

fn grouped_attention(w: &mut Writer, p: &str, hidden: usize) -> Vec<Tensor> {
    let mut t = w.quantized(&format!("{p}.q_proj"), &[], HEADS * HEAD_DIM, hidden);
    t.extend(w.quantized(&format!("{p}.k_proj"), &[], KV_HEADS * HEAD_DIM, hidden));
    t.extend(w.quantized(&format!("{p}.v_proj"), &[], KV_HEADS * HEAD_DIM, hidden));
    t.extend(w.quantized(&format!("{p}.o_proj"), &[], hidden, HEADS * HEAD_DIM));
    t.push(w.norm(&format!("{p}.q_norm.weight"), HEAD_DIM));
    t.push(w.norm(&format!("{p}.k_norm.weight"), HEAD_DIM));
    t
}

/// gpt-oss's layer: attention with biases and sinks, a biased router, biased experts.
fn gpt_oss_layer(w: &mut Writer, s: &SyntheticShape, p: &str) -> Vec<Tensor> {
    let (h, m, e) = (s.hidden, s.moe_intermediate, s.experts);
    let mut t = Vec::new();
    let mut biased = |w: &mut Writer, name: String, lead: &[usize], rows: usize, cols: usize| {
        t.extend(w.quantized(&name, lead, rows, cols));
        let count = lead.iter().product::<usize>() * rows;
        let dims = [lead, &[rows]].concat();
        t.push((
            format!("{name}.bias"),
            Dtype::BF16,
            dims,
            w.bf16(count, -5, true),
        ));
    };
    let a = format!("{p}.self_attn");
    biased(w, format!("{a}.q_proj"), &[], HEADS * HEAD_DIM, h);
    biased(w, format!("{a}.k_proj"), &[], KV_HEADS * HEAD_DIM, h);
    biased(w, format!("{a}.v_proj"), &[], KV_HEADS * HEAD_DIM, h);
    biased(w, format!("{a}.o_proj"), &[], h, HEADS * HEAD_DIM);
    biased(w, format!("{p}.mlp.router"), &[], e, h);
    biased(w, format!("{p}.mlp.experts.gate_proj"), &[e], m, h);
    biased(w, format!("{p}.mlp.experts.up_proj"), &[e], m, h);
    biased(w, format!("{p}.mlp.experts.down_proj"), &[e], h, m);
    t.push((
        format!("{a}.sinks"),
        Dtype::BF16,
        vec![HEADS],
        w.bf16(HEADS, 0, true),
    ));
    t.push(w.norm(&format!("{p}.input_layernorm.weight"), h));
    t.push(w.norm(&format!("{p}.post_attention_layernorm.weight"), h));
    t
}

fn layer(
    w: &mut Writer,
    s: &SyntheticShape,
    architecture: SyntheticArchitecture,
    i: usize,
) -> Vec<Tensor> {
    let p = format!("model.layers.{i}");
    if architecture == SyntheticArchitecture::GptOss {
        return gpt_oss_layer(w, s, &p);
    }
    let qwen = architecture == SyntheticArchitecture::Qwen3Moe;
    let mut t = match qwen {
        true => grouped_attention(w, &format!("{p}.self_attn"), s.hidden),
        false => attention(w, &format!("{p}.self_attn"), s.hidden),
    };
    t.push(w.norm(&format!("{p}.input_layernorm.weight"), s.hidden));
    t.push(w.norm(&format!("{p}.post_attention_layernorm.weight"), s.hidden));
    let (h, m) = (s.hidden, s.moe_intermediate);
    let mlp = |w: &mut Writer, prefix: &str, lead: &[usize], inner: usize| {
        let mut t = w.quantized(&format!("{prefix}.gate_proj"), lead, inner, h);
        t.extend(w.quantized(&format!("{prefix}.up_proj"), lead, inner, h));
        t.extend(w.quantized(&format!("{prefix}.down_proj"), lead, h, inner));
        t
    };
    if i == 0 && !qwen {
        t.extend(mlp(w, &format!("{p}.mlp"), &[], 2 * m));
        return t;
    }
    t.extend(mlp(w, &format!("{p}.mlp.switch_mlp"), &[s.experts], m));
    if !qwen {
        t.extend(mlp(w, &format!("{p}.mlp.shared_experts"), &[], m));
    }
    t.push((
        format!("{p}.mlp.gate.weight"),
        Dtype::BF16,
        vec![s.experts, h],
        w.bf16(s.experts * h, -4, true),
    ));
    if qwen {
        return t;
    }
    let bias: Vec<u8> = (0..s.experts)
        .flat_map(|e| ((e % 7) as f32 * 1e-3).to_le_bytes())
        .collect();
    t.push((
        format!("{p}.mlp.gate.e_score_correction_bias"),
        Dtype::F32,
        vec![s.experts],
        bias,
    ));
    t
}

fn config(s: &SyntheticShape, architecture: SyntheticArchitecture) -> serde_json::Value {
    let quantization = json!({ "group_size": GROUP, "bits": 4, "mode": "affine" });
    if architecture == SyntheticArchitecture::GptOss {
        let layer_types: Vec<&str> = (0..s.layers)
            .map(|i| match i % 2 {
                0 => "sliding_attention",
                _ => "full_attention",
            })
            .collect();
        return json!({
            "architectures": ["GptOssForCausalLM"], "attention_bias": true, "eos_token_id": 1,
            "experts_per_token": s.experts_per_token, "head_dim": HEAD_DIM, "hidden_act": "silu",
            "hidden_size": s.hidden, "intermediate_size": s.moe_intermediate,
            "layer_types": layer_types, "max_position_embeddings": 4096, "model_type": "gpt_oss",
            "num_attention_heads": HEADS, "num_experts_per_tok": s.experts_per_token,
            "num_hidden_layers": s.layers, "num_key_value_heads": KV_HEADS,
            "num_local_experts": s.experts, "quantization": quantization,
            "quantization_config": quantization, "rms_norm_eps": 1e-5,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": false},
            "rope_theta": 150000, "sliding_window": 8, "swiglu_limit": 7.0,
            "tie_word_embeddings": false, "vocab_size": s.vocab
        });
    }
    if architecture == SyntheticArchitecture::Qwen3Moe {
        return json!({
            "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
            "bos_token_id": 0, "decoder_sparse_step": 1, "eos_token_id": 1, "head_dim": HEAD_DIM,
            "hidden_act": "silu", "hidden_size": s.hidden,
            "intermediate_size": 2 * s.moe_intermediate, "max_position_embeddings": 4096,
            "mlp_only_layers": [], "model_type": "qwen3_moe",
            "moe_intermediate_size": s.moe_intermediate, "norm_topk_prob": true,
            "num_attention_heads": HEADS, "num_experts": s.experts,
            "num_experts_per_tok": s.experts_per_token, "num_hidden_layers": s.layers,
            "num_key_value_heads": KV_HEADS, "quantization": quantization,
            "quantization_config": quantization, "rms_norm_eps": 1e-6, "rope_scaling": null,
            "rope_theta": 1000000.0, "tie_word_embeddings": false, "use_sliding_window": false,
            "vocab_size": s.vocab
        });
    }
    json!({
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 1, "hidden_act": "silu",
        "hidden_size": s.hidden, "intermediate_size": 2 * s.moe_intermediate,
        "kv_lora_rank": KV_LORA, "max_position_embeddings": 4096, "model_type": "deepseek_v3",
        "moe_intermediate_size": s.moe_intermediate, "moe_layer_freq": 1, "n_group": 1,
        "n_routed_experts": s.experts, "n_shared_experts": 1, "norm_topk_prob": true,
        "num_attention_heads": HEADS, "num_experts_per_tok": s.experts_per_token,
        "num_hidden_layers": s.layers, "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA,
        "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "quantization": quantization,
        "quantization_config": quantization, "rms_norm_eps": 1e-6, "rope_scaling": null,
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
        "v_head_dim": V_DIM, "vocab_size": s.vocab
    })
}

/// Writes a DeepSeek-V3 checkpoint into `out` ([`write_synthetic`]).
pub fn write_synthetic_deepseek(
    out: &Path,
    shape: &SyntheticShape,
    tokenizer_from: &Path,
) -> std::io::Result<()> {
    write_synthetic(
        out,
        shape,
        SyntheticArchitecture::DeepSeekV3,
        tokenizer_from,
    )
}

/// Writes the checkpoint into `out` (one shard per layer), with the tokenizer files of
/// `tokenizer_from` copied beside it (its vocabulary must have `shape.vocab` entries or fewer).
pub fn write_synthetic(
    out: &Path,
    shape: &SyntheticShape,
    architecture: SyntheticArchitecture,
    tokenizer_from: &Path,
) -> std::io::Result<()> {
    let io = std::io::Error::other;
    std::fs::create_dir_all(out)?;
    let mut w = Writer {
        rng: SplitMix64::new(shape.seed),
        seed: shape.seed << 20,
    };
    let mut weight_map = serde_json::Map::new();
    let shards = shape.layers + 1;
    for shard_index in 0..shards {
        let tensors = match shard_index {
            0 => {
                let mut t = w.quantized("model.embed_tokens", &[], shape.vocab, shape.hidden);
                t.extend(w.quantized("lm_head", &[], shape.vocab, shape.hidden));
                t.push(w.norm("model.norm.weight", shape.hidden));
                t
            }
            i => layer(&mut w, shape, architecture, i - 1),
        };
        let shard = format!("model-{:05}-of-{shards:05}.safetensors", shard_index + 1);
        write_shard(&out.join(&shard), &tensors, "mlx").map_err(io)?;
        for (name, ..) in &tensors {
            weight_map.insert(name.clone(), json!(shard));
        }
    }
    write_root_files(out, weight_map, &config(shape, architecture)).map_err(io)?;
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer_from.join(file), out.join(file))?;
    }
    std::fs::write(
        out.join("LICENSE"),
        b"Synthetic test data made by minirun-synth; not a model.\n",
    )?;
    Ok(())
}
