//! `minirun plan` end to end: the budgets it prints are the ones `minirun run` plans (the same
//! floor, the same bytes read a token), ascending from the floor to everything resident, a
//! verified plan needs evidence as a run does, and a context past the model's positions is
//! refused.

mod common;

use common::{minirun, packed, stderr};
use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let out = minirun(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_presets_planned_are_the_ones_a_run_plans() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let context = "64";
    let planned = json(&["plan", path, "--unverified", "--json", "--context", context]);
    assert_eq!(planned["context_tokens"], 64);
    let budgets = planned["budgets"].as_array().unwrap();
    let presets: Vec<&str> = budgets
        .iter()
        .map(|b| b["preset"].as_str().unwrap())
        .collect();
    assert_eq!(presets, ["floor", "balanced", "generous"]);
    let bytes: Vec<u64> = budgets
        .iter()
        .map(|b| b["budget_bytes"].as_u64().unwrap())
        .collect();
    assert!(bytes[0] < bytes[1] && bytes[1] < bytes[2], "{bytes:?}");
    assert_eq!(budgets[2]["plan"]["mode"], "resident");
    assert_eq!(budgets[2]["read_bytes_per_token"], 0);
    for budget in budgets {
        // Where the system says what is free, each preset says whether it fits; a resident
        // plan reads nothing, so it projects no read time.
        assert!(
            budget["fits_available_memory"].is_boolean()
                || planned["available_memory_bytes"].is_null(),
            "{budget}"
        );
    }
    assert!(budgets[2]["projected_read_seconds_per_token"].is_null());
    for (preset, planned) in presets.iter().zip(budgets) {
        // A run of prompt + generated tokens = the same context plans the same.
        let run = json(&[
            "run",
            path,
            "--prompt",
            "The",
            "--max-tokens",
            &(64 - 2).to_string(),
            "--ignore-eos",
            "--unverified",
            "--json",
            "--budget",
            preset,
        ]);
        let (plan, ran) = (&planned["plan"], &run["plan"]);
        assert_eq!(
            run["prompt_tokens"], 2,
            "the context above assumes a 2-token prompt"
        );
        for key in [
            "budget",
            "floor",
            "mode",
            "uncached_read_per_token",
            "layer_read_per_token",
        ] {
            assert_eq!(plan[key], ran[key], "{preset}: {key}");
        }
        if plan["mode"] == "streamed" {
            let reads = plan["uncached_read_per_token"].as_u64().unwrap()
                + plan["layer_read_per_token"].as_u64().unwrap();
            assert_eq!(planned["read_bytes_per_token"], reads, "{preset}");
        }
    }
}

#[test]
fn the_table_names_each_preset_and_what_fits_here() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["plan", path, "--unverified"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("deepseek_v3: 3 layers"), "{text}");
    for preset in ["floor ", "balanced ", "generous "] {
        assert!(
            text.lines().any(|l| l.starts_with(preset)),
            "{preset}: {text}"
        );
    }
    assert!(
        text.contains("fits now: floor, balanced, generous")
            || text.contains("does not say how much memory"),
        "{text}"
    );
}

#[test]
fn a_plan_needs_evidence_as_a_run_does_and_a_context_past_the_model_is_refused() {
    let dir = packed();
    let path = dir.path().to_str().unwrap();
    let out = minirun(&["verify", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let unverified = tempfile::tempdir().unwrap();
    let out = minirun(&[
        "pack",
        "--source",
        common::fixture().to_str().unwrap(),
        "--out",
        unverified.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = minirun(&["plan", unverified.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("minirun verify"), "{err}");
    let verified = json(&["plan", path, "--json"]);
    assert!(
        verified["provenance"]
            .as_str()
            .unwrap()
            .starts_with("verified"),
        "{verified}"
    );
    let out = minirun(&["plan", path, "--context", "1000000"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("max_position_embeddings"), "{err}");
}
