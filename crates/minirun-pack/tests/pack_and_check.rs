//! Pack every fixture checkpoint (built by tools/make_pack_fixtures.py with mlx-lm, numpy and
//! ml_dtypes), check it byte for byte, and make sure every damage and every lie is caught.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use minirun_format::artifact::{FileEntry, INCOMPLETE_MARKER, QuantRole, UnitManifest};
use minirun_format::index::{ArtifactIndex, IndexShape};
use minirun_format::tile::{HEADER_BYTES, TileContainer};
use minirun_pack::{CheckError, PackError, PackOptions, PackSummary, check, pack};
use safetensors::tensor::{Dtype, TensorView};

const REPO: &str = "minirun-tests/fixture";
const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/checkpoints")
        .join(name)
}

fn opts() -> PackOptions {
    PackOptions {
        source_repo: Some(REPO.into()),
        source_revision: Some(REVISION.into()),
    }
}

fn pack_into(source: &Path, out: &Path) -> PackSummary {
    pack(source, out, &opts(), &|_| {}).unwrap_or_else(|e| panic!("{}: {e}", source.display()))
}

fn manifest(artifact: &Path, unit: &str) -> UnitManifest {
    serde_json::from_slice(&fs::read(artifact.join(unit).join("manifest.json")).unwrap()).unwrap()
}

fn containers(artifact: &Path, unit: &str) -> Vec<String> {
    manifest(artifact, unit)
        .files
        .iter()
        .filter(|f| matches!(f, FileEntry::TileContainer { .. }))
        .map(|f| f.name().to_string())
        .collect()
}

/// Every fixture packs, checks clean, carries identities and has the expected containers.
#[test]
fn every_fixture_packs_and_checks_byte_for_byte() {
    let cases: [(&str, &[&str]); 5] = [
        (
            "mlx-affine4",
            &[
                "model.layers.0.mlp.switch_mlp.gate_proj.affinetile",
                "model.layers.0.self_attn.q_proj.affinetile",
            ],
        ),
        (
            "mlx-affine8",
            &["model.layers.0.mlp.switch_mlp.down_proj.affinetile"],
        ),
        (
            "mlx-mxfp4",
            &["model.layers.0.mlp.switch_mlp.up_proj.mxfp4tile"],
        ),
        (
            "gptoss-mxfp4",
            &[
                "model.layers.0.mlp.experts.gate_up_proj.mxfp4tile",
                "model.layers.0.mlp.experts.down_proj.mxfp4tile",
            ],
        ),
        ("deepseek-fp8", &[]),
    ];
    for (name, expected) in cases {
        let out = tempfile::tempdir().unwrap();
        let summary = pack_into(&fixture(name), out.path());
        let report =
            check(out.path(), &fixture(name), &|_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.files, summary.payload_files, "{name}");
        let found = containers(out.path(), "layer00");
        for want in expected {
            assert!(
                found.iter().any(|f| f == want),
                "{name}: no {want} in {found:?}"
            );
        }
        let index = ArtifactIndex::parse(&fs::read(out.path().join("index.json")).unwrap());
        assert_eq!(index.shape, IndexShape::SingleSourceUnits, "{name}");
        assert_eq!(
            (index.files, index.bytes),
            (
                Some(summary.payload_files as u64),
                Some(summary.payload_bytes)
            ),
            "{name}"
        );
        assert!(
            matches!(index.tokenizer, Some(Ok(_))),
            "{name}: {:?}",
            index.tokenizer
        );
        assert!(
            matches!(index.configuration, Some(Ok(_))),
            "{name}: {:?}",
            index.configuration
        );
        for copied in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "LICENSE",
        ] {
            assert_eq!(
                fs::read(out.path().join(copied)).unwrap(),
                fs::read(fixture(name).join(copied)).unwrap(),
                "{name}/{copied}"
            );
        }
        assert!(!out.path().join(INCOMPLETE_MARKER).exists());
    }
}

#[test]
fn unalignable_quantized_matrices_stay_plain_streams_with_the_reason() {
    let out = tempfile::tempdir().unwrap();
    let summary = pack_into(&fixture("mlx-affine4"), out.path());
    assert!(summary.quantized_as_plain > 0);
    let m = manifest(out.path(), "layer00");
    let blob = m.files.iter().find_map(|f| match f {
        FileEntry::Blob { members, .. } => Some(members),
        _ => None,
    });
    let k_proj = blob
        .unwrap()
        .iter()
        .find(|m| m.source.source_tensor == "model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(
        k_proj.quantization.as_ref().unwrap().role,
        QuantRole::Packed
    );
    assert!(
        k_proj.not_tiled.as_ref().unwrap().contains("16384"),
        "{:?}",
        k_proj.not_tiled
    );
}

