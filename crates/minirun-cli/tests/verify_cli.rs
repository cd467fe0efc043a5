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

    // A pack killed while writing manifests: verify says what run says, not how a half-written
    // manifest fails to parse.
    fs::write(out.join(".minirun-pack-incomplete"), b"").unwrap();
    fs::write(out.join("layer00/manifest.json"), b"{\"unit\": \"lay").unwrap();
    let (code, err) = minirun(&["verify", out_s]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("not a complete artifact (a pack into it was interrupted)"),
        "{err}"
    );
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

const UPSTREAM: &str = "upstream/Model";
const UPSTREAM_PIN: &str = "89abcdef0123456789abcdef0123456789abcdef";
const PUBLICATION: &str = "team/Model-minirun";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A Hub tree entry: LFS (SHA-256) or kept in git (SHA-1 of the blob).
fn entry(path: &str, content: &[u8], lfs: bool) -> serde_json::Value {
    use sha1::Digest as _;
    let n = content.len();
    if lfs {
        let sha = hex(&sha2::Sha256::digest(content));
        return serde_json::json!({"type": "file", "oid": "1".repeat(40), "size": n, "path": path,
            "lfs": {"oid": sha, "size": n, "pointerSize": 134}});
    }
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {n}\0").as_bytes());
    h.update(content);
    serde_json::json!({"type": "file", "oid": hex(&h.finalize()), "size": n, "path": path})
}

type Repo = Vec<(String, Vec<u8>, bool)>;

/// A publication without config.json whose index names its upstream, and that upstream.
fn publication_and_upstream(art: &std::path::Path) -> (Repo, Repo) {
    let index = format!(
        "{{\"format\": \"quantized_tile_container\", \"source_repo\": \"{UPSTREAM}\", \"source_revision\": \"{UPSTREAM_PIN}\"}}\n"
    );
    let publication: Repo = vec![
        ("index.json".into(), index.into_bytes(), false),
        (
            "layer00/layer00-w1.mxfp4tile".into(),
            (0..50_000u32).map(|i| (i % 253) as u8).collect(),
            true,
        ),
    ];
    for (path, content, _) in &publication {
        fs::create_dir_all(art.join(path).parent().unwrap()).unwrap();
        fs::write(art.join(path), content).unwrap();
    }
    let upstream: Repo = vec![
        (
            "config.json".into(),
            b"{\"model_type\": \"kimi_k3\"}\n".to_vec(),
            false,
        ),
        ("model.safetensors".into(), vec![7; 1000], true),
        (
            "tokenizer.json".into(),
            b"{\"model\": {}}\n".to_vec(),
            false,
        ),
    ];
    (publication, upstream)
}

fn listing(repo: &Repo) -> String {
    serde_json::Value::Array(repo.iter().map(|(p, c, l)| entry(p, c, *l)).collect()).to_string()
}

#[test]
fn a_publication_without_config_takes_it_verified_from_the_upstream_its_index_names() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("art");
    let (publication, upstream) = publication_and_upstream(&art);
    let (pub_tree, up_tree) = (dir.path().join("pub.json"), dir.path().join("up.json"));
    fs::write(&pub_tree, listing(&publication)).unwrap();
    fs::write(&up_tree, listing(&upstream)).unwrap();
    let art_s = art.to_str().unwrap();
    let offline = [
        "verify",
        art_s,
        "--repo",
        PUBLICATION,
        "--revision",
        PIN,
        "--tree",
        pub_tree.to_str().unwrap(),
    ];
    let (code, err) = minirun(&offline);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(&format!("{UPSTREAM}@{UPSTREAM_PIN}")) && err.contains("--source-tree"),
        "{err}"
    );
    let with_source: Vec<&str> = offline
        .iter()
        .copied()
        .chain(["--source-tree", up_tree.to_str().unwrap()])
        .collect();
    let (code, err) = minirun(&with_source);
    assert_eq!(code, Some(1));
    assert!(err.contains("place it at"), "{err}");

    // The publication has no tokenizer either: the upstream's is wanted too.
    fs::write(art.join("config.json"), b"{\"model_type\": \"kimi_k4\"}\n").unwrap();
    let (code, err) = minirun(&with_source);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("tokenizer.json") && err.contains("place it at"),
        "{err}"
    );
    fs::write(art.join("tokenizer.json"), &upstream[2].1).unwrap();
    let (code, err) = minirun(&with_source);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("config.json") && err.contains("hashes to"),
        "{err}"
    );

    fs::write(art.join("config.json"), &upstream[0].1).unwrap();
    let (code, err) = minirun(&with_source);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("tokenizer_config.json"),
        "the upstream has none: {err}"
    );
    assert!(
        err.contains(&format!("verified against {UPSTREAM}@{UPSTREAM_PIN}")),
        "{err}"
    );
    let evidence: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(art.join(".minirun/evidence.json")).unwrap())
            .unwrap();
    let files = evidence["sealed"]["files"].as_array().unwrap();
    for name in ["config.json", "tokenizer.json"] {
        let sourced = files.iter().find(|f| f["path"] == name).unwrap();
        assert_eq!(sourced["origin"]["repo"], UPSTREAM);
        assert_eq!(sourced["origin"]["revision"], UPSTREAM_PIN);
    }
    assert!(
        files
            .iter()
            .filter(|f| f["path"] != "config.json" && f["path"] != "tokenizer.json")
            .all(|f| f.get("origin").is_none())
    );

    // From the Hub: config.json and the tokenizer are fetched from the upstream, checked
    // against its tree.
    fs::remove_file(art.join("config.json")).unwrap();
    fs::remove_file(art.join("tokenizer.json")).unwrap();
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let base = format!("http://{}", server.server_addr().to_ip().unwrap());
    let repos = [
        (PUBLICATION, PIN, publication),
        (UPSTREAM, UPSTREAM_PIN, upstream.clone()),
    ];
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let response = answer(&repos, request.url());
            let _ = request.respond(response);
        }
    });
    let (code, err) = minirun(&[
        "verify",
        art_s,
        "--repo",
        PUBLICATION,
        "--revision",
        PIN,
        "--endpoint",
        &base,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("fetched config.json") && err.contains("fetched tokenizer.json"),
        "{err}"
    );
    assert_eq!(fs::read(art.join("config.json")).unwrap(), upstream[0].1);
    assert_eq!(fs::read(art.join("tokenizer.json")).unwrap(), upstream[2].1);
    assert!(!art.join(".minirun-partial").exists());
}

