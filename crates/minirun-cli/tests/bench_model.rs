//! `minirun bench model`: the prompt and decode tests of a packed artifact, timed after a
//! warm-up (JSON and table), resident and streamed under the floor budget, refused without
//! evidence unless --unverified, and refused when there is nothing to time or the tests need more
//! positions than the model has.

mod common;

use common::{minirun, packed, stderr};

/// `minirun bench model PATH --unverified ARGS`.
fn bench_unverified(path: &str, args: &[&str]) -> std::process::Output {
    minirun(&[&["bench", "model", path, "--unverified"], args].concat())
}

/// `minirun bench model PATH --unverified ARGS --json`, which must succeed: its JSON, and the
/// names of its tests.
fn bench_json(path: &str, args: &[&str]) -> (serde_json::Value, Vec<String>) {
    let out = bench_unverified(path, &[args, &["--json"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names = doc["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["test"].as_str().unwrap().to_string())
        .collect();
    (doc, names)
}

#[test]
fn prompt_and_decode_are_timed_per_pass() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    for activations in ["f32", "int8"] {
        let args = ["-p", "7", "-n", "5", "-r", "3", "--threads", "2"];
        let (doc, names) = bench_json(path, &[&args[..], &["--activations", activations]].concat());
        assert_eq!(doc["threads"], 2);
        assert_eq!(doc["activations"], activations);
        assert_eq!(doc["verified"], false);
        assert_eq!(names, ["pp7", "tg5"]);
        let tests = doc["tests"].as_array().unwrap();
        for t in tests {
            let seconds = t["seconds"].as_array().unwrap();
            let rates = t["tokens_per_second"].as_array().unwrap();
            assert_eq!((seconds.len(), rates.len()), (3, 3));
            let tokens = t["tokens"].as_f64().unwrap();
            let mut sum = 0.0;
            for (s, r) in seconds.iter().zip(rates) {
                let (s, r) = (s.as_f64().unwrap(), r.as_f64().unwrap());
                assert!(s > 0.0);
                assert!((r - tokens / s).abs() <= 1e-9 * r, "{t}");
                sum += r;
            }
            let mean = t["mean_tokens_per_second"].as_f64().unwrap();
            assert!((mean - sum / 3.0).abs() <= 1e-9 * mean, "{t}");
            let per_token = t["weight_bytes_per_token"].as_f64().unwrap();
            let per_second = t["weight_bytes_per_second"].as_f64().unwrap();
            assert!(per_token > 0.0, "{t}");
            assert!(
                (per_second - mean * per_token).abs() <= 1e-9 * per_second,
                "{t}"
            );
        }
        // A prompt's products read each weight once for all its tokens; a decode step reads
        // them for one.
        let per_token = |i: usize| tests[i]["weight_bytes_per_token"].as_u64().unwrap();
        assert!(per_token(0) < per_token(1), "{doc}");
    }

    let table = bench_unverified(path, &["-p", "4", "-n", "0", "-r", "1"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("| pp4 | "), "{text}");
    assert!(
        text.contains("| weights a token | weights read |"),
        "{text}"
    );
    assert!(!text.contains("| tg"), "-n 0 skips decoding: {text}");
    assert!(
        stderr(&table)
            .lines()
            .all(|l| l.starts_with("[UNVERIFIED] ")),
        "{}",
        stderr(&table)
    );
}

#[test]
fn a_streamed_run_is_timed_too() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let args = ["-p", "6", "-n", "4", "-r", "2", "--budget", "floor"];
    let (doc, names) = bench_json(path, &args);
    assert_eq!(doc["resident"], false, "{doc}");
    assert_eq!(names, ["pp6", "tg4"]);
}

#[test]
fn an_artifact_without_evidence_or_a_run_with_nothing_to_time_is_refused() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["bench", "model", path, "-p", "4", "-n", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("minirun verify"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());

    let out = bench_unverified(path, &["-p", "0", "-n", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("nothing to time"), "{}", stderr(&out));

    // Past the fixture's max_position_embeddings (256): refused before any pass runs.
    let out = bench_unverified(path, &["-p", "4", "-n", "257"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("max_position_embeddings (256)"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "no table is started");
}