#[test]
fn packing_is_deterministic() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    pack_into(&fixture("gptoss-mxfp4"), a.path());
    pack_into(&fixture("gptoss-mxfp4"), b.path());
    let tree = |root: &Path| -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        for unit in fs::read_dir(root).unwrap() {
            let path = unit.unwrap().path();
            let entries: Vec<PathBuf> = if path.is_dir() {
                fs::read_dir(&path)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect()
            } else {
                vec![path]
            };
            for p in entries {
                files.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
        files
    };
    assert_eq!(tree(a.path()), tree(b.path()));
}

/// One flipped byte anywhere in the payload is found and named.
#[test]
fn check_names_the_file_tile_region_and_tensor_of_a_flipped_byte() {
    let out = tempfile::tempdir().unwrap();
    pack_into(&fixture("mlx-mxfp4"), out.path());
    let name = "model.layers.0.mlp.switch_mlp.gate_proj.mxfp4tile";
    let path = out.path().join("layer00").join(name);
    let header = fs::read(&path).unwrap();
    let c = TileContainer::parse(&header[..HEADER_BYTES as usize], header.len() as u64).unwrap();
    let flip = |at: u64| {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    };
    let cases = [
        (
            c.scale_range(1).unwrap().start + 5,
            "scales",
            "model.layers.0.mlp.switch_mlp.gate_proj.scales",
            Some(1),
        ),
        (
            c.packed_range(0).unwrap().start + 77,
            "packed",
            "model.layers.0.mlp.switch_mlp.gate_proj.weight",
            Some(0),
        ),
    ];
    for (at, region, tensor, tile) in cases {
        flip(at);
        match check(out.path(), &fixture("mlx-mxfp4"), &|_| {}) {
            Err(CheckError::Differs(d)) => {
                assert_eq!(
                    (
                        d.file.as_str(),
                        d.region.as_str(),
                        d.source_tensor.as_str(),
                        d.tile,
                        d.file_offset
                    ),
                    (name, region, tensor, tile, at)
                );
            }
            other => panic!("expected a difference, got {other:?}"),
        }
        flip(at);
    }
    // A plain stream member.
    let blob = out.path().join("layer00/layer00-plain.blob");
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&blob)
        .unwrap();
    f.write_all_at(&[0x5A], 3).unwrap();
    let err = check(out.path(), &fixture("mlx-mxfp4"), &|_| {}).unwrap_err();
    assert!(
        matches!(&err, CheckError::Differs(d) if d.region == "member"),
        "{err}"
    );
    assert!(
        err.to_string().contains("layer00/layer00-plain.blob"),
        "{err}"
    );
}

#[test]
fn a_config_the_tensors_contradict_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let err = pack(&fixture("lying-config"), out.path(), &opts(), &|_| {}).unwrap_err();
    assert!(
        matches!(&err, PackError::Refused { reason, .. } if reason.contains("contradict")),
        "{err}"
    );
    assert!(err.to_string().contains("8-bit"), "{err}");
}

#[test]
fn a_shard_with_a_bad_header_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let err = pack(&fixture("bad-header"), out.path(), &opts(), &|_| {}).unwrap_err();
    assert!(matches!(&err, PackError::BadShard { .. }), "{err}");
    assert!(err.to_string().contains("header length"), "{err}");
}

