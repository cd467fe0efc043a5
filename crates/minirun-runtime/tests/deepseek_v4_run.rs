//! DeepSeek V4 as `minirun run` runs it: opened through a session (which reads the
//! architecture from config.json), generating transformers' greedy continuation; planned under
//! a budget, its routed experts (and below the deterministic floor, every layer's attention,
//! compressors, router and shared expert) streamed from storage with the resident run's logit
//! bits, on 1 and 2 threads, with read-ahead on and off, reading exactly the plan's bytes.

mod common;

use std::path::Path;

use common::greedy_bits;
use minirun_pack::{PackOptions, pack};
use minirun_runtime::budget::Budget;
use minirun_runtime::generate::Sampling;
use minirun_runtime::plan::{Mode, PlanError};
use minirun_runtime::session::{Session, SessionError, Trust};

const STEPS: usize = 12;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4/tiny-fp8-fp4")
}

fn packed() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    pack(&fixture(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

fn oracle_prompt(name: &str) -> (Vec<u32>, Vec<u32>) {
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let entry = oracle["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone();
    let ids = |key: &str| -> Vec<u32> {
        entry[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("token_ids"), ids("greedy_32"))
}

#[test]
fn the_session_generates_transformers_greedy_continuation() {
    let dir = packed();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    assert_eq!(session.architecture.model_type(), "deepseek_v4");
    let described = &session.header()[1];
    assert!(
        described.starts_with(
            "deepseek_v4: 5 layers (1 sliding-window, 2 compressed sparse, 2 heavily compressed; 2 hash-routed)"
        ),
        "{described}"
    );
    let (prompt, greedy) = oracle_prompt("sentence");
    assert_eq!(
        session
            .prompt_ids("The clockmaker opened the map by the sea.", false)
            .unwrap(),
        prompt,
        "the tokenizer gives the oracle's prompt"
    );
    let model = session.model().unwrap();
    let sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let generation = session
        .generate(&model, &prompt, 32, sampling, &[], |_| {})
        .unwrap();
    assert_eq!(generation.generated_ids, greedy);
}

/// The fixture's layers are too small for streaming them to save memory (16 KiB-aligned
/// buffers for 8 KiB matrices), so at the floor only its routed experts stream.
#[test]
fn streamed_experts_of_the_fixture_have_the_resident_bits() {
    let dir = packed();
    let (prompt, _) = oracle_prompt("ids");
    streams_with_the_resident_bits(dir.path(), &prompt, STEPS, false);
}

/// A wider V4 (hidden 256, 8 heads of 128, q_lora 512, experts of 512, random weights in
/// DeepSeek's storage): at the floor every layer's attention, compressors, indexer, router and
/// shared expert stream too.
#[test]
fn streamed_layers_of_a_wider_v4_have_the_resident_bits() {
    let checkpoint = tempfile::tempdir().unwrap();
    common::wide_v4::write(checkpoint.path(), &fixture(), &common::wide_v4::WIDE);
    let out = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    // Past a CSA window and an HCA window, in few steps: the test runs unoptimised.
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 512).collect();
    streams_with_the_resident_bits(out.path(), &prompt, 3, true);
}

fn streams_with_the_resident_bits(dir: &Path, prompt: &[u32], steps: usize, layers_stream: bool) {
    let fresh = Session::open(dir, Trust::Unverified).unwrap();
    fresh.plan(Budget::Floor, 128).unwrap();
    assert_eq!(
        fresh.artifact.payload_bytes(),
        0,
        "planning read no payload"
    );
    let session = Session::open(dir, Trust::Unverified).unwrap();
    let resident = session.model().unwrap();
    let (resident_bits, _) = greedy_bits(&resident, prompt, steps);

    let (floor, experts) = session.plan(Budget::Floor, 128).unwrap();
    assert_eq!(floor.mode, Mode::Streamed);
    assert_eq!(floor.moe_layers, 5);
    let all: Vec<usize> = (0..5).collect();
    assert_eq!(
        floor.streamed_layers,
        if layers_stream { all } else { Vec::new() }
    );
    let (experts_only, _) = session
        .plan(Budget::Bytes(floor.deterministic_floor), 128)
        .unwrap();
    assert!(experts_only.streamed_layers.is_empty());
    for (plan, read_ahead, threads) in [
        (&floor, true, 1),
        (&floor, false, 2),
        (&experts_only, true, 2),
    ] {
        common::assert_streams_as_planned(
            &session,
            plan,
            &experts,
            (read_ahead, threads),
            (prompt, steps),
            &resident_bits,
            "deepseek_v4",
        );
    }
    common::assert_guesses_keep_the_bits(
        &session,
        (&floor, &experts_only),
        &experts,
        (prompt, steps),
        &resident_bits,
        "deepseek_v4",
    );
    let Err(SessionError::Plan(PlanError::BelowFloor(_))) =
        session.plan(Budget::Bytes(floor.floor - 1), 128)
    else {
        panic!("a budget below the floor was planned");
    };
}

/// A hash layer's table naming an expert the layer does not have is refused when the model is
/// built, naming the table.
#[test]
fn a_tid2eid_entry_past_the_experts_is_refused() {
    let checkpoint = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, checkpoint.path().join(path.file_name().unwrap())).unwrap();
    }
    let path = checkpoint.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let name = "layers.1.ffn.gate.tid2eid";
    let t = st.tensor(name).unwrap();
    let mut table = t.data().to_vec();
    table[..8].copy_from_slice(&8i64.to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let data: &[u8] = if n == name { &table } else { v.data() };
            (
                n,
                safetensors::tensor::TensorView::new(v.dtype(), v.shape().to_vec(), data).unwrap(),
            )
        })
        .collect();
    let rewritten = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, rewritten).unwrap();
    let out = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        out.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let session = Session::open(out.path(), Trust::Unverified).unwrap();
    let err = session.model().err().unwrap().to_string();
    assert!(err.contains(name) && err.contains("expert 8"), "{err}");
}
