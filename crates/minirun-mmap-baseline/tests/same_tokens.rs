//! The baseline is only a baseline if it computes what minirun computes: on a packed fixture,
//! `mmap-baseline` prints the greedy tokens and logits of minirun's own resident run, with either
//! arithmetic.

use std::path::{Path, PathBuf};
use std::process::Command;

use minirun_kernels::Activations;
use minirun_pack::{PackOptions, pack};
use minirun_runtime::Sampling;
use minirun_runtime::{Session, Trust};
use minirun_synth::tiny_models::{SyntheticShape, write_synthetic_deepseek};

#[test]
fn the_mapped_run_gives_the_read_runs_tokens() {
    // Large enough that the weights pack into tile containers, which the baseline maps.
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    let checkpoint = tempfile::tempdir().unwrap();
    let shape = SyntheticShape {
        hidden: 512,
        layers: 2,
        experts: 4,
        experts_per_token: 2,
        moe_intermediate: 1024,
        vocab: 512,
        seed: 4,
    };
    write_synthetic_deepseek(checkpoint.path(), &shape, &tokenizer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        dir.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let containers = walk(dir.path())
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "affinetile"))
        .count();
    assert!(containers > 0, "the artifact has tile containers to map");

    let mut digests = Vec::new();
    for (activations, flag) in [(Activations::F32, "f32"), (Activations::Int8, "int8")] {
        let mut session = Session::open(dir.path(), Trust::Unverified).unwrap();
        session.artifact.set_activations(activations);
        let ids = session.prompt_ids("The clockmaker", false).unwrap();
        let model = session.model().unwrap();
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        };
        let expected = session
            .generate(&model, &ids, 12, greedy, &[], |_| {})
            .unwrap();

        let out = Command::new(env!("CARGO_BIN_EXE_mmap-baseline"))
            .arg(dir.path())
            .args(["--prompt", "The clockmaker", "--max-tokens", "12"])
            .args(["--activations", flag])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["activations"], flag);
        assert_eq!(report["prompt_token_ids"], serde_json::json!(ids));
        assert_eq!(
            report["generated_token_ids"],
            serde_json::json!(expected.generated_ids)
        );
        let digest = expected.figures.logits_sha256_hex();
        assert_eq!(report["logits_sha256"], digest, "{flag}: the same bits");
        assert!(report["tokens_per_second"].as_f64().unwrap() > 0.0);
        digests.push(digest);
    }
    assert_ne!(
        digests[0], digests[1],
        "8-bit activations are another arithmetic: the flag must reach the products"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        match path.is_dir() {
            true => files.extend(walk(&path)),
            false => files.push(path),
        }
    }
    files
}
