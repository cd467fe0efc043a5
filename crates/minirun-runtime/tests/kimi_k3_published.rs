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
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::plan::Mode;

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

type Tensors = std::collections::BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

fn read_tensors(dir: &Path, keep: impl Fn(&str) -> bool) -> Tensors {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, t)| (name, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

/// The wider mixture of experts of layers 1 to 5, under the upstream names.
fn wide_moe() -> Tensors {
    use safetensors::Dtype;
    let mut tensors = Tensors::new();
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
    tensors
}

/// [`wide_moe`] under mlx-lm's names: `mlp.*`, the correction bias beside the router, and the
/// experts stacked as `switch_mlp`.
fn mlx_names(moe: Tensors) -> Tensors {
    let mut out = Tensors::new();
    // Per stacked name: (expert, shape, bytes) of each expert.
    type Experts = Vec<(usize, Vec<usize>, Vec<u8>)>;
    let mut stacks: std::collections::BTreeMap<String, Experts> = Default::default();
    for (name, (dtype, shape, data)) in moe {
        let name = name.replace(".block_sparse_moe.", ".mlp.");
        let name = name.replace(".gate.e_score_correction_bias", ".e_score_correction_bias");
        let Some((layer, rest)) = name.split_once(".mlp.experts.") else {
            out.insert(name, (dtype, shape, data));
            continue;
        };
        let (e, rest) = rest.split_once('.').unwrap();
        let (w, suffix) = rest.split_once('.').unwrap();
        let mlx = match w {
            "w1" => "gate_proj",
            "w3" => "up_proj",
            _ => "down_proj",
        };
        let key = format!("{layer}.mlp.switch_mlp.{mlx}.{suffix}");
        stacks
            .entry(key)
            .or_default()
            .push((e.parse().unwrap(), shape, data));
    }
    for (key, mut experts) in stacks {
        experts.sort_by_key(|(e, _, _)| *e);
        let dtype = match key.ends_with(".weight") {
            true => safetensors::Dtype::U32,
            false => safetensors::Dtype::U8,
        };
        let mut shape = vec![experts.len()];
        shape.extend(&experts[0].1);
        let data = experts.into_iter().flat_map(|(_, _, d)| d).collect();
        out.insert(key, (dtype, shape, data));
    }
    out
}

/// The naming of the checkpoint [`widened`] writes.
#[derive(Clone, Copy)]
enum Names {
    /// `hf-k3mix`'s: the upstream names.
    Upstream,
    /// `mlx-k3mix`'s: mlx-lm's, from which `tools/make_k3_hf_fixture.py` made `hf-k3mix`.
    Mlx,
}

/// `hf-k3mix` (or `mlx-k3mix`) with a wider mixture of experts, written to `dir`.
fn widened(dir: &Path, names: Names) {
    use safetensors::tensor::TensorView;
    let base = match names {
        Names::Upstream => tiny(),
        Names::Mlx => tiny().with_file_name("mlx-k3mix"),
    };
    let moe_layer = |name: &str| (1..6).any(|l| name.contains(&format!(".layers.{l}.mlp.")));
    let mut tensors = match names {
        Names::Upstream => read_tensors(&base, |n| !n.contains(".block_sparse_moe.")),
        Names::Mlx => read_tensors(&base, |n| !moe_layer(n)),
    };
    tensors.extend(match names {
        Names::Upstream => wide_moe(),
        Names::Mlx => mlx_names(wide_moe()),
    });
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
        serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
    let text = &mut config["text_config"];
    text["num_experts"] = EXPERTS.into();
    text["num_experts_per_token"] = 2.into();
    text["moe_intermediate_size"] = WIDTH.into();
    text["routed_expert_hidden_size"] = WIDTH.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(base.join(name), dir.join(name)).unwrap();
    }
}

fn source() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    widened(dir.path(), Names::Upstream);
    dir
}