#[test]
fn provenance_must_be_canonical_and_complete() {
    let out = tempfile::tempdir().unwrap();
    let bad = [
        PackOptions {
            source_repo: Some("not a repo".into()),
            source_revision: Some(REVISION.into()),
        },
        PackOptions {
            source_repo: Some(REPO.into()),
            source_revision: Some("main".into()),
        },
        PackOptions {
            source_repo: Some(REPO.into()),
            source_revision: None,
        },
    ];
    for o in bad {
        assert!(matches!(
            pack(&fixture("mlx-affine4"), out.path(), &o, &|_| {}),
            Err(PackError::Refused { .. })
        ));
    }
    // Without provenance the artifact packs, but its index names no upstream and no identities.
    let summary = pack(
        &fixture("mlx-affine4"),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    assert!(!summary.warnings.is_empty());
    let index = ArtifactIndex::parse(&fs::read(out.path().join("index.json")).unwrap());
    assert_eq!(index.shape, IndexShape::Unrecognized);
    assert!(index.tokenizer.is_none() && index.configuration.is_none());
}

#[test]
fn an_output_directory_holding_foreign_files_is_refused() {
    let out = tempfile::tempdir().unwrap();
    fs::write(out.path().join("notes.txt"), b"mine").unwrap();
    let err = pack(&fixture("mlx-affine4"), out.path(), &opts(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("no pack wrote"), "{err}");
    // A previous pack's output (even an interrupted one) is rewritten.
    let again = tempfile::tempdir().unwrap();
    fs::write(again.path().join(INCOMPLETE_MARKER), b"").unwrap();
    pack_into(&fixture("mlx-affine4"), again.path());
    pack_into(&fixture("mlx-affine4"), again.path());
    check(again.path(), &fixture("mlx-affine4"), &|_| {}).unwrap();

    // A file or a folder someone added to a finished pack is never deleted by re-packing:
    // the pack is refused naming it, and everything stays as it was.
    fs::write(again.path().join("notes.txt"), b"mine").unwrap();
    fs::create_dir(again.path().join("runs")).unwrap();
    fs::write(again.path().join("runs/log.txt"), b"mine too").unwrap();
    let err = pack(&fixture("mlx-affine4"), again.path(), &opts(), &|_| {}).unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("notes.txt") && said.contains("runs/") && said.contains("move them away"),
        "{said}"
    );
    assert_eq!(fs::read(again.path().join("notes.txt")).unwrap(), b"mine");
    assert_eq!(
        fs::read(again.path().join("runs/log.txt")).unwrap(),
        b"mine too"
    );
    assert!(!again.path().join(INCOMPLETE_MARKER).exists());
    check(again.path(), &fixture("mlx-affine4"), &|_| {}).unwrap();
    fs::remove_file(again.path().join("notes.txt")).unwrap();
    fs::remove_dir_all(again.path().join("runs")).unwrap();
    pack_into(&fixture("mlx-affine4"), again.path());
}

/// A DeepSeek-V4-style FP8 checkpoint (e8m0 block scales) becomes version-3 containers; one
/// with float32 scales (DeepSeek V3 style) stays plain, because the container format's
/// fp8-e4m3-block mode carries e8m0 scales only.
#[test]
fn fp8_with_e8m0_block_scales_becomes_v3_containers() {
    let src = tempfile::tempdir().unwrap();
    let weight: Vec<u8> = (0..256 * 384).map(|i| (i * 7 % 251) as u8).collect();
    let scales: Vec<u8> = (0..2 * 3).map(|i| 120 + i as u8).collect();
    let views = vec![
        (
            "model.layers.0.self_attn.wq.weight".to_string(),
            TensorView::new(Dtype::F8_E4M3, vec![256, 384], &weight).unwrap(),
        ),
        (
            "model.layers.0.self_attn.wq.weight_scale_inv".to_string(),
            TensorView::new(Dtype::F8_E8M0, vec![2, 3], &scales).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &src.path().join("model.safetensors")).unwrap();
    let config = r#"{"model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#;
    fs::write(src.path().join("config.json"), config).unwrap();
    let out = tempfile::tempdir().unwrap();
    let summary = pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    assert_eq!(summary.tile_containers, 1);
    let path = out
        .path()
        .join("layer00/model.layers.0.self_attn.wq.fp8tile");
    let bytes = fs::read(&path).unwrap();
    let c = TileContainer::parse(&bytes, bytes.len() as u64).unwrap();
    assert_eq!((c.version, c.flags.0, c.layout.scale_bytes), (3, 0xC, 6));
    check(out.path(), src.path(), &|_| {}).unwrap();
}

/// DeepSeek V4 Flash's own names: FP8 block scales as `.scale`, and with `expert_dtype: fp4` the
/// experts' I8 FP4 codes with E8M0 `.scale` per 32 columns, packed as MXFP4 containers that
/// `check` passes; FP4 codes without their scales, or a config that does not say FP4, are refused.
#[test]
fn deepseek_v4_scale_names_and_fp4_experts_are_packed() {
    let write = |dir: &std::path::Path, config: &str, with_scale: bool| {
        let weight: Vec<u8> = (0..256 * 384).map(|i| (i * 7 % 251) as u8).collect();
        let scales: Vec<u8> = (0..2 * 3).map(|i| 120 + i as u8).collect();
        let codes: Vec<u8> = (0..1024 * 512).map(|i| (i * 13 % 256) as u8).collect();
        let expert_scales: Vec<u8> = (0..1024 * 32).map(|i| 118 + (i % 5) as u8).collect();
        let mut views = vec![
            (
                "layers.0.attn.wq_a.weight".to_string(),
                TensorView::new(Dtype::F8_E4M3, vec![256, 384], &weight).unwrap(),
            ),
            (
                "layers.0.attn.wq_a.scale".to_string(),
                TensorView::new(Dtype::F8_E8M0, vec![2, 3], &scales).unwrap(),
            ),
            (
                "layers.0.ffn.experts.0.w1.weight".to_string(),
                TensorView::new(Dtype::I8, vec![1024, 512], &codes).unwrap(),
            ),
        ];
        if with_scale {
            views.push((
                "layers.0.ffn.experts.0.w1.scale".to_string(),
                TensorView::new(Dtype::F8_E8M0, vec![1024, 32], &expert_scales).unwrap(),
            ));
        }
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
        fs::write(dir.join("config.json"), config).unwrap();
    };
    let fp4 = r#"{"model_type": "deepseek_v4", "expert_dtype": "fp4", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#;
    let src = tempfile::tempdir().unwrap();
    write(src.path(), fp4, true);
    let out = tempfile::tempdir().unwrap();
    let summary = pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    assert_eq!(summary.tile_containers, 2);
    let expert = fs::read(
        out.path()
            .join("layer00/layers.0.ffn.experts.0.w1.mxfp4tile"),
    )
    .unwrap();
    let c = TileContainer::parse(&expert, expert.len() as u64).unwrap();
    assert_eq!((c.geometry.rows, c.geometry.cols), (1024, 1024));
    check(out.path(), src.path(), &|_| {}).unwrap();

    let src = tempfile::tempdir().unwrap();
    write(src.path(), fp4, false);
    let err = pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("w1.scale is missing"), "{err}");
    let fp8 = fp4.replace(r#""expert_dtype": "fp4", "#, "");
    write(src.path(), &fp8, true);
    let err = pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("looks quantized"), "{err}");
    write(src.path(), &fp4.replace("fp4", "fp6"), true);
    let err = pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("expert_dtype"), "{err}");
}

