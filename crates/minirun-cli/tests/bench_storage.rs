//! `minirun bench storage`: a table (or JSON) of throughput and latency percentiles at queue
//! depths 1 to 8, through the streaming reader; refused settings and empty folders are named.

use std::process::Command;

/// `minirun` with a calibration store of this test's own (a measurement is kept as its
/// device's calibration: never in the user's).
fn minirun(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        .env(
            "XDG_STATE_HOME",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench_storage-state"),
        )
        .args(args)
        .output()
        .expect("minirun runs")
}

#[test]
fn storage_is_measured_at_every_queue_depth() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("layer00")).unwrap();
    std::fs::write(dir.path().join("layer00/w.tile"), vec![7u8; 1 << 20]).unwrap();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&[
        "bench",
        "storage",
        path,
        "--read-size",
        "64KiB",
        "--seconds",
        "0.05",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let depths = doc["depths"].as_array().unwrap();
    assert_eq!(depths.len(), 8);
    for (i, d) in depths.iter().enumerate() {
        assert_eq!(d["queue_depth"], i + 1);
        assert!(d["reads"].as_u64().unwrap() > 0);
        assert!(d["p50_ms"].as_f64().unwrap() <= d["p99_ms"].as_f64().unwrap());
    }
    assert_eq!(doc["files"], 1);
    assert_eq!(doc["buffers"], 1);

    let rotating = minirun(&[
        "bench",
        "storage",
        path,
        "--read-size",
        "64KiB",
        "--seconds",
        "0.05",
        "--buffers",
        "5",
        "--json",
    ]);
    assert!(rotating.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&rotating.stdout).unwrap();
    assert_eq!(doc["buffers"], 5);
    assert!(doc["depths"][0]["reads"].as_u64().unwrap() > 0);
    let huge = minirun(&[
        "bench",
        "storage",
        path,
        "--buffers",
        "4096",
        "--read-size",
        "64GiB",
    ]);
    assert_eq!(huge.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&huge.stderr).contains("fewer --buffers"));

    let odd = minirun(&["bench", "storage", path, "--read-size", "1000"]);
    assert_eq!(odd.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&odd.stderr).contains("16 KiB"));
    let empty = tempfile::tempdir().unwrap();
    let none = minirun(&["bench", "storage", empty.path().to_str().unwrap()]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no file"));
}

/// `--engine both` measures io_uring reads beside the threads' at every depth (where the
/// filesystem takes `O_DIRECT` and the kernel io_uring), and only the threads' figures can become
/// the device's calibration.
#[test]
fn io_uring_reads_are_measured_beside_the_threads() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::write(dir.path().join("w.tile"), vec![7u8; 1 << 20]).unwrap();
    let path = dir.path().to_str().unwrap();
    let args = [
        "bench",
        "storage",
        path,
        "--read-size",
        "64KiB",
        "--seconds",
        "0.05",
    ];
    let many = minirun(&[&args[..], &["--engine", "both", "--buffers", "200"]].concat());
    assert_eq!(many.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&many.stderr).contains("--buffers 128 or fewer"));
    let both = minirun(&[&args[..], &["--engine", "both", "--no-save", "--json"]].concat());
    let stderr = String::from_utf8_lossy(&both.stderr);
    if stderr.contains("does not take") || stderr.contains("io_uring is not available") {
        // Refused, with the engine that works named: this filesystem or kernel cannot do it.
        assert_eq!(both.status.code(), Some(1));
        assert!(stderr.contains("--engine threads") || stderr.contains("threads instead"));
        return;
    }
    assert!(both.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&both.stdout).unwrap();
    for engine in ["depths", "io_uring_depths"] {
        let depths = doc[engine].as_array().unwrap();
        assert_eq!(depths.len(), 8, "{engine}");
        for (i, d) in depths.iter().enumerate() {
            assert_eq!(d["queue_depth"], i + 1, "{engine}");
            assert!(d["reads"].as_u64().unwrap() > 0, "{engine}");
            assert_eq!(d["bytes"], d["reads"].as_u64().unwrap() * 65536, "{engine}");
        }
    }
    let threads = minirun(&[&args[..], &["--no-save", "--json"]].concat());
    let doc: serde_json::Value = serde_json::from_slice(&threads.stdout).unwrap();
    assert!(doc["io_uring_depths"].is_null(), "threads alone by default");

    let ring = minirun(&[&args[..], &["--engine", "io-uring", "--json"]].concat());
    assert!(ring.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&ring.stdout).unwrap();
    assert_eq!(doc["depths"].as_array().unwrap().len(), 0);
    assert!(
        doc["calibration"].is_null(),
        "io_uring figures are not a calibration"
    );
    assert!(doc["warnings"].to_string().contains("reads with threads"));
}
