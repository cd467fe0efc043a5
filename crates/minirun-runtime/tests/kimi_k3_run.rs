//! Kimi K3 as `minirun run` runs it: opened through a session (which reads the architecture
//! from config.json) and generating mlx-lm's greedy continuation. Streamed under a budget:
//! `tests/streamed_architectures.rs`.

mod common;

use std::path::Path;

use minirun_pack::{PackOptions, pack};
use minirun_runtime::Sampling;
use minirun_runtime::{Session, Trust};

fn packed(variant: &str) -> tempfile::TempDir {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kimi-k3")
        .join(variant);
    let out = tempfile::tempdir().unwrap();
    pack(&source, out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

fn oracle_ids(variant: &str, key: &str) -> Vec<u32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kimi-k3")
        .join(variant)
        .join("oracle.json");
    let oracle: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    oracle[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn the_session_generates_mlx_lms_greedy_continuation() {
    let dir = packed("mlx-mxfp4");
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    assert_eq!(session.architecture.model_type(), "kimi_k3");
    assert!(session.header()[1].starts_with("kimi_k3: 6 layers (4 KDA, 2 MLA)"));
    let model = session.model().unwrap();
    let prompt = oracle_ids("mlx-mxfp4", "prompt_token_ids");
    let generation = session
        .generate(
            &model,
            &prompt,
            32,
            Sampling {
                temperature: 0.0,
                top_p: 1.0,
                seed: 0,
            },
            &[],
            |_| {},
        )
        .unwrap();
    assert_eq!(
        generation.generated_ids,
        oracle_ids("mlx-mxfp4", "greedy_token_ids")
    );
}

/// The published K3 ships `tiktoken.model` and no `tokenizer.json`: a session then reads K3's
/// tokenizer and chat template, and refuses a vocabulary with ids the model has no row for.
#[test]
fn without_a_tokenizer_json_the_session_reads_k3s_tiktoken_model() {
    let dir = packed("mlx-mxfp4");
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    // The 256 single bytes and nothing merged: 256 + 256 reserved ids, the model's 512.
    use base64::Engine;
    let bytes_only: String = (0..=255u8)
        .map(|b| {
            let token = base64::engine::general_purpose::STANDARD.encode([b]);
            format!("{token} {b}\n")
        })
        .collect();
    std::fs::write(dir.path().join("tiktoken.model"), bytes_only).unwrap();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    assert_eq!(session.prompt_ids("hi", false).unwrap(), vec![104, 105]);
    let chat = session.prompt_ids("hi", true).unwrap();
    let (open, sep) = (256 + 3, 256 + 5);
    assert_eq!(chat.first(), Some(&open));
    assert_eq!(chat.last(), Some(&sep));
    assert!(chat.windows(2).any(|w| w == [104, 105]));
    // config.json's EOS, then K3's [EOS], <|end_of_msg|> and <|close|>.
    assert_eq!(session.stop_ids(), vec![1, 256 + 1, 256 + 2, 256 + 4]);
    let model = session.model().unwrap();
    let sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    let generation = session
        .generate(&model, &chat, 8, sampling, &[], |_| {})
        .unwrap();
    assert_eq!(generation.generated_ids.len(), 8);

    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/tiktoken");
    std::fs::copy(
        fixture.join("tiktoken.model"),
        dir.path().join("tiktoken.model"),
    )
    .unwrap();
    let Err(err) = Session::open(dir.path(), Trust::Unverified) else {
        panic!("a vocabulary larger than the model's opened");
    };
    assert!(
        err.to_string()
            .contains("931 ids and the model's vocabulary 512"),
        "{err}"
    );
}

/// The published K3 stores `A_log` padded to `head_dim` with zeros; a checkpoint whose padding
/// is not zero is refused, naming the tensor.
#[test]
fn an_a_log_whose_padding_is_not_zero_is_refused() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/hf-k3mix");
    let edited = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), edited.path().join(entry.file_name())).unwrap();
    }
    let shard = edited.path().join("model.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let name = "language_model.model.layers.1.self_attn.A_log";
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let info = metadata.info(name).unwrap();
    // Entry 4 is the first after the tiny model's 4 heads.
    let at = 8 + header_len + info.data_offsets.0 + 4 * 4;
    bytes[at..at + 4].copy_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
    let out = tempfile::tempdir().unwrap();
    pack(edited.path(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    let session = Session::open(out.path(), Trust::Unverified).unwrap();
    let Err(err) = session.model() else {
        panic!("a non-zero A_log padding loaded");
    };
    let text = err.to_string();
    assert!(
        text.contains(name) && text.contains("are not zero"),
        "{text}"
    );
}
