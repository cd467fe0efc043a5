//! DeepSeek V4 as `minirun run` runs it: opened through a session (which reads the
//! architecture from config.json), generating transformers' greedy continuation; planned under
//! a budget, its routed experts (and below the deterministic floor, every layer's attention,
//! compressors, router and shared expert) streamed from storage with the resident run's logit
//! bits, on 1 and 2 threads, with read-ahead on and off, reading exactly the plan's bytes.

mod common;

use std::path::Path;

use common::{greedy_bits, on_threads};
use minirun_pack::{PackOptions, pack};
use minirun_runtime::budget::Budget;
use minirun_runtime::generate::Sampling;
use minirun_runtime::model::{Architecture, Decoder};
use minirun_runtime::plan::{Mode, PlanError};
use minirun_runtime::session::{Session, SessionError, Trust};

const STEPS: usize = 12;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4/tiny-fp8-fp4")
}

fn packed() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    pack(&fixture(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

fn oracle_prompt(name: &str) -> (Vec<u32>, Vec<u32>) {
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let entry = oracle["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone();
    let ids = |key: &str| -> Vec<u32> {
        entry[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("token_ids"), ids("greedy_32"))
}

#[test]
fn the_session_generates_transformers_greedy_continuation() {
    let dir = packed();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    assert!(matches!(session.architecture, Architecture::DeepSeekV4(_)));
    let described = &session.header()[1];
    assert!(
        described.starts_with(
            "deepseek_v4: 5 layers (1 sliding-window, 2 compressed sparse, 2 heavily compressed; 2 hash-routed)"
        ),
        "{described}"
    );
    let (prompt, greedy) = oracle_prompt("sentence");
    assert_eq!(
        session
            .prompt_ids("The clockmaker opened the map by the sea.", false)
            .unwrap(),
        prompt,
        "the tokenizer gives the oracle's prompt"
    );
    let model = session.model().unwrap();
    let sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let generation = session
        .generate(&model, &prompt, 32, sampling, &[], |_| {})
        .unwrap();
    assert_eq!(generation.generated_ids, greedy);
}

/// The fixture's layers are too small for streaming them to save memory (16 KiB-aligned
/// buffers for 8 KiB matrices), so at the floor only its routed experts stream.
#[test]
fn streamed_experts_of_the_fixture_have_the_resident_bits() {
    let dir = packed();
    let (prompt, _) = oracle_prompt("ids");
    streams_with_the_resident_bits(dir.path(), &prompt, STEPS, false);
}

/// A wider V4 (hidden 256, 8 heads of 128, q_lora 512, experts of 512, random weights in
/// DeepSeek's storage): at the floor every layer's attention, compressors, indexer, router and
/// shared expert stream too.
#[test]
fn streamed_layers_of_a_wider_v4_have_the_resident_bits() {
    let checkpoint = tempfile::tempdir().unwrap();
    wide::write(checkpoint.path(), &fixture());
    let out = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    // Past a CSA window and an HCA window, in few steps: the test runs unoptimised.
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 512).collect();
    streams_with_the_resident_bits(out.path(), &prompt, 3, true);
}

fn streams_with_the_resident_bits(dir: &Path, prompt: &[u32], steps: usize, layers_stream: bool) {
    let session = Session::open(dir, Trust::Unverified).unwrap();
    let resident = session.model().unwrap();
    let (resident_bits, _) = greedy_bits(&resident, prompt, steps);

    let (floor, experts) = session.plan(Budget::Floor, 128).unwrap();
    assert_eq!(floor.mode, Mode::Streamed);
    assert_eq!(floor.moe_layers, 5);
    let all: Vec<usize> = (0..5).collect();
    assert_eq!(
        floor.streamed_layers,
        if layers_stream { all } else { Vec::new() }
    );
    let (experts_only, _) = session
        .plan(Budget::Bytes(floor.deterministic_floor), 128)
        .unwrap();
    assert!(experts_only.streamed_layers.is_empty());
    for (plan, read_ahead, threads) in [
        (&floor, true, 1),
        (&floor, false, 2),
        (&experts_only, true, 2),
    ] {
        let plan = minirun_runtime::plan::Plan {
            read_ahead,
            ..plan.clone()
        };
        let streamed = session.planned_model(&plan, experts.clone()).unwrap();
        let (bits, decode) = on_threads(threads, || greedy_bits(&streamed, prompt, steps));
        let case = format!(
            "{} layers streamed, read-ahead {read_ahead}, {threads} threads",
            plan.streamed_layers.len()
        );
        assert!(bits == resident_bits, "{case}: other logits than resident");
        assert_eq!(decode.expert_cache_hits, 0, "{case}");
        assert_eq!(
            decode.expert_read_bytes,
            plan.uncached_read_per_token * steps as u64,
            "{case}"
        );
        assert_eq!(
            decode.layer_read_bytes,
            plan.layer_read_per_token * steps as u64,
            "{case}"
        );
        let (_, peak) = streamed.expert_memory().unwrap();
        assert!(peak <= plan.cache_bytes + plan.slot_pool_bytes, "{case}");
    }
    let Err(SessionError::Plan(PlanError::BelowFloor(_))) =
        session.plan(Budget::Bytes(floor.floor - 1), 128)
    else {
        panic!("a budget below the floor was planned");
    };
}

/// A random DeepSeek V4 checkpoint in DeepSeek's storage, wider than the fixture.
mod wide {
    use std::collections::BTreeMap;
    use std::path::Path;

    use safetensors::Dtype;

    type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

    const HIDDEN: usize = 256;
    const HEADS: usize = 8;
    const HEAD_DIM: usize = 128;
    const Q_LORA: usize = 512;
    const GROUPS: usize = 2;
    const O_LORA: usize = 512;
    const EXPERTS: usize = 8;
    const INNER: usize = 512;
    const INDEX_HEADS: usize = 4;
    const INDEX_DIM: usize = 64;
    const HC: usize = 4;
    const VOCAB: usize = 512;

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

    pub fn write(dir: &Path, fixture: &Path) {
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
        let kinds = ["sliding", "csa", "hca", "csa", "hca"];
        for (layer, kind) in kinds.iter().enumerate() {
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
            let compressor =
                |w: &mut Writer, prefix: String, rate: usize, dim: usize, width: usize| {
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
        ] {
            config[key] = value.into();
        }
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
}

/// A hash layer's table naming an expert the layer does not have is refused when the model is
/// built, naming the table.
#[test]
fn a_tid2eid_entry_past_the_experts_is_refused() {
    let checkpoint = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, checkpoint.path().join(path.file_name().unwrap())).unwrap();
    }
    let path = checkpoint.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let name = "layers.1.ffn.gate.tid2eid";
    let t = st.tensor(name).unwrap();
    let mut table = t.data().to_vec();
    table[..8].copy_from_slice(&8i64.to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let data: &[u8] = if n == name { &table } else { v.data() };
            (
                n,
                safetensors::tensor::TensorView::new(v.dtype(), v.shape().to_vec(), data).unwrap(),
            )
        })
        .collect();
    let rewritten = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, rewritten).unwrap();
    let out = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let session = Session::open(out.path(), Trust::Unverified).unwrap();
    let err = session.model().err().unwrap().to_string();
    assert!(err.contains(name) && err.contains("expert 8"), "{err}");
}
