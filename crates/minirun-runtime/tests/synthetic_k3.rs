//! The generator of random Kimi K3 checkpoints (`minirun_synth::kimi_k3`, which the
//! streaming benchmark runs at the published K3's geometry) on a narrow geometry: the upstream
//! config with smaller matrices but its own layer kinds (a dense first layer, then KDA layers and
//! an MLA one with mixtures of experts). The runtime reads what it writes in the published
//! layout, and a streamed run at the floor has the resident run's bits.

mod common;

use std::path::Path;

use common::{assert_logits_mean_something, greedy_bits};
use minirun_pack::PackOptions;
use minirun_pack::k3_published::{BandSizes, pack_k3_published};
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::plan::Mode;
use minirun_synth::kimi_k3::{Mixer, write_synthetic_k3};

const STEPS: usize = 2;
const LAYERS: usize = 4;
const VOCAB: u32 = 1024;

/// Expert bands of whole 16 KiB pages (512 rows of 1,024 MXFP4 columns) and small
/// deterministic bands, so that every tensor spans several.
const BANDS: BandSizes = BandSizes {
    band_bytes: 16384,
    expert_band_rows: (512, 512),
};

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3")
}

fn narrow_upstream() -> serde_json::Value {
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data().join("config.json")).unwrap()).unwrap();
    let text = &mut config["text_config"];
    for (key, value) in [
        ("hidden_size", 256),
        ("intermediate_size", 512),
        ("num_attention_heads", 2),
        ("num_key_value_heads", 2),
        ("q_lora_rank", 64),
        ("kv_lora_rank", 64),
        ("qk_nope_head_dim", 32),
        ("qk_rope_head_dim", 16),
        ("v_head_dim", 32),
        ("num_experts", 4),
        ("num_experts_per_token", 2),
        ("num_shared_experts", 1),
        ("moe_intermediate_size", 1024),
        ("routed_expert_hidden_size", 1024),
        ("vocab_size", VOCAB as i64),
    ] {
        text[key] = value.into();
    }
    text["linear_attn_config"]["num_heads"] = 2.into();
    text["linear_attn_config"]["head_dim"] = 64.into();
    config
}

#[test]
fn a_generated_checkpoint_runs_in_the_published_layout_streamed_with_the_resident_bits() {
    let checkpoint = tempfile::tempdir().unwrap();
    let g = write_synthetic_k3(checkpoint.path(), &narrow_upstream(), LAYERS, &|_| {}).unwrap();
    assert_eq!(g.mixers, [Mixer::Kda, Mixer::Kda, Mixer::Kda, Mixer::Mla]);
    assert_eq!(g.first_dense, 1);
    let published = tempfile::tempdir().unwrap();
    let summary = pack_k3_published(
        checkpoint.path(),
        published.path(),
        BANDS,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    assert_eq!((summary.naming, summary.layers), ("upstream", LAYERS));

    let session = Session::open(published.path(), Trust::Unverified).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 67 + 5) % VOCAB).collect();
    let (want, _) = greedy_bits(&session.model().unwrap(), &prompt, STEPS);
    assert_logits_mean_something(&want);

    let (floor, experts) = session.plan(Budget::Floor, 64).unwrap();
    assert_eq!(floor.mode, Mode::Streamed);
    let streamed = session.planned_model(&floor, &experts).unwrap();
    let (got, decode) = greedy_bits(&streamed, &prompt, STEPS);
    assert!(got == want, "streamed at the floor: other logits");
    // Two experts of three 1024 x 1024 MXFP4 matrices (512 KiB of codes and 32 KiB of scales
    // each) in each of the three mixture-of-experts layers, every step, nothing cached.
    assert_eq!(
        decode.expert_read_bytes,
        (STEPS * 3 * 2 * 3 * (512 + 32) * 1024) as u64
    );
    assert_eq!(
        decode.expert_read_bytes,
        floor.uncached_read_per_token * STEPS as u64
    );
}
