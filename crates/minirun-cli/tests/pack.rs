//! `minirun pack` and `minirun check`, run as the real binary on a fixture checkpoint.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

fn minirun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        .args(args)
        .output()
        .expect("run minirun")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn pack_then_check_then_info_then_damage() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-pack/tests/data/checkpoints/mlx-affine4");
    let source = source.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("art");
    let out_s = out.to_str().unwrap();
    let revision = "0123456789abcdef0123456789abcdef01234567";

    let packed = minirun(&[
        "pack",
        "--source",
        source,
        "--out",
        out_s,
        "--source-repo",
        "tests/mlx-affine4",
        "--source-revision",
        revision,
        "--json",
    ]);
    assert!(packed.status.success(), "{}", text(&packed.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&packed.stdout).unwrap();
    assert!(
        summary["summary"]["tile_containers"].as_u64().unwrap() >= 5,
        "{summary}"
    );

    let checked = minirun(&["check", out_s, "--source", source]);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    assert!(text(&checked.stdout).contains("match the source byte for byte"));

    let info = minirun(&["info", out_s]);
    assert!(info.status.success());
    let shown = text(&info.stdout);
    assert!(
        shown.contains("single-source-units") && shown.contains("tests/mlx-affine4"),
        "{shown}"
    );
    assert!(shown.contains("tokenizer: tokenizer.json"), "{shown}");

    let tile = out.join("layer00/model.layers.0.self_attn.o_proj.affinetile");
    fs::OpenOptions::new()
        .write(true)
        .open(&tile)
        .unwrap()
        .write_all_at(&[0xEE], 16384 + 10)
        .unwrap();
    let checked = minirun(&["check", out_s, "--source", source]);
    assert_eq!(checked.status.code(), Some(1));
    let err = text(&checked.stderr);
    assert!(
        err.contains("o_proj.affinetile tile 0")
            && err.contains("packed")
            && err.contains("o_proj.weight"),
        "{err}"
    );

    let lying = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-pack/tests/data/checkpoints/lying-config");
    let refused = minirun(&[
        "pack",
        "--source",
        lying.to_str().unwrap(),
        "--out",
        dir.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("contradict"),
        "{}",
        text(&refused.stderr)
    );

    let half = minirun(&[
        "pack",
        "--source",
        source,
        "--out",
        out_s,
        "--source-repo",
        "tests/mlx-affine4",
    ]);
    assert_eq!(
        half.status.code(),
        Some(2),
        "clap refuses a repo without a revision"
    );
}

/// A checkpoint whose experts do not split into the published K3 layout's bands is refused
/// before the output directory is touched: nothing half written is left behind.
#[test]
fn a_published_layout_refusal_leaves_no_partial_output() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/kimi-k3/hf-k3mix");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("published");
    let packed = minirun(&[
        "pack",
        "--source",
        source.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--layout",
        "kimi-k3-published",
    ]);
    assert_eq!(packed.status.code(), Some(1), "{}", text(&packed.stderr));
    assert!(
        text(&packed.stderr).contains("are not whole bands of 1024"),
        "{}",
        text(&packed.stderr)
    );
    assert!(!out.exists(), "the refusal left {}", out.display());
}

/// An error names its path and its cause once, however many layers carry them.
#[test]
fn an_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = dir.path().join("out");
    let packed = minirun(&[
        "pack",
        "--source",
        missing.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(packed.status.code(), Some(1));
    let said = text(&packed.stderr);
    assert_eq!(
        said.matches("No such file or directory").count(),
        1,
        "{said}"
    );
    assert_eq!(said.matches("nope/config.json").count(), 1, "{said}");
}
