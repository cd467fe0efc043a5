//! DeepSeek V4 as `minirun run` runs it: opened through a session (which reads the
//! architecture from config.json), generating transformers' greedy continuation, and refusing a
//! hash table that names an expert the layer lacks. Streamed under a budget:
//! `tests/streamed_architectures.rs`.

mod common;

use std::path::Path;

use minirun_pack::{PackOptions, pack};
use minirun_runtime::Sampling;
use minirun_runtime::{Session, Trust};

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
