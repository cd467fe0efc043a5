//! A random DeepSeek V4 checkpoint in DeepSeek's own storage (FP8 e4m3 with E8M0 block scales,
//! FP4 experts, BF16 and F32 plain tensors), wider than the fixture: for the tests of streaming
//! and of the published layout, which need matrices of whole 128 x 128 blocks and experts whose
//! regions fill 16 KiB pages.
#![allow(non_snake_case, dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;

type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

const HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const Q_LORA: usize = 512;
const GROUPS: usize = 2;
const O_LORA: usize = 512;
const INDEX_HEADS: usize = 4;
const INDEX_DIM: usize = 64;
const HC: usize = 4;
const VOCAB: usize = 512;

/// What varies between the generated checkpoints.
pub struct WideShape {
    pub hidden: usize,
    pub inner: usize,
    pub experts: usize,
    /// `sliding`, `csa` or `hca`, per layer.
    pub layers: &'static [&'static str],
}

/// Layers large enough that streaming them at the floor saves memory.
pub const WIDE: WideShape = WideShape {
    hidden: 256,
    inner: 512,
    experts: 8,
    layers: &["sliding", "csa", "hca", "csa", "hca"],
};

/// SplitMix64.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

struct Writer {
    random: Random,
    tensors: Tensors,
}

impl Writer {
    fn f32(&mut self, name: &str, shape: Vec<usize>, mean: f32, spread: f32) {
        let n = shape.iter().product();
        let data = (0..n)
            .flat_map(|_| (mean + spread * self.random.unit()).to_le_bytes())
            .collect();
        self.tensors.insert(name.into(), (Dtype::F32, shape, data));
    }

    fn bf16(&mut self, name: &str, rows: usize, cols: usize) {
        let spread = 1.0 / (cols as f32).sqrt();
        let data = (0..rows * cols)
            .flat_map(|_| {
                let bits = (spread * self.random.unit()).to_bits();
                ((bits >> 16) as u16).to_le_bytes()
            })
            .collect();
        self.tensors
            .insert(name.into(), (Dtype::BF16, vec![rows, cols], data));
    }

    /// E4M3 codes of magnitude below 1.75 (no NaN) and one E8M0 scale per 128 x 128 block
    /// near `1 / sqrt(cols)`.
    fn fp8(&mut self, module: &str, rows: usize, cols: usize) {
        let codes = (0..rows * cols)
            .map(|_| (self.random.next() % 0x38) as u8 | ((self.random.next() & 1) as u8) << 7)
            .collect();
        let grid = (rows.div_ceil(128), cols.div_ceil(128));
        let exponent = 127 - (cols as f32).log2().ceil() as u8 / 2;
        let scales = vec![exponent; grid.0 * grid.1];
        self.tensors.insert(
            format!("{module}.weight"),
            (Dtype::F8_E4M3, vec![rows, cols], codes),
        );
        self.tensors.insert(
            format!("{module}.scale"),
            (Dtype::F8_E8M0, vec![grid.0, grid.1], scales),
        );
    }

    /// FP4 codes two a byte and E8M0 scales per 32 columns.
    fn fp4(&mut self, module: &str, rows: usize, cols: usize) {
        let codes = (0..rows * cols / 2)
            .map(|_| self.random.next() as u8)
            .collect();
        let exponent = 125 - (cols as f32).log2().ceil() as u8 / 2;
        let scales = vec![exponent; rows * cols / 32];
        self.tensors.insert(
            format!("{module}.weight"),
            (Dtype::I8, vec![rows, cols / 2], codes),
        );
        self.tensors.insert(
            format!("{module}.scale"),
            (Dtype::F8_E8M0, vec![rows, cols / 32], scales),
        );
    }
}