/// The Hub's tree, revision and resolve endpoints for `repos` (one page each).
fn answer(
    repos: &[(&str, &str, Repo)],
    url: &str,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let path = url.split('?').next().unwrap_or(url);
    let respond = |status: u16, body: Vec<u8>, commit: &str| {
        let header = tiny_http::Header::from_bytes("x-repo-commit", commit).unwrap();
        tiny_http::Response::from_data(body)
            .with_status_code(status)
            .with_header(header)
    };
    for (repo, pin, files) in repos {
        if path == format!("/api/models/{repo}/tree/{pin}") {
            return respond(200, listing(files).into_bytes(), pin);
        }
        if path == format!("/api/models/{repo}/revision/{pin}") {
            let siblings: Vec<_> = files
                .iter()
                .map(|(p, _, _)| serde_json::json!({"rfilename": p}))
                .collect();
            let body = serde_json::json!({"sha": pin, "siblings": siblings}).to_string();
            return respond(200, body.into_bytes(), pin);
        }
        let resolved = path
            .strip_prefix(&format!("/{repo}/resolve/{pin}/"))
            .and_then(|file| files.iter().find(|(p, _, _)| p == file));
        if let Some((_, content, _)) = resolved {
            return respond(200, content.clone(), pin);
        }
    }
    respond(404, b"{\"error\":\"Entry not found\"}".to_vec(), "")
}

/// Evidence vouches only for files nobody else can write: a writer holding a file mapped
/// writable and shared could change its bytes without changing its size or times. A
/// group-writable file is refused by verify, and a directory of the artifact made writable
/// after verification is refused by run, each naming the object and the fix.
#[test]
fn evidence_refuses_files_and_directories_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64"
    );
    let out = dir.path().join("packed");
    let out_s = out.to_str().unwrap();
    let (code, err) = minirun(&["pack", "--source", source, "--out", out_s]);
    assert_eq!(code, Some(0), "{err}");
    let container = fs::read_dir(out.join("layer00"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| !p.ends_with("manifest.json"))
        .unwrap();
    mode(&container, 0o664);
    let (code, err) = minirun(&["verify", out_s]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("can be written by its group (mode 0664)") && err.contains("chmod go-w"),
        "{err}"
    );
    assert!(!out.join(".minirun/evidence.json").exists());

    mode(&container, 0o644);
    let (code, err) = minirun(&["verify", out_s]);
    assert_eq!(code, Some(0), "{err}");
    let run = ["run", out_s, "--prompt", "The", "--max-tokens", "1"];
    let (code, err) = minirun(&run);
    assert_eq!(code, Some(0), "{err}");
    // A directory's mode changes none of the files' identities: only this rule sees it.
    mode(&out.join("layer00"), 0o777);
    let (code, err) = minirun(&run);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("layer00/ can be written by its group and everyone (mode 0777)"),
        "{err}"
    );
    mode(&out.join("layer00"), 0o755);
    mode(&out, 0o770);
    let (code, err) = minirun(&run);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("the artifact directory"), "{err}");
}
