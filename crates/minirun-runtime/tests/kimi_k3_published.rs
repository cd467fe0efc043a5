//! Kimi K3 in the published artifact layout: a K3 checkpoint under the upstream names written by
//! `minirun_pack::k3_published` into row-banded deterministic blobs and banded, slot-ordered v1
//! expert containers, then opened by the runtime from that layout. Every logit has the bits of
//! the same checkpoint packed in minirun's own layout, resident and streamed.
//!
//! MXFP4 container tiles are never padded, so a band must fill whole 16 KiB pages: the tiny
//! `hf-k3mix`'s experts (64 wide) cannot be banded. The checkpoint here is `hf-k3mix` with its
//! mixture of experts widened (4 experts of 1,024 x 1,024, random weights), made by the test.

mod common;

use std::path::Path;

use common::{greedy_bits, on_threads};
use minirun_format::artifact::k3_published::{K3Experts, K3LayerManifest};
use minirun_format::tile::RawHeader;
use minirun_pack::k3_published::{BandSizes, pack_k3_published};
use minirun_pack::{PackOptions, pack};
use minirun_runtime::budget::Budget;
use minirun_runtime::plan::Mode;
use minirun_runtime::session::{Session, Trust};

/// Small bands, so that tensors and experts both span several (an MXFP4 band's packed and scale
/// bytes must each fill whole 16 KiB pages: 512 rows of 1,024 is the least).
const BANDS: BandSizes = BandSizes {
    band_bytes: 16384,
    expert_band_rows: (512, 512),
};

const EXPERTS: usize = 4;
const STEPS: usize = 3;
const WIDTH: usize = 1024;

fn tiny() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/hf-k3mix")
}

fn prompt() -> Vec<u32> {
    vec![0, 17, 42, 99, 7, 300, 5, 9, 11, 250, 33, 128]
}

/// SplitMix64 bytes.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// BF16 values in [-scale, scale).
    fn bf16(&mut self, n: usize, scale: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
                let bits = ((unit * 2.0 - 1.0) * scale).to_bits();
                ((bits >> 16) as u16).to_le_bytes()
            })
            .collect()
    }

    fn bytes(&mut self, n: usize, pick: impl Fn(u64) -> u8) -> Vec<u8> {
        (0..n).map(|_| pick(self.next())).collect()
    }
}

/// `hf-k3mix` with a wider mixture of experts, written to `dir`.
fn widened(dir: &Path) {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes = std::fs::read(tiny().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: std::collections::BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| !name.contains(".block_sparse_moe."))
        .map(|(name, t)| (name, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect();
    let mut random = Random(7);
    let hidden = 128;
    for layer in 1..6 {
        let p = format!("language_model.model.layers.{layer}.block_sparse_moe");
        let mut bf16 = |name: &str, shape: Vec<usize>, scale: f32| {
            let n = shape.iter().product();
            let data = random.bf16(n, scale);
            tensors.insert(format!("{p}.{name}"), (Dtype::BF16, shape, data));
        };
        bf16("gate.weight", vec![EXPERTS, hidden], 0.2);
        bf16("routed_expert_down_proj.weight", vec![WIDTH, hidden], 0.1);
        bf16("routed_expert_up_proj.weight", vec![hidden, WIDTH], 0.05);
        bf16(
            "shared_experts.gate_proj.weight",
            vec![2 * WIDTH, hidden],
            0.1,
        );
        bf16(
            "shared_experts.up_proj.weight",
            vec![2 * WIDTH, hidden],
            0.1,
        );
        bf16(
            "shared_experts.down_proj.weight",
            vec![hidden, 2 * WIDTH],
            0.05,
        );
        let norm: Vec<u8> = (0..WIDTH).flat_map(|_| 0x3F80u16.to_le_bytes()).collect();
        tensors.insert(
            format!("{p}.routed_expert_norm.weight"),
            (Dtype::BF16, vec![WIDTH], norm),
        );
        let bias: Vec<u8> = (0..EXPERTS)
            .flat_map(|e| (0.01 * e as f32).to_le_bytes())
            .collect();
        tensors.insert(
            format!("{p}.gate.e_score_correction_bias"),
            (Dtype::F32, vec![EXPERTS], bias),
        );
        for e in 0..EXPERTS {
            for w in ["w1", "w3", "w2"] {
                let packed = random.bytes(WIDTH * WIDTH / 2, |r| r as u8);
                let scales = random.bytes(WIDTH * WIDTH / 32, |r| 119 + (r % 4) as u8);
                tensors.insert(
                    format!("{p}.experts.{e}.{w}.weight"),
                    (Dtype::U32, vec![WIDTH, WIDTH / 8], packed),
                );
                tensors.insert(
                    format!("{p}.experts.{e}.{w}.scales"),
                    (Dtype::U8, vec![WIDTH, WIDTH / 32], scales),
                );
            }
        }
    }
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(name, (dtype, shape, data))| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tiny().join("config.json")).unwrap()).unwrap();
    let text = &mut config["text_config"];
    text["num_experts"] = EXPERTS.into();
    text["num_experts_per_token"] = 2.into();
    text["moe_intermediate_size"] = WIDTH.into();
    text["routed_expert_hidden_size"] = WIDTH.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny().join(name), dir.join(name)).unwrap();
    }
}