pub fn write(dir: &Path, fixture: &Path, shape: &WideShape) {
    let (HIDDEN, INNER, EXPERTS) = (shape.hidden, shape.inner, shape.experts);
    let mut w = Writer {
        random: Random(3),
        tensors: Tensors::new(),
    };
    let mix = (2 + HC) * HC;
    w.bf16("embed.weight", VOCAB, HIDDEN);
    w.bf16("head.weight", VOCAB, HIDDEN);
    w.f32("norm.weight", vec![HIDDEN], 1.0, 0.1);
    w.f32("hc_head_fn", vec![HC, HC * HIDDEN], 0.0, 0.05);
    w.f32("hc_head_base", vec![HC], 0.0, 0.5);
    w.f32("hc_head_scale", vec![1], 1.0, 0.2);
    for (layer, kind) in shape.layers.iter().enumerate() {
        let p = format!("layers.{layer}.");
        for which in ["attn", "ffn"] {
            w.f32(
                &format!("{p}hc_{which}_fn"),
                vec![mix, HC * HIDDEN],
                0.0,
                0.05,
            );
            w.f32(&format!("{p}hc_{which}_base"), vec![mix], 0.0, 0.5);
            w.f32(&format!("{p}hc_{which}_scale"), vec![3], 1.0, 0.2);
            w.f32(&format!("{p}{which}_norm.weight"), vec![HIDDEN], 1.0, 0.1);
        }
        w.fp8(&format!("{p}attn.wq_a"), Q_LORA, HIDDEN);
        w.f32(&format!("{p}attn.q_norm.weight"), vec![Q_LORA], 1.0, 0.1);
        w.fp8(&format!("{p}attn.wq_b"), HEADS * HEAD_DIM, Q_LORA);
        w.fp8(&format!("{p}attn.wkv"), HEAD_DIM, HIDDEN);
        w.f32(&format!("{p}attn.kv_norm.weight"), vec![HEAD_DIM], 1.0, 0.1);
        w.fp8(
            &format!("{p}attn.wo_a"),
            GROUPS * O_LORA,
            HEADS * HEAD_DIM / GROUPS,
        );
        w.fp8(&format!("{p}attn.wo_b"), HIDDEN, GROUPS * O_LORA);
        w.f32(&format!("{p}attn.attn_sink"), vec![HEADS], 0.0, 1.0);
        w.bf16(&format!("{p}ffn.gate.weight"), EXPERTS, HIDDEN);
        for (name, rows, cols) in [
            ("w1", INNER, HIDDEN),
            ("w3", INNER, HIDDEN),
            ("w2", HIDDEN, INNER),
        ] {
            w.fp8(&format!("{p}ffn.shared_experts.{name}"), rows, cols);
            for e in 0..EXPERTS {
                w.fp4(&format!("{p}ffn.experts.{e}.{name}"), rows, cols);
            }
        }
        if layer < 2 {
            let table = (0..VOCAB)
                .flat_map(|t| {
                    let a = (t * 3) % EXPERTS;
                    let b = (a + 1 + t % (EXPERTS - 1)) % EXPERTS;
                    [(a as i64).to_le_bytes(), (b as i64).to_le_bytes()].concat()
                })
                .collect();
            w.tensors.insert(
                format!("{p}ffn.gate.tid2eid"),
                (Dtype::I64, vec![VOCAB, 2], table),
            );
        } else {
            w.f32(&format!("{p}ffn.gate.bias"), vec![EXPERTS], 0.0, 0.1);
        }
        let compressor = |w: &mut Writer, prefix: String, rate: usize, dim: usize, width: usize| {
            w.bf16(&format!("{prefix}.wkv.weight"), width, HIDDEN);
            w.bf16(&format!("{prefix}.wgate.weight"), width, HIDDEN);
            w.f32(&format!("{prefix}.ape"), vec![rate, width], 0.0, 0.5);
            w.f32(&format!("{prefix}.norm.weight"), vec![dim], 1.0, 0.1);
        };
        match *kind {
            "csa" => {
                compressor(
                    &mut w,
                    format!("{p}attn.compressor"),
                    4,
                    HEAD_DIM,
                    2 * HEAD_DIM,
                );
                compressor(
                    &mut w,
                    format!("{p}attn.indexer.compressor"),
                    4,
                    INDEX_DIM,
                    2 * INDEX_DIM,
                );
                w.fp8(
                    &format!("{p}attn.indexer.wq_b"),
                    INDEX_HEADS * INDEX_DIM,
                    Q_LORA,
                );
                w.bf16(
                    &format!("{p}attn.indexer.weights_proj.weight"),
                    INDEX_HEADS,
                    HIDDEN,
                );
            }
            "hca" => compressor(&mut w, format!("{p}attn.compressor"), 8, HEAD_DIM, HEAD_DIM),
            _ => {}
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = w
        .tensors
        .iter()
        .map(|(n, (d, s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size", HIDDEN),
        ("num_attention_heads", HEADS),
        ("head_dim", HEAD_DIM),
        ("qk_rope_head_dim", 32),
        ("q_lora_rank", Q_LORA),
        ("o_groups", GROUPS),
        ("o_lora_rank", O_LORA),
        ("moe_intermediate_size", INNER),
        ("index_n_heads", INDEX_HEADS),
        ("index_head_dim", INDEX_DIM),
        ("n_routed_experts", EXPERTS),
        ("num_hidden_layers", shape.layers.len()),
    ] {
        config[key] = value.into();
    }
    let kinds: Vec<&str> = shape
        .layers
        .iter()
        .map(|k| match *k {
            "csa" => "compressed_sparse_attention",
            "hca" => "heavily_compressed_attention",
            _ => "sliding_attention",
        })
        .collect();
    config["layer_types"] = kinds.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "LICENSE",
    ] {
        std::fs::copy(fixture.join(name), dir.join(name)).unwrap();
    }
}
