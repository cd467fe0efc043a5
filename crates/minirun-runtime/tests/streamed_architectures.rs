//! Every architecture streamed as `minirun run` streams it, from one table: each row is a
//! checkpoint (a fixture, or a generated one large enough that its layers stream), a prompt, and
//! what the plan must say at the floor. For each: planning reads no payload byte; the floor
//! streams the row's layers and its routed experts, the deterministic floor holds every layer;
//! at both, and at the floor with the embedding and the head read by rows too (the head in
//! several tiles), on 1 and 2 threads, with read-ahead on and off, the logits have the resident
//! run's bits and the step reads exactly the plan's bytes (`common::assert_streams_as_planned`);
//! experts read ahead on a guess keep the bits (`common::assert_guesses_keep_the_bits`); a budget
//! a byte below the floor is refused. (DeepSeek-V3's own streaming tests, at every budget, are in
//! `tests/streaming.rs`; the dense models' in `tests/llama_oracle.rs`.)

mod common;

use common::{data, greedy_bits, ids, packed_from};
use minirun_runtime::{Session, SessionError, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::plan::{Layers, Mode, Plan, PlanError};
use minirun_stream::tables::TableUse;
use minirun_synth::tiny_models::{SyntheticArchitecture, SyntheticShape};
use serde_json::Value;

/// One checkpoint streamed, and what its plans must say.
struct Row {
    label: &'static str,
    /// The packed artifact and the prompt.
    artifact: fn() -> (tempfile::TempDir, Vec<u32>),
    /// How the session describes the model (the start of its header line).
    described: &'static str,
    context: usize,
    steps: usize,
    moe_layers: usize,
    streamed_at_floor: &'static [usize],
    /// Whether the floor reads the embedding by rows (where its read buffers take less than
    /// holding it).
    embedding_stored_at_floor: bool,
    /// `(read-ahead, threads)` of the floor's runs (the deterministic floor's runs with
    /// read-ahead on 2 threads); a slow unoptimised model runs fewer.
    floor_runs: &'static [(bool, usize)],
}

const EVERY_RUN: &[(bool, usize)] = &[(true, 1), (true, 2), (false, 2)];

fn oracle(path: &str) -> Value {
    common::json_file(&data(path).join("oracle.json"))
}

/// The fixture at `path` packed, and the token ids of its oracle's prompt `prompt`.
fn fixture_and_prompt(path: &str, prompt: usize) -> (tempfile::TempDir, Vec<u32>) {
    let ids = ids(&oracle(path)["prompts"][prompt]["token_ids"]);
    (packed_from(&data(path)), ids)
}

/// A fixed 24-token prompt for the generated checkpoints.
fn generated_prompt() -> Vec<u32> {
    (0..24).map(|i| (i * 37 + 5) % 512).collect()
}

fn check(row: &Row) {
    let (dir, prompt) = (row.artifact)();
    let label = row.label;
    let fresh = Session::open(dir.path(), Trust::Unverified).unwrap();
    fresh.plan(Budget::Floor, row.context).unwrap();
    assert_eq!(
        fresh.artifact.payload_bytes(),
        0,
        "{label}: planning read payload"
    );
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let header = session.header();
    assert!(
        header.iter().any(|l| l.starts_with(row.described)),
        "{label}: {header:?}"
    );
    let resident = session.model().unwrap();
    let (resident_bits, _) = greedy_bits(&resident, &prompt, row.steps);
    let (floor, weights) = session.plan(Budget::Floor, row.context).unwrap();
    assert_eq!(floor.mode, Mode::Streamed, "{label}");
    assert_eq!(floor.streamed_layers, row.streamed_at_floor, "{label}");
    assert_eq!(floor.moe_layers, row.moe_layers, "{label}");
    let embedding_stored = floor
        .tables
        .iter()
        .any(|t| t.stored && t.used_as == TableUse::Embedding);
    assert_eq!(embedding_stored, row.embedding_stored_at_floor, "{label}");
    assert_eq!(
        floor.cache_bytes, 0,
        "{label}: the floor holds no expert cache"
    );
    let experts_only = session
        .plan_for(
            &weights,
            (
                Budget::Bytes(floor.deterministic_floor),
                Layers::HoldWhatFits,
            ),
            row.context,
        )
        .unwrap();
    assert!(experts_only.streamed_layers.is_empty(), "{label}");
    assert_eq!(experts_only.mode, Mode::Streamed, "{label}");
    let tables = tables_streamed(&floor);
    let runs = row.floor_runs.iter().map(|&run| (&floor, run));
    let tables_runs = row.floor_runs.iter().map(|&run| (&tables, run));
    let runs: Vec<(&Plan, (bool, usize))> = runs
        .chain(tables_runs)
        .chain([(&experts_only, (true, 2))])
        .collect();
    for (plan, read_ahead_and_threads) in runs {
        common::assert_streams_as_planned(
            &session,
            plan,
            &weights,
            read_ahead_and_threads,
            (&prompt, row.steps),
            &resident_bits,
            label,
        );
    }
    common::assert_guesses_keep_the_bits(
        &session,
        (&floor, &experts_only),
        &weights,
        (&prompt, row.steps),
        &resident_bits,
        label,
    );
    let Err(SessionError::Plan(PlanError::BelowFloor(_))) =
        session.plan(Budget::Bytes(floor.floor - 1), row.context)
    else {
        panic!("{label}: a budget below the floor was planned");
    };
}

/// The floor's plan with every table read by rows from storage (the embedding a row a token,
/// the head in tiles of about a fifth of it, the last one shorter), the layers and experts
/// streamed as at the floor: what a model whose tables are larger than its tiles streams.
fn tables_streamed(floor: &Plan) -> Plan {
    let mut plan = floor.clone();
    let largest = plan.tables.iter().map(|t| t.resident_bytes).max();
    plan.table_tile_bytes = largest.unwrap_or(0) / 5 + 1;
    plan.table_read_per_token = 0;
    for table in plan.tables.iter_mut().filter(|t| t.by_rows) {
        table.stored = true;
        plan.table_read_per_token += table.read_per_token;
    }
    assert!(
        plan.tables
            .iter()
            .any(|t| t.stored && t.used_as != TableUse::Embedding),
        "a head is read by rows"
    );
    plan
}

/// Enough layers that at the floor every layer's attention and router stream too (two layers'
/// aligned buffers cost less than holding all eight).
const GENERATED: SyntheticShape = SyntheticShape {
    hidden: 512,
    layers: 8,
    experts: 16,
    experts_per_token: 4,
    moe_intermediate: 512,
    vocab: 512,
    seed: 13,
};

/// The tiny fixture holds its layers at the floor (16 KiB-aligned buffers for two of its small
/// layers cost more than holding all four) and streams its experts.
#[test]
fn qwen3_moe_fixture() {
    check(&Row {
        label: "qwen3_moe fixture",
        artifact: || fixture_and_prompt("qwen3-moe/mlx-affine4-g64", 0),
        described: "qwen3_moe: 4 layers (3 sparse)",
        context: 64,
        steps: 12,
        moe_layers: 3,
        streamed_at_floor: &[0, 1, 2, 3],
        embedding_stored_at_floor: false,
        floor_runs: EVERY_RUN,
    });
}

#[test]
fn qwen3_moe_generated() {
    check(&Row {
        label: "qwen3_moe generated",
        artifact: || {
            let dir = common::packed_synthetic_of(&GENERATED, SyntheticArchitecture::Qwen3Moe);
            (dir, generated_prompt())
        },
        described: "qwen3_moe: 8 layers (8 sparse)",
        context: 64,
        steps: 12,
        moe_layers: 8,
        streamed_at_floor: &[0, 1, 2, 3, 4, 5, 6, 7],
        embedding_stored_at_floor: true,
        floor_runs: EVERY_RUN,
    });
}

/// OpenAI's layout (MXFP4 `_blocks` and `_scales`, fused gate-up, biases): every layer streams
/// at the floor.
#[test]
fn gpt_oss_openai_layout() {
    check(&Row {
        label: "gpt_oss openai-mxfp4",
        artifact: || fixture_and_prompt("gpt-oss/openai-mxfp4", 3),
        described: "gpt_oss: 4 layers (2 with a 8-position window)",
        context: 128,
        steps: 12,
        moe_layers: 4,
        streamed_at_floor: &[0, 1, 2, 3],
        embedding_stored_at_floor: true,
        floor_runs: EVERY_RUN,
    });
}

#[test]
fn gpt_oss_mlx_layout() {
    check(&Row {
        label: "gpt_oss mlx-mxfp4",
        artifact: || fixture_and_prompt("gpt-oss/mlx-mxfp4", 3),
        described: "gpt_oss: 4 layers (2 with a 8-position window)",
        context: 128,
        steps: 12,
        moe_layers: 4,
        streamed_at_floor: &[0, 1, 2, 3],
        embedding_stored_at_floor: false,
        floor_runs: EVERY_RUN,
    });
}

#[test]
fn gpt_oss_generated() {
    check(&Row {
        label: "gpt_oss generated",
        artifact: || {
            let dir = common::packed_synthetic_of(&GENERATED, SyntheticArchitecture::GptOss);
            (dir, generated_prompt())
        },
        described: "gpt_oss: 8 layers (4 with a 8-position window)",
        context: 128,
        steps: 12,
        moe_layers: 8,
        streamed_at_floor: &[0, 1, 2, 3, 4, 5, 6, 7],
        embedding_stored_at_floor: true,
        floor_runs: EVERY_RUN,
    });
}

/// The published layout's quantization (only the routed experts 4-bit), under mlx-lm's names:
/// at the floor every layer's attention, router and shared experts stream too.
#[test]
fn kimi_k3_mlx_names() {
    check(&Row {
        label: "kimi_k3 mlx-k3mix",
        artifact: || kimi_k3("mlx-k3mix"),
        described: "kimi_k3: 6 layers",
        context: 64,
        steps: 12,
        moe_layers: 5,
        streamed_at_floor: &[0, 1, 2, 3, 4, 5],
        embedding_stored_at_floor: true,
        floor_runs: EVERY_RUN,
    });
}

/// The same under the upstream names (per-expert tensors, separate q/k/v).
#[test]
fn kimi_k3_upstream_names() {
    check(&Row {
        label: "kimi_k3 hf-k3mix",
        artifact: || kimi_k3("hf-k3mix"),
        described: "kimi_k3: 6 layers",
        context: 64,
        steps: 12,
        moe_layers: 5,
        streamed_at_floor: &[0, 1, 2, 3, 4, 5],
        embedding_stored_at_floor: true,
        floor_runs: EVERY_RUN,
    });
}

fn kimi_k3(variant: &str) -> (tempfile::TempDir, Vec<u32>) {
    let path = format!("kimi-k3/{variant}");
    let prompt = ids(&oracle(&path)["prompt_token_ids"]);
    (packed_from(&data(&path)), prompt)
}

/// The fixture's layers are too small for streaming them to save memory (16 KiB-aligned
/// buffers for 8 KiB matrices), so at the floor only its routed experts stream.
#[test]
fn deepseek_v4_fixture() {
    check(&Row {
        label: "deepseek_v4 fixture",
        artifact: || {
            let path = "deepseek-v4/tiny-fp8-fp4";
            let entry = oracle(path)["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "ids")
                .unwrap()
                .clone();
            (packed_from(&data(path)), ids(&entry["token_ids"]))
        },
        described: "deepseek_v4: 5 layers",
        context: 128,
        steps: 12,
        moe_layers: 5,
        streamed_at_floor: &[0, 1, 2, 3, 4],
        embedding_stored_at_floor: true,
        floor_runs: &[(true, 1), (false, 2)],
    });
}

/// A wider V4 (hidden 256, 8 heads of 128, q_lora 512, experts of 512, random weights in
/// DeepSeek's storage): at the floor every layer's attention, compressors, indexer, router and
/// shared expert stream too. Past a CSA window and an HCA window in few steps: the test runs
/// unoptimised.
#[test]
fn deepseek_v4_wide() {
    check(&Row {
        label: "deepseek_v4 wide",
        artifact: || {
            let checkpoint = tempfile::tempdir().unwrap();
            let tiny = data("deepseek-v4/tiny-fp8-fp4");
            common::wide_v4::write(checkpoint.path(), &tiny, &common::wide_v4::WIDE);
            let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 512).collect();
            (packed_from(checkpoint.path()), prompt)
        },
        described: "deepseek_v4: 5 layers",
        context: 128,
        steps: 3,
        moe_layers: 5,
        streamed_at_floor: &[0, 1, 2, 3, 4],
        embedding_stored_at_floor: true,
        floor_runs: &[(true, 1), (false, 2)],
    });
}
