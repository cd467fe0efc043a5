//! The session library `minirun run` is built on: evidence is required unless the caller says
//! otherwise, a verified session generates mlx-lm's greedy continuation, and streamed text only
//! ever extends what was streamed.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

mod common;

use minirun_pack::{PackOptions, pack};
use minirun_runtime::Sampling;
use minirun_runtime::{IncrementalText, Session, SessionError, Trust};
use minirun_store::{Authority, SealKey, Selection};
use minirun_synth::tiny_models::SyntheticShape;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v3/mlx-affine4-g64")
}

fn packed() -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    pack(&fixture(), out.path(), &PackOptions::default(), &|_| {}).unwrap();
    out
}

/// Offline verification against the artifact's own manifests, writing its evidence.
fn verify(dir: &Path, selection: Selection) {
    try_verify(dir, selection).unwrap();
}

fn try_verify(
    dir: &Path,
    selection: Selection,
) -> Result<minirun_store::Verified, minirun_store::VerifyError> {
    let tree = minirun_store::own_manifest_tree(dir).unwrap();
    minirun_store::verify_with(
        dir,
        &tree,
        Authority::OwnManifests,
        selection,
        minirun_store::Sealing {
            key: &key(),
            progress: &|_| {},
            stop: &AtomicBool::new(false),
        },
    )
}

/// Why a verified session does not open (`what` says what should have refused it).
fn verified_refusal(dir: &Path, what: &str) -> String {
    match Session::open(dir, Trust::Verified(key())) {
        Ok(_) => panic!("{what} opened a verified run"),
        Err(e) => e.to_string(),
    }
}

/// This test binary's evidence key (the user's own stays untouched).
fn key() -> SealKey {
    SealKey::load_or_create(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("session-tests.key"))
        .unwrap()
}

const GREEDY: Sampling = Sampling {
    temperature: 0.0,
    top_p: 1.0,
    seed: 0,
};

#[test]
fn a_session_without_evidence_is_refused_unless_unverified() {
    let dir = packed();
    let refused = Session::open(dir.path(), Trust::Verified(key()));
    assert!(
        matches!(refused, Err(SessionError::NoEvidence(_))),
        "{:?}",
        refused.err()
    );
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    assert!(session.header().iter().any(|l| l.contains("--unverified")));
}

/// With no --budget, a plan holding everything is refused when it needs more than the memory
/// available, naming the floor; a budget the user gave, or a system that does not say, is not.
#[test]
fn a_default_plan_larger_than_the_memory_available_is_refused() {
    use minirun_stream::budget::Budget;
    use minirun_stream::plan::Layers;
    let dir = packed();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let (everything, _) = session.plan(Budget::Generous, 16).unwrap();
    let short = everything.budget - 1;
    let err = session
        .plan_within((None, Layers::HoldWhatFits), 16, Some(short))
        .unwrap_err();
    assert!(
        matches!(err, SessionError::ExceedsMemory { needs, available, floor, .. }
            if needs == everything.budget && available == short && floor == everything.floor),
        "{err}"
    );
    assert!(err.to_string().contains("--budget floor"), "{err}");
    let (fits, _) = session
        .plan_within((None, Layers::HoldWhatFits), 16, Some(everything.budget))
        .unwrap();
    assert_eq!(fits.budget, everything.budget);
    assert!(
        session
            .plan_within((None, Layers::HoldWhatFits), 16, None)
            .is_ok()
    );
    let (floor, _) = session
        .plan_within((Some(Budget::Floor), Layers::HoldWhatFits), 16, Some(1))
        .unwrap();
    assert_eq!(floor.budget, everything.floor);
}

