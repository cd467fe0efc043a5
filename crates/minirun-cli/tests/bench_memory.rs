//! `minirun bench memory`: the memory read rate on the pool's threads (JSON and table), and
//! sizes that would measure the caches instead, or that are not sizes, refused.

use std::process::{Command, Output};

fn minirun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        .args(args)
        .output()
        .expect("minirun runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn memory_is_read_in_timed_passes_on_the_pool_s_threads() {
    let args = [
        "bench",
        "memory",
        "--size",
        "8MiB",
        "-r",
        "4",
        "--threads",
        "2",
    ];
    let out = minirun(&[&args[..], &["--json"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["bytes_per_pass"], 8 << 20);
    assert_eq!(doc["threads"], 2);
    let seconds = doc["seconds"].as_array().unwrap();
    let rates = doc["bytes_per_second"].as_array().unwrap();
    assert_eq!((seconds.len(), rates.len()), (4, 4));
    for (s, r) in seconds.iter().zip(rates) {
        let (s, r) = (s.as_f64().unwrap(), r.as_f64().unwrap());
        assert!(s > 0.0, "{doc}");
        assert!((r - (8 << 20) as f64 / s).abs() <= 1e-9 * r, "{doc}");
    }
    // The figures are those of the passes: the mean of the two middle rates, and the largest.
    let mut sorted: Vec<f64> = rates.iter().map(|r| r.as_f64().unwrap()).collect();
    sorted.sort_by(f64::total_cmp);
    let median = doc["median_bytes_per_second"].as_f64().unwrap();
    let best = doc["best_bytes_per_second"].as_f64().unwrap();
    assert!(
        (median - (sorted[1] + sorted[2]) / 2.0).abs() <= 1e-9 * median,
        "{doc}"
    );
    assert_eq!(best, sorted[3], "{doc}");

    let table = minirun(&args);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("8.00 MiB read by 2 threads"), "{text}");
    assert!(text.contains("GB/s"), "{text}");
}

#[test]
fn sizes_that_measure_caches_or_are_not_sizes_are_refused() {
    // 1 MiB is the smallest size taken.
    let out = minirun(&["bench", "memory", "--size", "1MiB", "-r", "1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = minirun(&["bench", "memory", "--size", "1048575"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("too small"), "{}", stderr(&out));
    let out = minirun(&["bench", "memory", "--size", "64KiB"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("too small"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let out = minirun(&["bench", "memory", "--size", "floor"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not a preset"), "{}", stderr(&out));
}
