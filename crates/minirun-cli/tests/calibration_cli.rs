//! The memory dial's projection: `minirun bench storage` keeps its best rate as the calibration
//! of the device it measured, `--show` lists it, and a streamed `minirun run` of an artifact on
//! that device projects its reads per token from it; without a calibration it projects none.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{packed, stderr};

fn minirun_with_state(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minirun"))
        .env("XDG_STATE_HOME", state)
        .args(args)
        .output()
        .expect("minirun runs")
}

/// `minirun run` of two tokens, unverified, with `extra` arguments.
fn run(state: &Path, artifact: &str, extra: &[&str]) -> Output {
    let args = [
        "run",
        artifact,
        "--prompt",
        "The clock",
        "--max-tokens",
        "2",
        "--unverified",
    ];
    let out = minirun_with_state(state, &[&args[..], extra].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

fn run_json(state: &Path, artifact: &str, budget: &[&str]) -> serde_json::Value {
    let out = run(state, artifact, &[budget, &["--json"]].concat());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_measured_device_gives_streamed_runs_a_projection_and_an_unmeasured_one_none() {
    let artifact = packed();
    let path = artifact.path().to_str().unwrap();
    let state = tempfile::tempdir().unwrap();

    let none = run_json(state.path(), path, &["--budget", "floor"]);
    assert_eq!(none["plan"]["mode"], "streamed");
    assert!(none["projected_read_seconds_per_token"].is_null());
    assert!(none["storage_calibration"].is_null());
    let shown = minirun_with_state(state.path(), &["bench", "storage", "--show"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(String::from_utf8_lossy(&shown.stdout).contains("no storage calibrated yet"));

    let bench = minirun_with_state(
        state.path(),
        &[
            "bench",
            "storage",
            path,
            "--read-size",
            "16KiB",
            "--seconds",
            "0.05",
            "--json",
        ],
    );
    assert!(bench.status.success(), "{}", stderr(&bench));
    let bench: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    if bench["direct"] != true {
        // Through the page cache a figure describes memory: nothing is kept.
        assert!(bench["calibration"].is_null());
        eprintln!(
            "NOT EXERCISED: O_DIRECT is unavailable under the temporary folder, so no calibration is kept to project from"
        );
        return;
    }
    let kept = &bench["calibration"];
    let best = bench["depths"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            let rate = |d: &serde_json::Value| d["gb_per_second"].as_f64().unwrap();
            rate(a).total_cmp(&rate(b))
        })
        .unwrap();
    assert_eq!(kept["queue_depth"], best["queue_depth"]);
    assert_eq!(kept["read_size"], 16384);
    let device = kept["device"].as_str().unwrap();

    let shown = minirun_with_state(state.path(), &["bench", "storage", "--show"]);
    let table = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(table.contains(device), "{table}");

    let projected = run_json(state.path(), path, &["--budget", "floor"]);
    let plan = &projected["plan"];
    let bytes = plan["uncached_read_per_token"].as_u64().unwrap()
        + plan["layer_read_per_token"].as_u64().unwrap();
    let rate = kept["bytes_per_second"].as_f64().unwrap();
    assert!(bytes > 0);
    // The bytes at the kept rate (serde_json reads a float back to within an ulp).
    let seconds = projected["projected_read_seconds_per_token"]
        .as_f64()
        .unwrap();
    let want = bytes as f64 / rate;
    assert!(
        (seconds - want).abs() <= want * 1e-12,
        "{seconds} vs {want}"
    );
    assert_eq!(
        projected["storage_calibration"]["queue_depth"],
        best["queue_depth"]
    );

    // The text header says the same, and a resident run projects nothing.
    let text = stderr(&run(state.path(), path, &["--budget", "floor"]));
    assert!(text.contains("projected reads:"), "{text}");
    let resident = run_json(state.path(), path, &[]);
    assert_eq!(resident["plan"]["mode"], "resident");
    assert!(resident["projected_read_seconds_per_token"].is_null());
}