#[test]
fn the_written_layout_reads_back_by_its_own_rules() {
    let checkpoint = source();
    let out = tempfile::tempdir().unwrap();
    pack_k3_published(
        checkpoint.path(),
        out.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
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
    pack_k3_published(
        checkpoint.path(),
        published.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
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
        let model = session.planned_model(&plan, &experts).unwrap();
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

/// What holds for a checkpoint under mlx-lm's names. The published layout it packs to is the
/// upstream names' byte for byte (`mlx_lm_s_names_write_the_same_published_files_as_the_upstream_names`),
/// so it runs with the bits above. Packed in minirun's own layout instead, it keeps mlx-lm's
/// tensors, and its MLA layers' `kv_b_proj` is mlx-lm's split pair (`embed_q`, `unembed_out`),
/// whose products are summed in another order: not the same bits, but within 1e-5 at every
/// position and the same greedy tokens.
#[test]
fn mlx_lm_s_names_in_minirun_s_own_layout_agree_closely_with_the_published_layout() {
    let checkpoint = tempfile::tempdir().unwrap();
    widened(checkpoint.path(), Names::Mlx);
    let own = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        own.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let published = tempfile::tempdir().unwrap();
    let opts = PackOptions::default();
    pack_k3_published(checkpoint.path(), published.path(), BANDS, &opts, &|_| {}).unwrap();
    let prompt = prompt();
    let run = |dir: &Path| {
        let session = Session::open(dir, Trust::Unverified).unwrap();
        greedy_bits(&session.model().unwrap(), &prompt, STEPS).0
    };
    let (own, published) = (run(own.path()), run(published.path()));
    assert_eq!(own.len(), published.len());
    let value = |bits: &u32| f32::from_bits(*bits);
    let worst = own
        .iter()
        .zip(&published)
        .map(|(a, b)| (value(a) - value(b)).abs())
        .fold(0f32, f32::max);
    eprintln!("largest logit difference, own layout under mlx-lm's names vs published: {worst:e}");
    assert!(worst <= 1e-5, "largest logit difference {worst}");
    let vocab = own.len() / (STEPS + 1);
    let top = |logits: &[u32]| {
        let floats: Vec<f32> = logits.iter().map(value).collect();
        minirun_runtime::argmax(&floats)
    };
    for (a, b) in own.chunks(vocab).zip(published.chunks(vocab)) {
        assert_eq!(top(a), top(b), "another greedy token");
    }
}

/// The band table says where each band is: bands stored out of row order read the same tensor.
#[test]
fn bands_stored_out_of_row_order_read_the_same_tensor() {
    use minirun_runtime::registry::open_artifact;
    use minirun_stream::artifact::{Access, Artifact};
    let checkpoint = source();
    let out = tempfile::tempdir().unwrap();
    pack_k3_published(
        checkpoint.path(),
        out.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let name = "language_model.model.layers.0.self_attn.q_proj.weight";
    let read = |dir: &Path| {
        let artifact = open_artifact(dir, Access::Unverified).unwrap();
        artifact.vector(name, 256 * 128).unwrap()
    };
    let want = read(out.path());
    // Only the architecture reads its published layout: a plain open says where to go.
    let refused = Artifact::open(out.path(), Access::Unverified)
        .err()
        .unwrap();
    assert!(
        refused.to_string().contains("published Kimi K3 layout")
            && refused.to_string().contains("registry::open_artifact"),
        "{refused}"
    );

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

/// Every file under `dir`, by relative path.
fn files_of(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// mlx-lm's fused and renamed tensors are mapped back exactly: the checkpoint under mlx-lm's
/// names (`mlx-k3mix`, widened) writes the same bytes, file for file, as the one under the
/// upstream names (`hf-k3mix`, which `tools/make_k3_hf_fixture.py` made from it and mlx-lm
/// loads back to the same logits).
#[test]
fn mlx_lm_s_names_write_the_same_published_files_as_the_upstream_names() {
    let write = |names| {
        let checkpoint = tempfile::tempdir().unwrap();
        widened(checkpoint.path(), names);
        let out = tempfile::tempdir().unwrap();
        let opts = PackOptions::default();
        let summary =
            pack_k3_published(checkpoint.path(), out.path(), BANDS, &opts, &|_| {}).unwrap();
        (files_of(out.path()), summary.naming)
    };
    let (upstream, naming) = write(Names::Upstream);
    assert_eq!(naming, "upstream");
    let (mlx, naming) = write(Names::Mlx);
    assert_eq!(naming, "mlx");
    assert_eq!(
        upstream.keys().collect::<Vec<_>>(),
        mlx.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &upstream {
        assert!(bytes == &mlx[path], "{path} differs");
    }
    assert!(upstream.contains_key("layer03/layer03-w2.mxfp4tile"));
}

/// A tensor no rule takes is refused by name before anything is written.
#[test]
fn a_tensor_the_layout_cannot_hold_is_refused_by_name() {
    use safetensors::tensor::TensorView;
    let checkpoint = source();
    let mut tensors = read_tensors(checkpoint.path(), |_| true);
    tensors.insert(
        "mtp.0.eh_proj.weight".into(),
        (safetensors::Dtype::BF16, vec![2], vec![0; 4]),
    );
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &checkpoint.path().join("model.safetensors"))
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = pack_k3_published(
        checkpoint.path(),
        out.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("mtp.0.eh_proj.weight") && err.contains("no rule"),
        "{err}"
    );
    assert!(files_of(out.path()).is_empty(), "nothing written");
}

const UPSTREAM: &str = "moonshotai/Kimi-K3";
const UPSTREAM_PIN: &str = "9f62e4e9fffbd0a83ddd60e1c209d828994b3569";

/// The file as a publisher's tree lists it (an LFS SHA-256, computed by `sha2`, not by the
/// verifier's own hasher).
fn repo_file(dir: &Path, path: &str) -> minirun_format::tree::RepoFile {
    use sha2::Digest as _;
    let bytes = std::fs::read(dir.join(path)).unwrap();
    minirun_format::tree::RepoFile {
        path: path.to_string(),
        size: bytes.len() as u64,
        digest: minirun_format::tree::FileDigest::Sha256(sha2::Sha256::digest(&bytes).into()),
    }
}

/// As published: no config.json in the publication, whose index.json names the upstream
/// repository and revision. Verification takes config.json from that upstream's tree, and the
/// verified run gives the bits of the unverified one.
#[test]
fn a_publication_without_config_runs_verified_with_the_upstream_s_config() {
    use minirun_store::{Authority, Origin, SealKey, Selection, SourcedFile};
    let checkpoint = source();
    let out = tempfile::tempdir().unwrap();
    let opts = PackOptions {
        source_repo: Some(UPSTREAM.into()),
        source_revision: Some(UPSTREAM_PIN.into()),
    };
    pack_k3_published(checkpoint.path(), out.path(), BANDS, &opts, &|_| {}).unwrap();
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("index.json")).unwrap()).unwrap();
    assert_eq!(
        (&index["source_repo"], &index["source_revision"]),
        (&UPSTREAM.into(), &UPSTREAM_PIN.into())
    );
    let layer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("layer02/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(layer["source_repo"], UPSTREAM);
    let session = Session::open(out.path(), Trust::Unverified).unwrap();
    let (want, _) = greedy_bits(&session.model().unwrap(), &prompt(), STEPS);
    drop(session);

    let config = std::fs::read(out.path().join("config.json")).unwrap();
    std::fs::remove_file(out.path().join("config.json")).unwrap();
    let publication = minirun_format::tree::Tree {
        repo: "team/Kimi-K3-minirun".into(),
        revision: "1".repeat(40),
        files: files_of(out.path())
            .keys()
            .map(|p| (p.clone(), repo_file(out.path(), p)))
            .collect(),
    };
    let key = SealKey::load_or_create(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("k3-published-tests.key"),
    )
    .unwrap();
    std::fs::write(out.path().join("config.json"), &config).unwrap();
    let sourced = SourcedFile {
        file: repo_file(out.path(), "config.json"),
        origin: Origin {
            repo: UPSTREAM.into(),
            revision: UPSTREAM_PIN.into(),
        },
    };
    minirun_store::verify_sourced(
        out.path(),
        &publication,
        &[sourced],
        Authority::Publication,
        Selection::Full,
        minirun_store::Sealing {
            key: &key,
            progress: &|_| {},
            stop: &std::sync::atomic::AtomicBool::new(false),
        },
    )
    .unwrap();
    let session = Session::open(out.path(), Trust::Verified(key.clone())).unwrap();
    let header = session.header().join("\n");
    assert!(
        header.contains(&format!("config.json against {UPSTREAM}@{UPSTREAM_PIN}")),
        "{header}"
    );
    let (got, _) = greedy_bits(&session.model().unwrap(), &prompt(), STEPS);
    assert!(got == want, "verified: other logits");

    // Without that evidence, a config.json placed beside the publication is not read.
    minirun_store::verify(
        out.path(),
        &publication,
        &key,
        &|_| {},
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap_err();
    std::fs::remove_file(out.path().join("config.json")).unwrap();
    minirun_store::verify(
        out.path(),
        &publication,
        &key,
        &|_| {},
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap();
    std::fs::write(out.path().join("config.json"), &config).unwrap();
    let err = Session::open(out.path(), Trust::Verified(key.clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::remove_file(out.path().join("config.json")).unwrap();
    let err = Session::open(out.path(), Trust::Verified(key))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("has no config.json") && err.contains("minirun verify"),
        "{err}"
    );
}

/// The upstream checkpoint's own expert storage (compressed-tensors `mxfp4-pack-quantized`:
/// U8 `weight_packed`, `weight_scale`, `weight_shape`) writes the same published files as the
/// same bytes under MLX's per-expert `weight` / `scales`; a `weight_shape` the codes contradict
/// is refused by name.
#[test]
fn compressed_tensors_experts_write_the_same_published_files() {
    use safetensors::tensor::TensorView;
    let write = |dir: &Path| {
        let out = tempfile::tempdir().unwrap();
        pack_k3_published(dir, out.path(), BANDS, &PackOptions::default(), &|_| {}).unwrap();
        files_of(out.path())
    };
    let mlx_style = source();
    let want = write(mlx_style.path());
    let rewrite = |shape_rows: i64| {
        let dir = tempfile::tempdir().unwrap();
        for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(mlx_style.path().join(name), dir.path().join(name)).unwrap();
        }
        let mut tensors = Tensors::new();
        for (name, (dtype, shape, data)) in read_tensors(mlx_style.path(), |_| true) {
            match name.strip_suffix(".weight") {
                Some(module) if name.contains(".experts.") => {
                    let (rows, words) = (shape[0], shape[1]);
                    tensors.insert(
                        format!("{module}.weight_packed"),
                        (safetensors::Dtype::U8, vec![rows, words * 4], data),
                    );
                    let dims: Vec<u8> = [shape_rows, (words * 8) as i64]
                        .iter()
                        .flat_map(|d| d.to_le_bytes())
                        .collect();
                    tensors.insert(
                        format!("{module}.weight_shape"),
                        (safetensors::Dtype::I64, vec![2], dims),
                    );
                }
                _ => match name.strip_suffix(".scales") {
                    Some(module) => {
                        tensors.insert(format!("{module}.weight_scale"), (dtype, shape, data));
                    }
                    None => {
                        tensors.insert(name, (dtype, shape, data));
                    }
                },
            }
        }
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
        dir
    };
    let upstream = rewrite(WIDTH as i64);
    assert!(
        write(upstream.path()) == want,
        "other bytes than MLX-style experts"
    );
    let lying = rewrite(WIDTH as i64 + 1);
    let out = tempfile::tempdir().unwrap();
    let err = pack_k3_published(
        lying.path(),
        out.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("weight_shape"), "{err}");
}
