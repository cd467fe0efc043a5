//! What the end-to-end tests of `minirun run`, `plan`, `quickstart` and `bench model` share:
//! the binary with a test-only evidence key, and a tiny DeepSeek-V3 checkpoint packed into a
//! fresh artifact (each test binary uses part of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `minirun ARGS`, with this test binary's own evidence key: the user's stays untouched.
pub fn minirun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        .env(
            "MINIRUN_EVIDENCE_KEY",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(concat!(env!("CARGO_CRATE_NAME"), ".key")),
        )
        .args(args)
        .output()
        .expect("minirun runs")
}

pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64")
}

/// The fixture packed into a new temporary directory.
pub fn packed() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = minirun(&[
        "pack",
        "--source",
        fixture().to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    dir
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
