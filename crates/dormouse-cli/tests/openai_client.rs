//! The official `openai` Python client against the real `serve` on 127.0.0.1: a completion, a
//! streamed completion and a refused request, through `tools/openai_client_check.py`. The
//! client (pinned in `tools/requirements-openai.txt`) is installed into `target/openai-venv`
//! on first use; that needs Python >= 3.11 and the PyPI registry.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, run, stderr, trained_export};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The python of the project's `openai` environment (`tools/python-venv.sh openai`, made on
/// first use; that needs python3 and the PyPI registry).
fn client_python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/python-venv.sh");
    let out = Command::new(script)
        .arg("openai")
        .output()
        .expect("tools/python-venv.sh runs");
    assert!(
        out.status.success(),
        "tools/python-venv.sh openai failed (it needs python3 and the PyPI registry): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
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
            "--max-tokens",
            "24",
        ],
    );
    assert!(generated.status.success(), "{}", stderr(&generated));
    assert_eq!(
        result["text"].as_str().unwrap(),
        String::from_utf8_lossy(&generated.stdout).trim_end_matches('\n')
    );
}
