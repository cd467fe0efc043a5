//! The generator of random V4 checkpoints (`minirun_synth::deepseek_v4`, which the streaming
//! benchmark runs at the published V4 Flash's geometry) on a narrow geometry: the upstream
//! config with smaller matrices but its own layer kinds (two sliding, hash-routed layers, then
//! compressed sparse and heavily compressed ones). The runtime reads what it writes in the
//! published layout, and a streamed run at the floor has the resident run's bits.

mod common;

use std::path::Path;

use common::{assert_logits_mean_something, greedy_bits};
use minirun_pack::PackOptions;
use minirun_pack::v4_published::pack_v4_published;
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::plan::Mode;
use minirun_synth::deepseek_v4::write_synthetic_v4;

const STEPS: usize = 2;

fn narrow_upstream() -> serde_json::Value {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("config.json")).unwrap()).unwrap();
    // Whole 128 x 128 FP8 blocks and expert regions of whole 16 KiB pages, as the published
    // layout needs, at a few megabytes a layer.
    for (key, value) in [
        ("hidden_size", 512),
        ("num_attention_heads", 8),
        ("head_dim", 128),
        ("q_lora_rank", 512),
        ("o_groups", 2),
        ("o_lora_rank", 512),
        ("index_n_heads", 4),
        ("index_head_dim", 64),
        ("moe_intermediate_size", 1024),
        ("n_routed_experts", 12),
        ("num_experts_per_tok", 3),
        ("vocab_size", 512),
    ] {
        config[key] = value.into();
    }
    config
}

#[test]
fn a_generated_checkpoint_runs_in_the_published_layout_streamed_with_the_resident_bits() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4");
    let checkpoint = tempfile::tempdir().unwrap();
    let g = write_synthetic_v4(
        checkpoint.path(),
        &narrow_upstream(),
        4,
        &data.join("tiny-fp8-fp4"),
        &|_| {},
    )
    .unwrap();
    assert_eq!(g.compress_ratios, [0, 0, 4, 128]);
    let published = tempfile::tempdir().unwrap();
    let provenance = PackOptions {
        source_repo: Some("minirun-bench/synthetic-v4-flash".into()),
        source_revision: Some("0".repeat(40)),
    };
    let summary =
        pack_v4_published(checkpoint.path(), published.path(), &provenance, &|_| {}).unwrap();
    assert_eq!(summary.units, 5, "four layers and the globals");

    let session = Session::open(published.path(), Trust::Unverified).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 67 + 5) % 512).collect();
    let (want, _) = greedy_bits(&session.model().unwrap(), &prompt, STEPS);
    assert_logits_mean_something(&want);

    let (floor, experts) = session.plan(Budget::Floor, 64).unwrap();
    assert_eq!(floor.mode, Mode::Streamed);
    let streamed = session.planned_model(&floor, &experts).unwrap();
    let (got, decode) = greedy_bits(&streamed, &prompt, STEPS);
    assert!(got == want, "streamed at the floor: other logits");
    assert!(decode.outside_layers > std::time::Duration::ZERO);
    // Three experts of three 1024 x 512 FP4 matrices (256 KiB of codes and 16 KiB of scales
    // each) per layer and step, nothing cached at the floor.
    assert_eq!(
        decode.expert_read_bytes,
        (STEPS * 4 * 3 * 3 * 278_528) as u64
    );
    assert_eq!(
        decode.expert_read_bytes,
        floor.uncached_read_per_token * STEPS as u64
    );
}
