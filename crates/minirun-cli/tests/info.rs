//! `minirun info` and `minirun synth`, run as the real binary.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

fn minirun(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        // This test binary's evidence key: the user's own stays untouched.
        .env(
            "MINIRUN_EVIDENCE_KEY",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests.key"),
        )
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run minirun")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_synthetic_container_is_described_and_its_tiles_verified() {
    let dir = tempfile::tempdir().unwrap();
    let out = minirun(
        &[
            "synth",
            "--out",
            "c.mxfp4tile",
            "--rows",
            "512",
            "--cols",
            "1024",
            "--tiles",
            "4",
            "--digests",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = minirun(
        &["info", "c.mxfp4tile", "--verify-tiles", "--threads", "2"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "MNRNTIL1 version 2",
        "mxfp4",
        "tile-digests",
        "4 tiles of 512 rows x 1024 cols",
        "4 SHA-256 tile digests",
        "all ok",
    ] {
        assert!(text.contains(needle), "missing {needle:?}:\n{text}");
    }

    let json = minirun(&["info", "c.mxfp4tile", "--json"], dir.path());
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["kind"], "tile-container");
    assert_eq!(doc["container"]["version"], 2);
    assert_eq!(doc["container"]["geometry"]["mode"], "mxfp4");
    assert_eq!(doc["container"]["layout"]["tile_stride"], 278_528);
    assert_eq!(doc["container"]["digests"].as_array().unwrap().len(), 4);

    // Corrupt one byte of tile 2: verification names it and exits 1.
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("c.mxfp4tile"))
        .unwrap();
    file.write_all_at(&[0xAA], 16_384 + 2 * 278_528 + 1000)
        .unwrap();
    let out = minirun(&["info", "c.mxfp4tile", "--verify-tiles"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("1 FAILED") && text.contains("tile 2: SHA-256"),
        "{text}"
    );
}

#[test]
fn synthetic_tiles_without_digests_are_verified_by_regeneration() {
    let dir = tempfile::tempdir().unwrap();
    let out = minirun(
        &[
            "synth",
            "--out",
            "v1.mxfp4tile",
            "--rows",
            "512",
            "--cols",
            "1024",
            "--tiles",
            "2",
            "--seed",
            "99",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        fs::metadata(dir.path().join("v1.mxfp4tile")).unwrap().len(),
        573_440
    );
    let out = minirun(&["info", "v1.mxfp4tile", "--verify-tiles"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("regenerating the synthetic content"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("implied"),
        "v1 says its kind is implied: {}",
        stdout(&out)
    );
}

#[test]
fn synth_refuses_geometry_it_cannot_align_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = minirun(
        &[
            "synth",
            "--out",
            "bad.mxfp4tile",
            "--rows",
            "100",
            "--cols",
            "1024",
            "--tiles",
            "1",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("16384"), "{}", stderr(&out));
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no file, no temporary file"
    );
}

#[test]
fn a_damaged_container_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    minirun(
        &[
            "synth",
            "--out",
            "c.mxfp4tile",
            "--rows",
            "512",
            "--cols",
            "1024",
            "--tiles",
            "2",
        ],
        dir.path(),
    );
    let path = dir.path().join("c.mxfp4tile");
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let out = minirun(&["info", "c.mxfp4tile"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("truncated"), "{}", stderr(&out));
}

#[test]
fn an_artifact_directory_or_index_is_described() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-format/tests/data/index/kimi-k3.index.json");
    fs::copy(&fixture, dir.path().join("index.json")).unwrap();
    for target in [".", "index.json"] {
        let out = minirun(&["info", target], dir.path());
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains("single-source-totals") && text.contains("moonshotai/Kimi-K3"),
            "{text}"
        );
    }
    let out = minirun(&["info", ".", "--json"], dir.path());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "artifact-index");
    assert_eq!(doc["layout"], "minirun's own layout");
    // A layer manifest of the published K3 layout makes the directory that layout's.
    let k3_manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-format/tests/data/k3-published/layer01.manifest.json");
    fs::create_dir(dir.path().join("layer00")).unwrap();
    fs::copy(&k3_manifest, dir.path().join("layer00/manifest.json")).unwrap();
    let out = minirun(&["info", "."], dir.path());
    assert!(
        stdout(&out).contains("layout      the published Kimi K3 layout"),
        "{}",
        stdout(&out)
    );
    let empty = tempfile::tempdir().unwrap();
    let out = minirun(&["info", "."], empty.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("without an index.json"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn other_files_are_named_with_what_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dmexp/tests/data/golden.bf16.dmexp");
    fs::copy(&golden, dir.path().join("model.dmexp")).unwrap();
    let out = minirun(&["info", "model.dmexp"], dir.path());
    assert!(out.status.success());
    assert!(
        stdout(&out).contains(".dmexp export") && stdout(&out).contains("export info"),
        "{}",
        stdout(&out)
    );

    let mut checkpoint = b"DMTRAIN\0".to_vec();
    checkpoint.resize(100, 0);
    fs::write(dir.path().join("latest.bin"), &checkpoint).unwrap();
    let out = minirun(&["info", "latest.bin", "--json"], dir.path());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "dormouse-training-checkpoint");

    fs::write(
        dir.path().join("junk"),
        b"\x01\x02\x03\x04 nothing known here",
    )
    .unwrap();
    let out = minirun(&["info", "junk"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains("not a dormouse export"),
        "{}",
        stdout(&out)
    );
}

/// Runs minirun, failing the test if it has not exited within 30 s (a blocked open).
fn minirun_within_30s(args: &[&str]) -> Output {
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_minirun"))
        // This test binary's evidence key: the user's own stays untouched.
        .env(
            "MINIRUN_EVIDENCE_KEY",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests.key"),
        )
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run minirun");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("minirun {args:?} blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

#[test]
fn a_fifo_is_refused_at_once_by_info_verify_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    mkfifo(&fifo);
    let out = minirun_within_30s(&["info", fifo.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("FIFO"), "{}", stderr(&out));

    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    let artifact = dir.path().join("artifact");
    let (src, art) = (source.to_str().unwrap(), artifact.to_str().unwrap());
    assert!(
        minirun_within_30s(&["pack", "--source", src, "--out", art])
            .status
            .success()
    );
    let blob = artifact.join("layer01/layer01-plain.blob");
    fs::remove_file(&blob).unwrap();
    mkfifo(&blob);
    for args in [
        vec!["verify", art],
        vec![
            "run",
            art,
            "--unverified",
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
        ],
    ] {
        let out = minirun_within_30s(&args);
        assert!(!out.status.success(), "{args:?} accepted a FIFO");
        assert!(
            stderr(&out).contains("layer01-plain.blob"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn control_characters_in_a_name_reach_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let name = "evil\u{1b}]0;owned\u{7}\u{1b}[2J.bin";
    fs::write(dir.path().join(name), b"not a container at all").unwrap();
    let out = minirun(&["info", name], dir.path());
    let printed = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    assert!(
        !printed.contains(&0x1b),
        "{}",
        String::from_utf8_lossy(&printed)
    );
    assert!(
        String::from_utf8_lossy(&printed).contains("evil\\u{1b}]0;owned\\u{7}"),
        "{}",
        String::from_utf8_lossy(&printed)
    );
}

/// A published Kimi K3 layer manifest is recognised and checked: its tensors listed band by
/// band; a broken one refused naming the rule; one outside its `layerNN` directory refused.
#[test]
fn a_published_kimi_k3_layer_manifest_is_checked_and_described() {
    let dir = tempfile::tempdir().unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-format/tests/data/k3-published/layer01.manifest.json");
    fs::create_dir(dir.path().join("layer01")).unwrap();
    fs::copy(&golden, dir.path().join("layer01/manifest.json")).unwrap();
    let out = minirun(&["info", "layer01/manifest.json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("layer 1: layer01-deterministic.bin of 180224 bytes in 10 units"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("self_attn.q_proj.weight")
            && l.contains("128 x 128")
            && l.contains("2 bands")),
        "{text}"
    );
    let json = minirun(&["info", "--json", "layer01/manifest.json"], dir.path());
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["kind"], "kimi-k3-layer-manifest");
    assert_eq!(doc["tensors"].as_array().unwrap().len(), 9);

    let mut broken: serde_json::Value =
        serde_json::from_slice(&fs::read(&golden).unwrap()).unwrap();
    broken["nonexpert"]["units"][1]["offset"] = 0.into();
    fs::write(dir.path().join("layer01/manifest.json"), broken.to_string()).unwrap();
    let out = minirun(&["info", "layer01/manifest.json"], dir.path());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("units 0 and 1 overlap"),
        "{}",
        stderr(&out)
    );

    fs::copy(&golden, dir.path().join("manifest.json")).unwrap();
    let out = minirun(&["info", "manifest.json"], dir.path());
    assert!(
        stderr(&out).contains("outside a layerNN directory"),
        "{}",
        stderr(&out)
    );
}

/// A published DeepSeek V4 unit manifest is recognised and checked: its files listed with the
/// tensor each FP8 container holds; a broken one refused naming the rule; one outside its unit
/// directory refused.
#[test]
fn a_published_deepseek_v4_unit_manifest_is_checked_and_described() {
    let dir = tempfile::tempdir().unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-format/tests/data/v4-published/layers02.manifest.json");
    fs::create_dir(dir.path().join("layers02")).unwrap();
    fs::copy(&golden, dir.path().join("layers02/manifest.json")).unwrap();
    let out = minirun(&["info", "layers02/manifest.json"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("13 files, 3596391128 bytes, 256 experts in expert_order"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("fp8-e4m3-block 512 x 4096")
                && l.ends_with("layers.2.attn.wkv.weight")),
        "{text}"
    );
    let json = minirun(&["info", "--json", "layers02/manifest.json"], dir.path());
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["kind"], "deepseek-v4-unit-manifest");
    assert_eq!(doc["files"].as_array().unwrap().len(), 13);

    let mut broken: serde_json::Value =
        serde_json::from_slice(&fs::read(&golden).unwrap()).unwrap();
    broken["expert_order"][0] = 1.into();
    fs::write(
        dir.path().join("layers02/manifest.json"),
        broken.to_string(),
    )
    .unwrap();
    let out = minirun(&["info", "layers02/manifest.json"], dir.path());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a permutation"),
        "{}",
        stderr(&out)
    );

    fs::copy(&golden, dir.path().join("manifest.json")).unwrap();
    let out = minirun(&["info", "manifest.json"], dir.path());
    assert!(
        stderr(&out).contains("outside its unit directory"),
        "{}",
        stderr(&out)
    );
}
