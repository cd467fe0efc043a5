//! `minirun run --guessed-layers`: a streamed run with room beyond its floor reads each layer's
//! likely experts before its router runs, says so in its plan and its figures, and computes the
//! resident run's logits bit for bit; 0 turns it off; what the flag cannot take is refused.

mod common;

use std::path::Path;

use common::{minirun, stderr};
use minirun_pack::synthetic_model::{SyntheticShape, write_synthetic_deepseek};

fn run_json(path: &str, extra: &[&str]) -> serde_json::Value {
    let args = [
        &[
            "run",
            path,
            "--prompt",
            "The clock",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--unverified",
            "--json",
        ][..],
        extra,
    ]
    .concat();
    let out = minirun(&args);
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn guessed_reads_keep_the_resident_logits_and_are_counted() {
    let checkpoint = tempfile::tempdir().unwrap();
    // 32 experts a layer, 4 a token: a layer held whole costs eight slot pools, so a budget two
    // slot pools past the deterministic floor holds none and leaves the cache room for a guess.
    let shape = SyntheticShape {
        hidden: 512,
        layers: 3,
        experts: 32,
        experts_per_token: 4,
        moe_intermediate: 512,
        vocab: 512,
        seed: 7,
    };
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    write_synthetic_deepseek(checkpoint.path(), &shape, &tokenizer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let source = checkpoint.path().to_str().unwrap();
    let out = minirun(&["pack", "--source", source, "--out", path]);
    assert!(out.status.success(), "{}", stderr(&out));

    let resident = run_json(path, &["--budget", "generous"]);
    let floor = run_json(path, &["--budget", "floor"]);
    assert_eq!(floor["plan"]["guessed_layers"], 0, "no room at the floor");
    assert_eq!(floor["expert_guessed"], 0);
    let plan = &floor["plan"];
    let pool = plan["slot_pool_bytes"].as_u64().unwrap();
    let budget = (plan["deterministic_floor"].as_u64().unwrap() + 2 * pool).to_string();

    let guessing = run_json(path, &["--budget", &budget]);
    assert_eq!(guessing["plan"]["held_layers"], serde_json::json!([]));
    assert_eq!(guessing["plan"]["guessed_layers"], 1);
    assert!(guessing["expert_guessed"].as_u64().unwrap() > 0);
    assert!(guessing["expert_guess_hits"].as_u64().unwrap() > 0);
    assert!(
        guessing["expert_guess_hits"].as_u64() <= guessing["expert_guessed"].as_u64(),
        "{guessing}"
    );
    assert_eq!(guessing["logits_sha256"], resident["logits_sha256"]);

    let off = run_json(path, &["--budget", &budget, "--guessed-layers", "0"]);
    assert_eq!(off["plan"]["guessed_layers"], 0);
    assert_eq!(off["expert_guessed"], 0);
    assert_eq!(off["expert_guess_wasted_bytes"], 0);
    assert_eq!(off["logits_sha256"], resident["logits_sha256"]);
    // Its guess pool went back to the cache.
    assert_eq!(
        off["plan"]["cache_bytes"].as_u64().unwrap(),
        guessing["plan"]["cache_bytes"].as_u64().unwrap() + pool
    );

    let refused = minirun(&["run", path, "--prompt", "x", "--guessed-layers", "3"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("--guessed-layers"),
        "{}",
        stderr(&refused)
    );
}
