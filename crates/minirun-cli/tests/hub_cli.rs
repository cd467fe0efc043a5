//! `minirun download` and `catalog` refuse what they cannot do honestly before any transfer.

use std::process::Command;

fn minirun(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_minirun"))
        .args(args)
        .env_remove("HF_ENDPOINT")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_branch_name_is_refused_and_an_unreachable_endpoint_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("a").to_string_lossy().into_owned();
    let (code, err) = minirun(&[
        "download",
        "--repo",
        "o/r-minirun",
        "--revision",
        "main",
        "--out",
        &out,
        "--endpoint",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("not a pinned revision") && err.contains("40-hex"),
        "{err}"
    );
    let (code, err) = minirun(&[
        "download",
        "--repo",
        "o/r-minirun",
        "--revision",
        &"a".repeat(40),
        "--out",
        &out,
        "--endpoint",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(
        !dir.path().join("a").exists(),
        "nothing created before the tree is known"
    );
    let (code, err) = minirun(&["catalog", "--endpoint", "https://huggingface.co/api"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("origin only"), "{err}");
}