fn source() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    widened(dir.path());
    dir
}

#[test]
fn the_written_layout_reads_back_by_its_own_rules() {
    let checkpoint = source();
    let out = tempfile::tempdir().unwrap();
    pack_k3_published(checkpoint.path(), out.path(), BANDS).unwrap();
    let manifest = std::fs::read(out.path().join("layer01/manifest.json")).unwrap();
    let m = K3LayerManifest::parse(&manifest, "layer01/manifest.json", 1).unwrap();
    let tensors = m.tensors("layer01/manifest.json").unwrap();
    let q = &tensors["language_model.model.layers.1.self_attn.q_proj.weight"];
    assert_eq!((q.rows, q.cols, q.bands.len()), (256, 128, 4));
    let header = |p: &str| {
        let bytes = std::fs::read(out.path().join("layer01").join(p)).unwrap();
        RawHeader::read(&bytes[..16384])
    };
    let (w1, w3, w2) = (
        header("layer01-w1.mxfp4tile"),
        header("layer01-w3.mxfp4tile"),
        header("layer01-w2.mxfp4tile"),
    );
    assert_eq!(w1.version, 1);
    let e = K3Experts::from_headers(1, &w1, &w3, &w2).unwrap();
    assert_eq!((e.experts, e.gate_up_bands, e.down_bands), (4, 2, 2));
    assert!(!out.path().join(".minirun-pack-incomplete").exists());
}

#[test]
fn the_published_layout_runs_with_the_bits_of_minirun_s_own() {
    let checkpoint = source();
    let own = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        own.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let published = tempfile::tempdir().unwrap();
    pack_k3_published(checkpoint.path(), published.path(), BANDS).unwrap();
    let prompt = prompt();

    let own = Session::open(own.path(), Trust::Unverified).unwrap();
    let (want, _) = greedy_bits(&own.model().unwrap(), &prompt, STEPS);
    let session = Session::open(published.path(), Trust::Unverified).unwrap();
    let (got, _) = greedy_bits(&session.model().unwrap(), &prompt, STEPS);
    assert!(
        got == want,
        "resident: other logits than minirun's own layout"
    );

    // At the floor every layer's bands stream too, and every chosen expert's tiles.
    let (plan, experts) = session.plan(Budget::Floor, 64).unwrap();
    assert_eq!(plan.mode, Mode::Streamed);
    assert_eq!(plan.streamed_layers.len(), 6);
    for threads in [1, 2] {
        let model = session.planned_model(&plan, experts.clone()).unwrap();
        let (bits, decode) = on_threads(threads, || greedy_bits(&model, &prompt, STEPS));
        assert!(bits == want, "{threads} threads: other logits");
        let steps = STEPS as u64;
        assert_eq!(decode.layer_read_bytes, plan.layer_read_per_token * steps);
        assert_eq!(decode.expert_cache_hits, 0);
        assert_eq!(
            decode.expert_read_bytes,
            plan.uncached_read_per_token * steps
        );
    }
}

/// The band table says where each band is: bands stored out of row order read the same tensor.
#[test]
fn bands_stored_out_of_row_order_read_the_same_tensor() {
    use minirun_runtime::artifact::{Access, Artifact};
    let checkpoint = source();
    let out = tempfile::tempdir().unwrap();
    pack_k3_published(checkpoint.path(), out.path(), BANDS).unwrap();
    let name = "language_model.model.layers.0.self_attn.q_proj.weight";
    let read = |dir: &Path| {
        let artifact = Artifact::open(dir, Access::Unverified).unwrap();
        artifact.vector(name, 256 * 128).unwrap()
    };
    let want = read(out.path());

    let manifest_path = out.path().join("layer00/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let units = manifest["nonexpert"]["units"].as_array_mut().unwrap();
    let bands: Vec<usize> = (0..units.len())
        .filter(|&i| units[i]["tensor"] == name)
        .collect();
    let (a, b) = (bands[0], bands[bands.len() - 1]);
    let offset = |i: usize| units[i]["offset"].as_u64().unwrap() as usize;
    let (oa, ob, len) = (
        offset(a),
        offset(b),
        units[a]["length"].as_u64().unwrap() as usize,
    );
    let blob_path = out.path().join("layer00/layer00-deterministic.bin");
    let mut blob = std::fs::read(&blob_path).unwrap();
    let first: Vec<u8> = blob[oa..oa + len].to_vec();
    blob.copy_within(ob..ob + len, oa);
    blob[ob..ob + len].copy_from_slice(&first);
    std::fs::write(&blob_path, blob).unwrap();
    units[a]["offset"] = ob.into();
    units[b]["offset"] = oa.into();
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    assert_eq!(
        read(out.path())
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
