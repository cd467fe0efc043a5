//! The resident artifact store hands out exactly the checkpoint's bytes: a matrix read from a
//! tile container (one tile per expert) multiplies to the same bits as the same matrix read
//! straight from the source safetensors; and an artifact that disagrees with itself is refused.

use std::path::{Path, PathBuf};

use minirun_kernels::{FloatType, Format, QMatrix};
use minirun_pack::{PackOptions, pack};
use minirun_stream::artifact::{Access, Artifact, ArtifactError};
use safetensors::SafeTensors;

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-pack/tests/data/checkpoints")
        .join(name)
}

fn packed(name: &str) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let summary = pack(
        &source(name),
        out.path(),
        &PackOptions {
            source_repo: None,
            source_revision: None,
        },
        &|_| {},
    )
    .unwrap();
    assert!(
        summary.tile_containers > 0,
        "the fixture must exercise tile containers"
    );
    out
}

fn bits(m: &QMatrix, x: &[f32]) -> Vec<u32> {
    let mut y = vec![0f32; m.rows()];
    m.matvec(x, &mut y).unwrap();
    y.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn experts_in_affine_tile_containers_are_the_checkpoints_bytes() {
    let dir = packed("mlx-affine4");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let shard = std::fs::read(source("mlx-affine4").join("model.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&shard).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source("mlx-affine4/config.json")).unwrap())
            .unwrap();
    let group = config["quantization"]["group_size"].as_u64().unwrap() as usize;
    let mut compared = 0;
    for module in ["gate_proj", "up_proj", "down_proj"] {
        let name = format!("model.layers.0.mlp.switch_mlp.{module}");
        let weight = tensors.tensor(&format!("{name}.weight")).unwrap();
        let (experts, rows, words) = (weight.shape()[0], weight.shape()[1], weight.shape()[2]);
        let cols = words * 8;
        let stack = artifact.matrix(&name, rows, cols).unwrap();
        assert_eq!(stack.len(), experts);
        let scales = tensors.tensor(&format!("{name}.scales")).unwrap();
        let biases = tensors.tensor(&format!("{name}.biases")).unwrap();
        let format = Format::Affine {
            bits: 4,
            group,
            scale: FloatType::BF16,
        };
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        for e in 0..experts {
            let piece = |b: &[u8]| b[b.len() / experts * e..b.len() / experts * (e + 1)].to_vec();
            let (p, s, b) = (
                piece(weight.data()),
                piece(scales.data()),
                piece(biases.data()),
            );
            let direct = QMatrix::new(format, rows, cols, &p, &s, &b).unwrap();
            assert_eq!(
                bits(&stack.get(e).unwrap(), &x),
                bits(&direct, &x),
                "{name} expert {e}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 6);
}

#[test]
fn a_shape_other_than_the_configs_is_refused_naming_the_tensor() {
    let dir = packed("mlx-affine4");
    let artifact = Artifact::open(dir.path(), Access::Unverified).unwrap();
    let err = artifact
        .matrix("model.layers.0.mlp.switch_mlp.gate_proj", 3, 64)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("model.layers.0.mlp.switch_mlp.gate_proj.weight"),
        "{err}"
    );
    assert!(matches!(
        artifact.matrix("model.layers.9.nothing", 1, 8),
        Err(ArtifactError::Missing(_))
    ));
}

#[test]
fn a_container_that_disagrees_with_its_manifest_or_is_cut_short_is_refused() {
    let dir = packed("mlx-affine4");
    let container = std::fs::read_dir(dir.path().join("layer00"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "affinetile"))
        .unwrap();
    let bytes = std::fs::read(&container).unwrap();
    std::fs::write(&container, &bytes[..bytes.len() - 1]).unwrap();
    let err = Artifact::open(dir.path(), Access::Unverified)
        .err()
        .expect("a short container is refused");
    assert!(err.to_string().contains("its manifest says"), "{err}");

    std::fs::write(&container, &bytes).unwrap();
    let manifest = dir.path().join("layer00/manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let file = v["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["kind"] == "tile-container")
        .unwrap();
    file["rows"] = serde_json::json!(file["rows"].as_u64().unwrap() * 2);
    std::fs::write(&manifest, v.to_string()).unwrap();
    let err = Artifact::open(dir.path(), Access::Unverified)
        .err()
        .expect("a manifest that disagrees is refused");
    assert!(err.to_string().contains("its header holds"), "{err}");
}

#[test]
fn an_interrupted_pack_or_a_directory_without_an_index_is_not_run() {
    let dir = packed("mlx-affine4");
    std::fs::write(dir.path().join(".minirun-pack-incomplete"), b"").unwrap();
    let err = Artifact::open(dir.path(), Access::Unverified)
        .err()
        .unwrap();
    assert!(err.to_string().contains("interrupted"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = Artifact::open(empty.path(), Access::Unverified)
        .err()
        .unwrap();
    assert!(err.to_string().contains("no index.json"), "{err}");
}

/// A manifest whose member claims fewer bytes than its shape needs is refused when the model
/// asks for it, naming the tensor, instead of reading past the member.
#[test]
fn a_float_member_shorter_than_its_shape_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v3/hf-bf16");
    pack(
        &src,
        out.path(),
        &PackOptions {
            source_repo: None,
            source_revision: None,
        },
        &|_| {},
    )
    .unwrap();
    let manifest = out.path().join("layer00/manifest.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let blob = v["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["kind"] == "blob")
        .unwrap();
    let member = blob["members"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| m["source_tensor"] == "model.layers.0.input_layernorm.weight")
        .unwrap();
    member["bytes"] = serde_json::json!(member["bytes"].as_u64().unwrap() / 2);
    std::fs::write(&manifest, v.to_string()).unwrap();
    let artifact = Artifact::open(out.path(), Access::Unverified).unwrap();
    let err = artifact
        .vector("model.layers.0.input_layernorm.weight", 128)
        .unwrap_err();
    assert!(
        err.to_string().contains("input_layernorm") && err.to_string().contains("bytes"),
        "{err}"
    );
}

/// Blob sizes are the manifests' word until a blob is opened: manifests that list more payload
/// than any artifact holds are refused at open, before a plan adds the sizes up.
#[test]
fn manifests_listing_an_impossible_payload_are_refused_at_open() {
    let out = packed("mlx-affine4");
    let manifest = out.path().join("layer00/manifest.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let blob = v["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["kind"] == "blob")
        .unwrap();
    blob["bytes"] = serde_json::json!(u64::MAX - 1);
    std::fs::write(&manifest, v.to_string()).unwrap();
    let err = Artifact::open(out.path(), Access::Unverified)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("more than") && err.contains("bytes of payload"),
        "{err}"
    );
}
