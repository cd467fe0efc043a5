//! The official `openai` Python client against the real `serve` on 127.0.0.1: a completion, a
//! streamed completion and a refused request, through `tools/openai_client_check.py`. The
//! client is installed (pinned) into a venv under cargo's target tmp dir on first use; that
//! needs Python >= 3.11 and the PyPI registry.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, run, stderr, trained_export};

const OPENAI_VERSION: &str = "3.57.0";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python, creating the venv and installing the client if needed.
fn client_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("openai-{OPENAI_VERSION}"));
    let python = venv.join("bin/python");
    if python.exists() {
        return python;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 is needed for the openai client test");
    assert!(made.success(), "python3 -m venv {} failed", venv.display());
    let installed = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", &format!("openai=={OPENAI_VERSION}")])
        .status()
        .unwrap();
    if !installed.success() {
        let _ = std::fs::remove_dir_all(&venv);
        panic!("pip install openai=={OPENAI_VERSION} failed: the test needs the PyPI registry");
    }
    python
}

#[test]
fn the_official_openai_client_completes_and_streams() {
    let python = client_python();
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 20, &[]);
    let server = Server::start(dir.path(), &export, &[]);
    let out = Command::new(python)
        .arg(repo_root().join("tools/openai_client_check.py"))
        .args([&server.url("/v1"), "latest.bf16", "In the beginning", "24"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let generated = run(
        dir.path(),
        "generate",
        &[
            "--export",
            export.to_str().unwrap(),
            "--prompt",
            "In the beginning",
            "--steps",
            "24",
        ],
    );
    assert!(generated.status.success(), "{}", stderr(&generated));
    assert_eq!(
        result["text"].as_str().unwrap(),
        String::from_utf8_lossy(&generated.stdout).trim_end_matches('\n')
    );
}
