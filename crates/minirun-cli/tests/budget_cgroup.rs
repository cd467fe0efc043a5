//! A run of an artifact several times larger than its budget, at the floor, inside a memory
//! cgroup limited to the budget plus the documented process overhead: it must finish, its peak
//! resident set must stay within that bound, and its tokens must be the resident run's.
//! Where this process may not create a memory cgroup (no cgroup v1 memory controller or v2
//! `memory.max` writable), the cgroup half is skipped and says so; the RSS bound is still
//! asserted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use minirun_synth::tiny_models::{SyntheticShape, write_synthetic_deepseek};

/// What the process needs beyond its budget: the binary and its libraries, the tokenizer,
/// thread stacks and the allocator's slack (docs/runtime.md states the same figure).
const OVERHEAD: u64 = 64 << 20;

fn minirun() -> &'static str {
    env!("CARGO_BIN_EXE_minirun")
}

/// A fresh memory cgroup limited to `limit` bytes, if this process may make one.
fn memory_cgroup(limit: u64) -> Option<PathBuf> {
    let name = format!("minirun-test-{}", std::process::id());
    let v2 = Path::new("/sys/fs/cgroup");
    let (dir, file) = match std::fs::read_to_string(v2.join("cgroup.controllers")) {
        Ok(c) if c.contains("memory") => (v2.join(&name), "memory.max"),
        _ => (v2.join("memory").join(&name), "memory.limit_in_bytes"),
    };
    std::fs::create_dir(&dir).ok()?;
    if std::fs::write(dir.join(file), limit.to_string()).is_err() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

fn run_json(args: &[&str], cgroup: Option<&Path>) -> Output {
    let mut command = match cgroup {
        // The shell joins the cgroup, then becomes minirun: no unsafe pre_exec needed.
        Some(dir) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
                .arg(dir)
                .arg(minirun());
            c
        }
        None => Command::new(minirun()),
    };
    command.args(args).output().expect("minirun runs")
}

#[test]
fn a_floor_run_finishes_inside_a_cgroup_of_its_budget() {
    let checkpoint = tempfile::tempdir().unwrap();
    let shape = SyntheticShape {
        hidden: 512,
        layers: 5,
        experts: 32,
        experts_per_token: 4,
        moe_intermediate: 1024,
        vocab: 512,
        seed: 5,
    };
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    write_synthetic_deepseek(checkpoint.path(), &shape, &tokenizer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let pack = Command::new(minirun())
        .args([
            "pack",
            "--source",
            checkpoint.path().to_str().unwrap(),
            "--out",
            path,
        ])
        .output()
        .unwrap();
    assert!(
        pack.status.success(),
        "{}",
        String::from_utf8_lossy(&pack.stderr)
    );
    let args = |budget: &'static str| {
        vec![
            "run",
            path,
            "--prompt",
            "The clock",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--unverified",
            "--json",
            "--budget",
            budget,
        ]
    };
    let resident = run_json(&args("generous"), None);
    assert!(
        resident.status.success(),
        "{}",
        String::from_utf8_lossy(&resident.stderr)
    );
    let resident: serde_json::Value = serde_json::from_slice(&resident.stdout).unwrap();

    let probe = run_json(&args("floor"), None);
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let probe: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    let budget = probe["plan"]["budget"].as_u64().unwrap();
    let weights = probe["plan"]["everything"].as_u64().unwrap();
    assert!(weights > 3 * budget, "weights {weights}, budget {budget}");
    let peak = probe["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak <= budget + OVERHEAD,
        "peak RSS {peak} over {budget} + {OVERHEAD}"
    );
    assert_eq!(
        probe["generated_token_ids"],
        resident["generated_token_ids"]
    );

    let Some(cgroup) = memory_cgroup(budget + OVERHEAD) else {
        eprintln!("skipped the cgroup run: this process may not create a memory cgroup");
        return;
    };
    let limited = run_json(&args("floor"), Some(&cgroup));
    let _ = std::fs::remove_dir(&cgroup);
    assert!(
        limited.status.success(),
        "killed or failed inside a {} byte cgroup: {}",
        budget + OVERHEAD,
        String::from_utf8_lossy(&limited.stderr)
    );
    let limited: serde_json::Value = serde_json::from_slice(&limited.stdout).unwrap();
    assert_eq!(
        limited["generated_token_ids"],
        resident["generated_token_ids"]
    );
}