#[test]
fn a_verified_session_generates_mlx_lms_greedy_continuation_and_streams_its_text() {
    let dir = packed();
    verify(dir.path(), Selection::Full);
    let session = Session::open(dir.path(), Trust::Verified(key())).unwrap();
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let prompt = &oracle["prompts"][0];
    let ids = session
        .prompt_ids(prompt["text"].as_str().unwrap(), false)
        .unwrap();
    assert_eq!(serde_json::json!(ids), prompt["token_ids"]);
    let model = session.model().unwrap();
    let mut streamed = String::new();
    let generation = session
        .generate(&model, &ids, 32, GREEDY, &[], |event| {
            streamed.push_str(event.text.unwrap_or_default())
        })
        .unwrap();
    assert_eq!(
        serde_json::json!(generation.generated_ids),
        prompt["greedy_32"]
    );
    assert_eq!(streamed, generation.streamed);
    assert!(generation.text.starts_with(&streamed), "{streamed:?}");
    assert_eq!(
        generation.text,
        session.text.decode(&generation.generated_ids).unwrap()
    );
}

#[test]
fn incremental_text_hands_out_only_extensions() {
    let dir = packed();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let ids = session
        .text
        .encode("The clockmaker's tower", false)
        .unwrap();
    let mut stream = IncrementalText::new(&session.text);
    let mut out = String::new();
    for &id in &ids {
        if let Some(new) = stream.push(id) {
            assert!(!new.is_empty());
            out.push_str(&new);
        }
        assert_eq!(out, stream.shown());
    }
    assert_eq!(out, session.text.decode(&ids).unwrap());
}

/// A file's bytes as a mapper would hand them over (the mmap baseline maps; this copies).
fn copied(path: &Path) -> std::io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> {
    Ok(Box::new(std::fs::read(path)?))
}

/// A generated checkpoint large enough that its weights pack into tile containers.
const CONTAINER_SHAPE: SyntheticShape = SyntheticShape {
    hidden: 512,
    layers: 2,
    experts: 4,
    experts_per_token: 2,
    moe_intermediate: 1024,
    vocab: 512,
    seed: 3,
};

#[test]
fn mapped_containers_compute_the_read_models_tokens_and_need_an_unverified_artifact() {
    let dir = common::packed_synthetic(&CONTAINER_SHAPE);
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let ids = session.prompt_ids("The clockmaker", false).unwrap();
    let read = session.model().unwrap();
    let expected = session
        .generate(&read, &ids, 8, GREEDY, &[], |_| {})
        .unwrap();
    drop(read);

    let mut mapped = Session::open(dir.path(), Trust::Unverified).unwrap();
    mapped
        .artifact
        .map_containers_unverified(Box::new(copied))
        .unwrap();
    let model = mapped.model().unwrap();
    let got = mapped
        .generate(&model, &ids, 8, GREEDY, &[], |_| {})
        .unwrap();
    assert_eq!(got.generated_ids, expected.generated_ids);
    assert!(
        mapped.artifact.payload_bytes() < session.artifact.total_payload_bytes(),
        "mapped containers are not counted as read: {} of {}",
        mapped.artifact.payload_bytes(),
        session.artifact.total_payload_bytes()
    );

    // A map of the wrong length is refused, naming the file.
    let mut short = Session::open(dir.path(), Trust::Unverified).unwrap();
    short
        .artifact
        .map_containers_unverified(Box::new(|path: &Path| {
            let mut bytes = std::fs::read(path)?;
            bytes.pop();
            Ok(Box::new(bytes) as Box<dyn AsRef<[u8]> + Send + Sync>)
        }))
        .unwrap();
    let err = short
        .model()
        .err()
        .expect("a short map is refused")
        .to_string();
    assert!(
        err.contains("maps") && err.contains("its manifest says"),
        "{err}"
    );

    // Through evidence, mapping is refused: maps are not rechecked against it.
    verify(dir.path(), Selection::Full);
    let mut verified = Session::open(dir.path(), Trust::Verified(key())).unwrap();
    let err = verified
        .artifact
        .map_containers_unverified(Box::new(copied))
        .unwrap_err()
        .to_string();
    assert!(err.contains("only an artifact opened unverified"), "{err}");
}

#[test]
fn spot_check_evidence_never_authorizes_a_run() {
    let dir = packed();
    verify(dir.path(), Selection::SpotCheck { budget: 1 << 20 });
    let refused = Session::open(dir.path(), Trust::Verified(key()));
    let Err(SessionError::SpotCheckOnly(path)) = refused else {
        panic!("spot-check evidence opened a run: {:?}", refused.err());
    };
    assert_eq!(path, dir.path().display().to_string());
    let message = SessionError::SpotCheckOnly(path).to_string();
    assert!(message.contains("minirun verify"), "{message}");
    assert!(Session::open(dir.path(), Trust::Unverified).is_ok());
}

