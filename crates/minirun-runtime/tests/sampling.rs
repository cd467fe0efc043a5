//! Sampling: a seed names one continuation, a vanishing nucleus is greedy, a stop token ends
//! the output unprinted, and an empty prompt is refused.

use std::path::Path;

use minirun_pack::{PackOptions, pack};
use minirun_runtime::models::deepseek_v3::DeepSeekV3;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use minirun_runtime::{Sampling, StopReason, generate};
use minirun_stream::artifact::{Access, Artifact};
use minirun_stream::step::ModelError;

fn with_model(f: impl FnOnce(&DeepSeekV3)) {
    let out = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v3/mlx-mxfp4");
    pack(
        &src,
        out.path(),
        &PackOptions {
            source_repo: None,
            source_revision: None,
        },
        &|_| {},
    )
    .unwrap();
    let artifact = Artifact::open(out.path(), Access::Unverified).unwrap();
    let config = DeepSeekV3Config::parse(&artifact.config_json).unwrap();
    f(&DeepSeekV3::load(&artifact, config).unwrap());
}

const PROMPT: [u32; 5] = [0, 292, 354, 395, 264];

#[test]
fn sampling_is_reproducible_by_seed_and_a_tiny_nucleus_is_greedy() {
    with_model(|model| {
        let run = |temperature, top_p, seed| {
            let sampling = Sampling {
                temperature,
                top_p,
                seed,
            };
            generate(model, &PROMPT, 16, sampling, &[], |_, _| {})
                .unwrap()
                .0
        };
        let greedy = run(0.0, 1.0, 0);
        assert_eq!(
            run(1.0, 1.0, 7),
            run(1.0, 1.0, 7),
            "the same seed gives the same ids"
        );
        let seeds: Vec<Vec<u32>> = (0..4).map(|s| run(1.0, 1.0, s)).collect();
        assert!(
            seeds.iter().any(|s| s != &seeds[0]),
            "different seeds sample differently"
        );
        assert_eq!(
            run(1.0, 1e-6, 3),
            greedy,
            "a nucleus of one token is the argmax"
        );
    });
}

#[test]
fn a_stop_token_ends_the_output_without_being_emitted() {
    with_model(|model| {
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        };
        let (full, _) = generate(model, &PROMPT, 12, greedy, &[], |_, _| {}).unwrap();
        let stop = full[5];
        let first = full.iter().position(|&t| t == stop).unwrap();
        let mut seen = Vec::new();
        let (cut, figures) =
            generate(model, &PROMPT, 12, greedy, &[stop], |t, _| seen.push(t)).unwrap();
        assert_eq!(cut, full[..first]);
        assert_eq!(seen, cut, "on_token saw exactly the returned ids");
        assert_eq!(figures.stop_reason, StopReason::EndOfSequence);
        assert!(matches!(
            generate(model, &[], 4, greedy, &[], |_, _| {}),
            Err(ModelError::EmptyPrompt)
        ));
    });
}

#[test]
fn the_logits_digest_covers_the_prompt_and_every_step_in_order() {
    use minirun_runtime::Decoder;
    use minirun_stream::step::StepStats;
    use sha2::{Digest, Sha256};
    with_model(|model| {
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        };
        let (ids, figures) = generate(model, &PROMPT, 6, greedy, &[], |_, _| {}).unwrap();
        let mut cache = model.new_cache();
        let mut stats = StepStats::default();
        let mut computed = vec![model.prefill(&PROMPT, &mut cache, &mut stats).unwrap()];
        for &id in &ids[..ids.len() - 1] {
            computed.push(model.step(id, &mut cache, &mut stats).unwrap());
        }
        let digest_of = |vectors: &[Vec<f32>]| -> [u8; 32] {
            let mut digest = Sha256::new();
            for v in vectors {
                for x in v {
                    digest.update(x.to_bits().to_le_bytes());
                }
            }
            digest.finalize().into()
        };
        assert_eq!(figures.logits_sha256, digest_of(&computed));
        assert_eq!(figures.logits_sha256_hex().len(), 64);
        let (_, shorter) = generate(model, &PROMPT, 5, greedy, &[], |_, _| {}).unwrap();
        assert_ne!(shorter.logits_sha256, figures.logits_sha256);
    });
}
