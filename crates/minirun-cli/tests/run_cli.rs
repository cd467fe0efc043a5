//! `minirun run` end to end: pack a tiny DeepSeek-V3 checkpoint, refuse it without evidence,
//! mark every header line of an unverified run, and after `minirun verify` generate exactly
//! mlx-lm's greedy continuation (recorded in the fixture's oracle.json).

mod common;

use std::path::Path;

use common::{fixture, minirun, packed, stderr};
use minirun_synth::tiny_models::{SyntheticShape, write_synthetic_deepseek};

#[test]
fn an_artifact_without_evidence_is_refused_and_unverified_runs_say_so_on_every_header_line() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["run", path, "--prompt", "The clock", "--max-tokens", "4"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("no verification evidence") && err.contains("minirun verify"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing is generated");

    let out = minirun(&[
        "run",
        path,
        "--prompt",
        "The clock",
        "--max-tokens",
        "4",
        "--unverified",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let header: Vec<&str> = err
        .lines()
        .take_while(|l| !l.contains("tokens/s"))
        .collect();
    assert!(header.len() >= 4, "{err}");
    assert!(
        header.iter().all(|l| l.starts_with("[UNVERIFIED] ")),
        "{err}"
    );
    assert!(
        err.contains("tokens/s") && err.contains("bytes of weights read per token"),
        "{err}"
    );
}

#[test]
fn a_verified_run_generates_mlx_lms_greedy_continuation_and_reports_figures_as_json() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["verify", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let prompt = &oracle["prompts"][0];
    let text = prompt["text"].as_str().unwrap();
    let out = minirun(&[
        "run",
        path,
        "--prompt",
        text,
        "--max-tokens",
        "32",
        "--ignore-eos",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["prompt_token_ids"], prompt["token_ids"]);
    assert_eq!(report["generated_token_ids"], prompt["greedy_32"]);
    assert_eq!(report["verified"], true);
    assert_eq!(report["generated_tokens"], 32);
    assert!(report["tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(report["weight_bytes_per_token"].as_u64().unwrap() > 0);
    assert!(report["text"].is_string());
    assert_eq!(report["activations"], "f32");

    // 8-bit activations: said in the report and in the header, a different arithmetic.
    let int8 = |json: bool| {
        let mut args = vec![
            "run",
            path,
            "--prompt",
            text,
            "--max-tokens",
            "32",
            "--ignore-eos",
            "--activations",
            "int8",
        ];
        if json {
            args.push("--json");
        }
        minirun(&args)
    };
    let out = int8(true);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["activations"], "int8");
    assert_eq!(report["generated_tokens"], 32);
    let out = int8(false);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("8-bit activations"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_payload_file_changed_after_verification_is_refused() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    assert!(minirun(&["verify", path]).status.success());
    let blob = dir.path().join("layer01/layer01-plain.blob");
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let out = minirun(&["run", path, "--prompt", "x", "--max-tokens", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("changed since it was verified") && err.contains("minirun verify"),
        "{err}"
    );
}

#[test]
fn bad_sampling_options_are_refused_before_loading() {
    let out = minirun(&["run", "/nonexistent", "--prompt", "x", "--top-p", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--top-p"), "{}", stderr(&out));
}

/// What `run` streams is exactly the text `--json` reports for the same greedy generation.
#[test]
fn streamed_text_equals_the_json_text() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let args = [
        "run",
        path,
        "--prompt",
        "The clockmaker opened",
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--unverified",
    ];
    let streamed = minirun(&args);
    assert!(streamed.status.success(), "{}", stderr(&streamed));
    let json = minirun(&[&args[..], &["--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let text = report["text"].as_str().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout),
        format!("{text}\n")
    );
    assert_eq!(report["stop_reason"], "max_tokens");
}

/// `--budget floor` streams the routed experts and generates the resident run's continuation;
/// below the floor the run is refused naming each term; `--trace` writes one line per step.
#[test]
fn a_run_at_the_floor_streams_and_equals_the_resident_run() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let args = [
        "run",
        path,
        "--prompt",
        "The clockmaker opened",
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--unverified",
        "--json",
    ];
    let resident = minirun(&args);
    assert!(resident.status.success(), "{}", stderr(&resident));
    let resident: serde_json::Value = serde_json::from_slice(&resident.stdout).unwrap();
    assert_eq!(resident["plan"]["mode"], "resident");

    let floor = minirun(
        &[
            &args[..],
            &["--budget", "floor", "--trace", trace.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(floor.status.success(), "{}", stderr(&floor));
    let floor: serde_json::Value = serde_json::from_slice(&floor.stdout).unwrap();
    assert_eq!(floor["plan"]["mode"], "streamed");
    assert_eq!(
        floor["generated_token_ids"],
        resident["generated_token_ids"]
    );
    assert_eq!(floor["logits_sha256"], resident["logits_sha256"]);
    assert_eq!(floor["logits_sha256"].as_str().map(str::len), Some(64));
    // The embedding and the logits take part of a step, never all of it.
    for run in [&floor, &resident] {
        let outside = run["decode_outside_layers_seconds"].as_f64().unwrap();
        assert!(outside > 0.0 && outside < run["decode_seconds"].as_f64().unwrap());
    }
    assert_eq!(
        floor["expert_read_bytes_per_token"],
        floor["plan"]["uncached_read_per_token"]
    );
    assert_eq!(floor["expert_cache_hits"], 0);
    let steps = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(steps.lines().count(), 15, "one line per decode step");
    let first: serde_json::Value = serde_json::from_str(steps.lines().next().unwrap()).unwrap();
    assert!(first["expert_read_bytes"].as_u64().unwrap() > 0);

    let too_small = minirun(&[
        "run",
        path,
        "--prompt",
        "x",
        "--unverified",
        "--budget",
        "1MB",
    ]);
    assert_eq!(too_small.status.code(), Some(1));
    let err = stderr(&too_small);
    for term in [
        "below this run's floor",
        "resident weights",
        "slot pool",
        "reserve",
    ] {
        assert!(err.contains(term), "{term}: {err}");
    }
    assert!(too_small.stdout.is_empty());
}

/// Kimi K3 (the published quantization: only the routed experts 4-bit) packs, verifies and
/// runs; at the floor its routed experts stream with the resident run's tokens.
#[test]
fn a_kimi_k3_artifact_runs_verified_and_streams_at_the_floor() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/kimi-k3/mlx-k3mix");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["pack", "--source", source.to_str().unwrap(), "--out", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = minirun(&["verify", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let args = [
        "run",
        path,
        "--prompt",
        "The clockmaker opened",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ];
    let shown = minirun(&args);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(
        stderr(&shown).contains("kimi_k3: 6 layers (4 KDA, 2 MLA)"),
        "{}",
        stderr(&shown)
    );
    let resident = minirun(&[&args[..], &["--json"]].concat());
    let resident: serde_json::Value = serde_json::from_slice(&resident.stdout).unwrap();
    assert_eq!(resident["plan"]["mode"], "resident");
    let floor = minirun(&[&args[..], &["--json", "--budget", "floor"]].concat());
    assert!(floor.status.success(), "{}", stderr(&floor));
    let floor: serde_json::Value = serde_json::from_slice(&floor.stdout).unwrap();
    assert_eq!(floor["plan"]["mode"], "streamed");
    assert_eq!(floor["generated_tokens"], 12);
    assert_eq!(
        floor["generated_token_ids"],
        resident["generated_token_ids"]
    );
    assert_eq!(floor["logits_sha256"], resident["logits_sha256"]);
    assert_eq!(floor["logits_sha256"].as_str().map(str::len), Some(64));
    assert_eq!(
        floor["expert_read_bytes_per_token"],
        floor["plan"]["uncached_read_per_token"]
    );
}

/// DeepSeek V4 from DeepSeek's own storage (FP8 block scales, FP4 experts): packed, verified
/// and run, resident and at the floor with the same tokens, which are transformers' greedy
/// continuation of the prompt.
#[test]
fn a_deepseek_v4_artifact_runs_verified_and_streams_at_the_floor() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v4/tiny-fp8-fp4");
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("oracle.json")).unwrap()).unwrap();
    let sentence = &oracle["prompts"][0];
    assert_eq!(sentence["name"], "sentence");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["pack", "--source", source.to_str().unwrap(), "--out", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = minirun(&["verify", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let args = [
        "run",
        path,
        "--prompt",
        "The clockmaker opened the map by the sea.",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ];
    let shown = minirun(&args);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(
        stderr(&shown).contains("deepseek_v4: 5 layers"),
        "{}",
        stderr(&shown)
    );
    let args = [&args[..], &["--json"]].concat();
    let resident = minirun(&args);
    let resident: serde_json::Value = serde_json::from_slice(&resident.stdout).unwrap();
    assert_eq!(resident["plan"]["mode"], "resident");
    let greedy: Vec<serde_json::Value> = sentence["greedy_32"].as_array().unwrap()[..12].to_vec();
    assert_eq!(
        resident["generated_token_ids"],
        serde_json::Value::Array(greedy)
    );
    let floor = minirun(&[&args[..], &["--budget", "floor"]].concat());
    assert!(floor.status.success(), "{}", stderr(&floor));
    let floor: serde_json::Value = serde_json::from_slice(&floor.stdout).unwrap();
    assert_eq!(floor["plan"]["mode"], "streamed");
    assert_eq!(
        floor["generated_token_ids"],
        resident["generated_token_ids"]
    );
    assert_eq!(floor["logits_sha256"], resident["logits_sha256"]);
    assert_eq!(floor["logits_sha256"].as_str().map(str::len), Some(64));
    assert_eq!(
        floor["expert_read_bytes_per_token"],
        floor["plan"]["uncached_read_per_token"]
    );
}

#[test]
fn run_help_names_every_architecture_the_registry_runs() {
    let out = minirun(&["run", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for row in minirun_runtime::registry::ARCHITECTURES {
        assert!(
            help.contains(row.model_type),
            "`minirun run --help` does not name {}",
            row.model_type
        );
    }
}

/// `minirun run PATH` of 8 tokens with `extra`, as JSON.
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

/// A synthetic DeepSeek-V3-shaped checkpoint of `shape`, packed by `minirun pack`.
fn packed_synthetic_deepseek(shape: &SyntheticShape) -> tempfile::TempDir {
    let checkpoint = tempfile::tempdir().unwrap();
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    write_synthetic_deepseek(checkpoint.path(), shape, &tokenizer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let source = checkpoint.path().to_str().unwrap();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["pack", "--source", source, "--out", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    dir
}

/// `--stream-every-layer` at a budget that holds every layer (the deterministic floor): each
/// layer still streams, at the streaming floor, as the plan and the figures say, with the
/// resident run's logits, and the rest of the budget goes to what the ranking holds and the
/// cache; a budget below the streaming floor is refused, naming the layer buffers.
#[test]
fn stream_every_layer_streams_layers_the_budget_would_hold() {
    let shape = SyntheticShape {
        hidden: 512,
        layers: 3,
        experts: 8,
        experts_per_token: 2,
        moe_intermediate: 512,
        vocab: 512,
        seed: 11,
    };
    let dir = packed_synthetic_deepseek(&shape);
    let path = dir.path().to_str().unwrap();
    let bytes = |run: &serde_json::Value, field: &str| run["plan"][field].as_u64().unwrap();

    let resident = run_json(path, &["--budget", "generous"]);
    let at_floor = run_json(path, &["--budget", "floor"]);
    let holds_all = bytes(&at_floor, "deterministic_floor").to_string();
    let holding = run_json(path, &["--budget", &holds_all]);
    assert_eq!(holding["plan"]["streamed_layers"], serde_json::json!([]));
    assert_eq!(holding["plan"]["layers"], "hold_what_fits");
    assert_eq!(holding["layer_read_bytes_per_token"], 0);

    let every = run_json(path, &["--budget", &holds_all, "--stream-every-layer"]);
    assert_eq!(every["plan"]["layers"], "stream_every");
    let all = serde_json::json!([0, 1, 2]);
    assert_eq!(every["plan"]["streamed_layers"], all);
    assert_eq!(bytes(&every, "floor"), bytes(&at_floor, "floor"), "{every}");
    let per_token = bytes(&every, "layer_read_per_token");
    assert!(per_token > 0);
    assert_eq!(every["layer_read_bytes_per_token"], per_token);
    assert_eq!(every["logits_sha256"], resident["logits_sha256"]);

    let below = (bytes(&every, "floor") - 1).to_string();
    let args = [
        "run",
        path,
        "--prompt",
        "x",
        "--unverified",
        "--budget",
        &below,
    ];
    let refused = minirun(&[&args[..], &["--stream-every-layer"]].concat());
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("layer buffers"),
        "{}",
        stderr(&refused)
    );
}

/// `--guessed-layers`: a streamed run with room beyond its floor reads each layer's likely
/// experts before its router runs, says so in its plan and its figures, and computes the
/// resident run's logits bit for bit; 0 turns it off and gives the guess's pool back to the
/// cache; what the flag cannot take is refused.
#[test]
fn guessed_reads_keep_the_resident_logits_and_are_counted() {
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
    let dir = packed_synthetic_deepseek(&shape);
    let path = dir.path().to_str().unwrap();

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
