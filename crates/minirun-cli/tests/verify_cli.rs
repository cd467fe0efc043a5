//! `minirun verify` with a saved tree listing: success writes evidence, a damaged file fails
//! naming it and erases the evidence.

use std::fs;
use std::process::Command;

use sha2::Digest as _;

const PIN: &str = "0123456789abcdef0123456789abcdef01234567";

fn minirun(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_minirun"))
        // This test binary's evidence key: the user's own stays untouched.
        .env(
            "MINIRUN_EVIDENCE_KEY",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests.key"),
        )
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_writes_evidence_and_a_damaged_file_erases_it() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("art");
    fs::create_dir_all(art.join("layer00")).unwrap();
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(art.join("layer00/w.mxfp4tile"), &payload).unwrap();
    let sha: String = sha2::Sha256::digest(&payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tree = format!(
        r#"[{{"type":"directory","oid":"{z}","size":0,"path":"layer00"}},
            {{"type":"file","oid":"{z}","size":{n},"path":"layer00/w.mxfp4tile","lfs":{{"oid":"{sha}","size":{n},"pointerSize":130}}}}]"#,
        z = "1".repeat(40),
        n = payload.len()
    );
    let tree_path = dir.path().join("tree.json");
    fs::write(&tree_path, tree).unwrap();
    let art_s = art.to_str().unwrap();
    let args = [
        "verify",
        art_s,
        "--repo",
        "team/x-minirun",
        "--revision",
        PIN,
        "--tree",
        tree_path.to_str().unwrap(),
    ];
    let (code, err) = minirun(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("verified: 1 files"), "{err}");
    let evidence: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(art.join(".minirun/evidence.json")).unwrap())
            .unwrap();
    assert_eq!(evidence["sealed"]["schema"], "minirun-evidence/2");
    assert_eq!(evidence["sealed"]["files"][0]["digest"]["hex"], sha);
    assert_eq!(evidence["seal"].as_str().map(str::len), Some(64));

    let mut damaged = payload.clone();
    damaged[99] ^= 1;
    fs::write(art.join("layer00/w.mxfp4tile"), damaged).unwrap();
    let (code, err) = minirun(&args);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("layer00/w.mxfp4tile") && err.contains("hashes to"),
        "{err}"
    );
    assert!(!art.join(".minirun/evidence.json").exists());

    let (code, err) = minirun(&["verify", art_s]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--repo ID --revision SHA"), "{err}");
}

#[test]
fn a_packed_artifact_verifies_offline_against_its_own_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../minirun-pack/tests/data/checkpoints/mlx-affine4"
    );
    let out = dir.path().join("packed");
    let out_s = out.to_str().unwrap();
    let (code, err) = minirun(&["pack", "--source", source, "--out", out_s]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = minirun(&["verify", out_s]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("its own manifests") && err.contains("not authenticated"),
        "{err}"
    );
    let evidence: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join(".minirun/evidence.json")).unwrap())
            .unwrap();
    assert_eq!(evidence["sealed"]["mode"], "own-manifests");

    let container = fs::read_dir(out.join("layer00"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension()
                .is_some_and(|x| x.to_string_lossy().ends_with("tile"))
        })
        .unwrap();
    let mut bytes = fs::read(&container).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&container, bytes).unwrap();
    let (code, err) = minirun(&["verify", out_s]);
    assert_eq!(code, Some(1));
    assert!(err.contains("hashes to"), "{err}");
}

#[test]
fn a_verify_killed_midway_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("art");
    fs::create_dir_all(art.join("layer00")).unwrap();
    let mut entries = Vec::new();
    for i in 0..8u8 {
        let mut content = vec![0u8; 128 << 20];
        content[0] = i;
        let path = format!("layer00/w{i}.mxfp4tile");
        fs::write(art.join(&path), &content).unwrap();
        let sha: String = sha2::Sha256::digest(&content)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        entries.push(format!(
            r#"{{"type":"file","oid":"{z}","size":{n},"path":"{path}","lfs":{{"oid":"{sha}","size":{n},"pointerSize":130}}}}"#,
            z = "1".repeat(40),
            n = content.len()
        ));
    }
    let tree_path = dir.path().join("tree.json");
    fs::write(&tree_path, format!("[{}]", entries.join(","))).unwrap();
    let args = [
        "verify",
        art.to_str().unwrap(),
        "--repo",
        "team/x-minirun",
        "--revision",
        PIN,
        "--tree",
        tree_path.to_str().unwrap(),
        "--threads",
        "1",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_minirun"))
        // This test binary's evidence key: the user's own stays untouched.
        .env(
            "MINIRUN_EVIDENCE_KEY",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests.key"),
        )
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let checkpoint = art.join(".minirun/verify-checkpoint.json");
    let started = std::time::Instant::now();
    while !checkpoint.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pass ended before a checkpoint was seen"
        );
        assert!(started.elapsed().as_secs() < 120, "no checkpoint appeared");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!art.join(".minirun/evidence.json").exists());

    let (code, err) = minirun(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("taken from an interrupted earlier pass"),
        "{err}"
    );
    assert!(art.join(".minirun/evidence.json").exists());
    assert!(!checkpoint.exists());
}