#[test]
fn check_refuses_an_incomplete_or_padded_artifact() {
    let out = tempfile::tempdir().unwrap();
    pack_into(&fixture("gptoss-mxfp4"), out.path());
    let source = fixture("gptoss-mxfp4");
    fs::write(out.path().join("layer00/stray.bin"), b"left over").unwrap();
    let err = check(out.path(), &source, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("stray.bin"), "{err}");
    fs::remove_file(out.path().join("layer00/stray.bin")).unwrap();
    fs::remove_dir_all(out.path().join("global")).unwrap();
    let err = check(out.path(), &source, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("index.json lists units"), "{err}");
    fs::write(out.path().join(INCOMPLETE_MARKER), b"").unwrap();
    let err = check(out.path(), &source, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("interrupted pack"), "{err}");
}

#[test]
fn a_repack_leaves_nothing_of_the_previous_pack() {
    let out = tempfile::tempdir().unwrap();
    pack_into(&fixture("deepseek-fp8"), out.path());
    pack_into(&fixture("gptoss-mxfp4"), out.path());
    check(out.path(), &fixture("gptoss-mxfp4"), &|_| {}).unwrap();
}

#[test]
fn a_tensor_name_that_is_not_a_safe_file_name_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let blocks = vec![0u8; 512 * 32 * 16];
    let scales = vec![127u8; 512 * 32];
    let views = vec![
        (
            "../../escape_blocks".to_string(),
            TensorView::new(Dtype::U8, vec![512, 32, 16], &blocks).unwrap(),
        ),
        (
            "../../escape_scales".to_string(),
            TensorView::new(Dtype::U8, vec![512, 32], &scales).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &src.path().join("model.safetensors")).unwrap();
    fs::write(
        src.path().join("config.json"),
        r#"{"quantization_config": {"quant_method": "mxfp4"}}"#,
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    // A previous artifact in the output directory survives the refusal untouched.
    let previous = out.path().join("art");
    pack_into(&fixture("mlx-affine4"), &previous);
    let before: Vec<_> = walk(&previous);
    let err = pack(src.path(), &previous, &PackOptions::default(), &|_| {}).unwrap_err();
    assert!(err.to_string().contains("cannot be a file name"), "{err}");
    assert_eq!(
        walk(&previous),
        before,
        "the refusal came before the output was touched"
    );
    check(&previous, &fixture("mlx-affine4"), &|_| {}).unwrap();
}

/// Every file under `dir` with its bytes, sorted.
fn walk(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_checkpoint_of_symbolic_links_is_followed() {
    // A Hugging Face cache snapshot holds links into its repository's blob store:
    // models--org--name/snapshots/<revision>/<file> -> ../../blobs/<hash>.
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--org--name");
    let snapshot = repo.join("snapshots/0123abc");
    fs::create_dir_all(&snapshot).unwrap();
    fs::create_dir_all(repo.join("blobs")).unwrap();
    for (i, e) in fs::read_dir(fixture("mlx-affine4"))
        .unwrap()
        .flatten()
        .enumerate()
    {
        let blob = format!("blob{i}");
        fs::copy(e.path(), repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snapshot.join(e.file_name()))
            .unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let summary = pack_into(&snapshot, out.path());
    assert!(summary.tile_containers > 0);
    check(out.path(), &fixture("mlx-affine4"), &|_| {}).unwrap();

    // A link that leaves the cache is refused: it would copy a file from elsewhere.
    std::os::unix::fs::symlink(
        fixture("mlx-affine4").join("config.json"),
        snapshot.join("notes.txt"),
    )
    .unwrap();
    let refused = tempfile::tempdir().unwrap();
    let err = minirun_pack::pack(&snapshot, refused.path(), &PackOptions::default(), &|_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the checkpoint folder"), "{err}");
}

/// The published V4 writer takes every E8M0 `scale` with the FP8 or FP4 tensor it scales: one
/// beside a plain tensor would be dropped, so it is refused by name.
#[test]
fn a_v4_scale_that_scales_no_quantized_tensor_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let weight = vec![0u8; 128 * 128 * 2];
    let scale = vec![127u8; 1];
    let views = vec![
        (
            "layers.0.attn.wkv.weight".to_string(),
            TensorView::new(Dtype::BF16, vec![128, 128], &weight).unwrap(),
        ),
        (
            "layers.0.attn.wkv.scale".to_string(),
            TensorView::new(Dtype::F8_E8M0, vec![1, 1], &scale).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &src.path().join("model.safetensors")).unwrap();
    fs::write(src.path().join("config.json"), "{}").unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = PackOptions {
        source_repo: Some(REPO.into()),
        source_revision: Some("0123456789abcdef0123456789abcdef01234567".into()),
    };
    let err = minirun_pack::v4_published::pack_v4_published(src.path(), out.path(), &opts, &|_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layers.0.attn.wkv.scale") && err.contains("scales no FP8"),
        "{err}"
    );
    assert!(fs::read_dir(out.path()).unwrap().next().is_none());
}

/// The unit manifests of a packed artifact, with their directories' names.
fn units(artifact: &Path) -> Vec<UnitManifest> {
    let mut names: Vec<String> = fs::read_dir(artifact)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().join("manifest.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.iter().map(|n| manifest(artifact, n)).collect()
}

/// A check counts every byte it compared with the source: each container's packed, scale and
/// bias streams and each blob's members, once.
#[test]
fn check_reports_every_source_byte_it_compared() {
    for name in ["mlx-affine4", "gptoss-mxfp4", "deepseek-fp8"] {
        let out = tempfile::tempdir().unwrap();
        pack_into(&fixture(name), out.path());
        let mut expected = 0;
        for unit in units(out.path()) {
            for file in &unit.files {
                expected += match file {
                    FileEntry::TileContainer {
                        packed,
                        scales,
                        biases,
                        ..
                    } => packed.bytes + scales.bytes + biases.as_ref().map_or(0, |b| b.bytes),
                    FileEntry::Blob { bytes, .. } => *bytes,
                };
            }
        }
        let reported = std::sync::atomic::AtomicU64::new(0);
        let progress = |n: u64| {
            reported.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        };
        let report = check(out.path(), &fixture(name), &progress).unwrap();
        assert!(expected > 0, "{name}");
        assert_eq!(report.bytes_compared, expected, "{name}");
        assert_eq!(reported.into_inner(), expected, "{name}: progress");
    }
}

/// Every padding byte must be zero: a nonzero byte at the first or the last byte of a tile's
/// packed or scale padding is found, at its offset. (Only fp8-e4m3-block containers pad; affine,
/// the only mode with biases, fills whole pages, so there is no bias padding to plant a byte in.)
#[test]
fn check_finds_a_nonzero_byte_anywhere_in_a_tiles_padding() {
    let src = tempfile::tempdir().unwrap();
    // 64 x 192 bytes in 64 x 64 blocks is three quarters of a page: the packed region ends in
    // a quarter page of padding, and the 3 scales in a page less 3 bytes.
    let weight: Vec<u8> = (0..64 * 192).map(|i| (i * 7 % 251) as u8).collect();
    let scales: Vec<u8> = (0..3).map(|i| 120 + i as u8).collect();
    let views = vec![
        (
            "model.layers.0.self_attn.wq.weight".to_string(),
            TensorView::new(Dtype::F8_E4M3, vec![64, 192], &weight).unwrap(),
        ),
        (
            "model.layers.0.self_attn.wq.weight_scale_inv".to_string(),
            TensorView::new(Dtype::F8_E8M0, vec![1, 3], &scales).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &src.path().join("model.safetensors")).unwrap();
    let config = r#"{"model_type": "deepseek_v4", "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}"#;
    fs::write(src.path().join("config.json"), config).unwrap();
    let out = tempfile::tempdir().unwrap();
    pack(src.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    let path = out
        .path()
        .join("layer00/model.layers.0.self_attn.wq.fp8tile");
    let bytes = fs::read(&path).unwrap();
    let c = TileContainer::parse(&bytes[..HEADER_BYTES as usize], bytes.len() as u64).unwrap();
    let l = c.layout;
    let start = c.tile_range(0).unwrap().start;
    let pads = [
        (
            "packed",
            start + l.packed_bytes,
            l.packed_region - l.packed_bytes,
        ),
        (
            "scales",
            start + l.scale_offset + l.scale_bytes,
            l.scale_region - l.scale_bytes,
        ),
    ];
    for (region, at, len) in pads {
        assert!(len > 0, "{region}: no padding to plant a byte in");
        for byte in [at, at + len - 1] {
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0x01], byte).unwrap();
            match check(out.path(), src.path(), &|_| {}) {
                Err(CheckError::Differs(d)) => assert_eq!(
                    (d.region.as_str(), d.tile, d.file_offset),
                    ("padding", Some(0), byte),
                    "{region} padding"
                ),
                other => panic!("{region} padding at {byte}: {other:?}"),
            }
            f.write_all_at(&[0x00], byte).unwrap();
        }
    }
    check(out.path(), src.path(), &|_| {}).unwrap();
}

/// A manifest whose source reference differs from the checkpoint's tensor in any one field is
/// refused, even when every other field matches.
#[test]
fn a_source_reference_wrong_in_one_field_is_refused() {
    let out = tempfile::tempdir().unwrap();
    pack_into(&fixture("mlx-affine4"), out.path());
    let path = out.path().join("layer00/manifest.json");
    let original = fs::read(&path).unwrap();
    let lies: [(&str, serde_json::Value); 5] = [
        ("dtype", "F16".into()),
        ("shape", serde_json::json!([1, 1])),
        ("shard", "other.safetensors".into()),
        ("shard_offset", 8.into()),
        ("bytes", 4.into()),
    ];
    for (field, lie) in lies {
        let mut json: serde_json::Value = serde_json::from_slice(&original).unwrap();
        let packed = json["files"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find_map(|f| f.get_mut("packed"))
            .expect("a tile container in layer00");
        packed[field] = lie;
        fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let err = check(out.path(), &fixture("mlx-affine4"), &|_| {}).unwrap_err();
        assert!(
            matches!(&err, CheckError::Differs(d) if d.region == "manifest"),
            "{field}: {err}"
        );
    }
    fs::write(&path, &original).unwrap();
    check(out.path(), &fixture("mlx-affine4"), &|_| {}).unwrap();
}

/// A blob with bytes after its last member is refused, though every member matches.
#[test]
fn a_blob_longer_than_its_members_is_refused() {
    let out = tempfile::tempdir().unwrap();
    pack_into(&fixture("mlx-affine4"), out.path());
    let blob = out.path().join("layer00/layer00-plain.blob");
    let mut bytes = fs::read(&blob).unwrap();
    bytes.push(0);
    fs::write(&blob, &bytes).unwrap();
    let err = check(out.path(), &fixture("mlx-affine4"), &|_| {}).unwrap_err();
    assert!(
        matches!(&err, CheckError::Differs(d) if d.region == "member"),
        "{err}"
    );
    assert!(err.to_string().contains("the file has"), "{err}");
}