#[test]
fn offline_evidence_covers_the_metadata_a_run_reads() {
    let dir = packed();
    verify(dir.path(), Selection::Full);
    let held = Session::open(dir.path(), Trust::Verified(key())).unwrap();
    let evidenced: Vec<&str> = held
        .artifact
        .evidence()
        .unwrap()
        .files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    for metadata in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "index.json",
        "layer00/manifest.json",
    ] {
        assert!(evidenced.contains(&metadata), "{metadata}: {evidenced:?}");
    }
    drop(held);

    // A changed configuration (say, another rope scaling) no longer opens a verified run.
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replacen('{', "{\"note\": 1, ", 1)).unwrap();
    let err = verified_refusal(dir.path(), "a changed config.json");
    assert!(
        err.contains("config.json") && err.contains("changed"),
        "{err}"
    );
}

/// An index.json that is not a JSON object is refused at open, verified or not, before a
/// weight is read.
#[test]
fn an_index_json_that_is_not_an_index_is_refused() {
    let dir = packed();
    std::fs::write(dir.path().join("index.json"), b"\x00garbage, not json").unwrap();
    let err = Session::open(dir.path(), Trust::Unverified)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("index.json") && err.contains("is not an artifact index"),
        "{err}"
    );
}

#[test]
fn a_unit_added_after_verification_is_refused_not_read() {
    let dir = packed();
    verify(dir.path(), Selection::Full);
    std::fs::create_dir(dir.path().join("layer09")).unwrap();
    std::fs::copy(
        dir.path().join("layer02/manifest.json"),
        dir.path().join("layer09/manifest.json"),
    )
    .unwrap();
    let err = verified_refusal(dir.path(), "a manifest added after verification");
    assert!(
        err.contains("layer09/manifest.json") && err.contains("minirun verify"),
        "{err}"
    );
}

#[test]
fn verification_checks_the_configuration_index_json_pins() {
    let out = tempfile::tempdir().unwrap();
    let options = PackOptions {
        source_repo: Some("team/tiny-deepseek".into()),
        source_revision: Some("0123456789abcdef0123456789abcdef01234567".into()),
    };
    pack(&fixture(), out.path(), &options, &|_| {}).unwrap();
    let index = std::fs::read_to_string(out.path().join("index.json")).unwrap();
    assert!(index.contains("\"configuration\""), "{index}");
    let config = out.path().join("config.json");
    let mut bytes = std::fs::read(&config).unwrap();
    bytes.push(b'\n');
    std::fs::write(&config, bytes).unwrap();
    let err = try_verify(out.path(), Selection::Full)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json") && err.contains("index.json says"),
        "{err}"
    );
}

#[test]
fn a_kimi_k3_config_is_read_as_kimi_k3_and_weights_it_does_not_name_are_refused() {
    let dir = packed();
    let k3 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/config.json");
    std::fs::copy(&k3, dir.path().join("config.json")).unwrap();
    let session = Session::open(dir.path(), Trust::Unverified).unwrap();
    let described = session.header().join("\n");
    assert!(
        described.contains("kimi_k3: 93 layers (69 KDA, 24 MLA)"),
        "{described}"
    );
    // The DeepSeek-V3 weights under it are not a K3 model: refused, naming what is missing.
    let Err(err) = session.model() else {
        panic!("DeepSeek-V3 weights loaded as Kimi K3");
    };
    assert!(
        err.to_string()
            .contains("self_attn.q_proj.weight: this is not a Kimi K3 text model"),
        "{err}"
    );

    // A malformed K3 config is refused by name first.
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&k3).unwrap()).unwrap();
    config["text_config"]["hidden_act"] = "silu".into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let Err(err) = Session::open(dir.path(), Trust::Unverified) else {
        panic!("opened");
    };
    assert!(err.to_string().contains("text_config.hidden_act"), "{err}");
}
