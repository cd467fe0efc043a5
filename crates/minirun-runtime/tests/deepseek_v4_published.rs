//! DeepSeek V4 in the published artifact layout: a checkpoint in DeepSeek's storage written by
//! `minirun_pack::v4_published` into `layersNN` / `global00` units (v3 FP8 matrix containers,
//! v2 MXFP4 expert containers in `expert_order`, unaligned plain blobs) and opened by the runtime
//! from that layout: every logit has the bits of the same checkpoint in minirun's own layout,
//! resident and streamed at the floor.
//!
//! The published containers hold whole 128 x 128 FP8 blocks and MXFP4 regions of whole 16 KiB
//! pages, which the tiny fixture's matrices are too small for: the checkpoint is a random one
//! of hidden 512 with experts of 1,024 (12 of them, so their text order is not numeric).

mod common;

use std::path::Path;

use common::greedy_bits;
use common::wide_v4::{WideShape, write};
use minirun_format::artifact::v4_published::{V4File, V4UnitManifest};
use minirun_pack::v4_published::pack_v4_published;
use minirun_pack::{PackOptions, pack};
use minirun_runtime::{Session, Trust};
use minirun_stream::budget::Budget;
use minirun_stream::plan::Mode;

const SHAPE: WideShape = WideShape {
    hidden: 512,
    inner: 1024,
    experts: 12,
    layers: &["sliding", "csa", "hca"],
};
const STEPS: usize = 2;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4/tiny-fp8-fp4")
}

fn provenance() -> PackOptions {
    PackOptions {
        source_repo: Some("deepseek-ai/DeepSeek-V4-Flash-0731".into()),
        source_revision: Some("7872f01b1d1fe23eabc4c98b48bffcef5a386062".into()),
    }
}

#[test]
fn the_published_layout_runs_with_the_bits_of_minirun_s_own() {
    let checkpoint = tempfile::tempdir().unwrap();
    write(checkpoint.path(), &fixture(), &SHAPE);
    let own = tempfile::tempdir().unwrap();
    pack(
        checkpoint.path(),
        own.path(),
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    let published = tempfile::tempdir().unwrap();
    let summary =
        pack_v4_published(checkpoint.path(), published.path(), &provenance(), &|_| {}).unwrap();
    assert_eq!(summary.units, 4);

    // The layout by its own rules: layer 1 (CSA) holds 9 FP8 matrices, three expert containers
    // and its plain blob; the experts in text order.
    let bytes = std::fs::read(published.path().join("layers01/manifest.json")).unwrap();
    let m = V4UnitManifest::parse(&bytes, "layers01").unwrap();
    let order = m.expert_order.clone().unwrap();
    assert_eq!(order[..4], [0, 1, 10, 11]);
    let containers = m
        .files
        .iter()
        .filter(|f| matches!(f, V4File::Container(c) if c.source_tensor.is_some()))
        .count();
    assert_eq!(
        containers, 9,
        "wq_a, wq_b, wkv, wo_a, wo_b, indexer wq_b; shared w1/w2/w3"
    );
    assert!(m.file("layers01-w2.mxfp4tile").is_some() && m.file("layers01-plain.bin").is_some());
    // FP8 matrices are version-3 containers with their digest, experts version 2 with one
    // digest per expert; both checkpoint-derived.
    let header = |name: &str| {
        let bytes = std::fs::read(published.path().join("layers01").join(name)).unwrap();
        minirun_format::tile::TileContainer::parse(&bytes[..16384], bytes.len() as u64).unwrap()
    };
    let wq_a = header("layers01-attn_wq_a_weight.fp8tile");
    let w1 = header("layers01-w1.mxfp4tile");
    assert_eq!((wq_a.version, wq_a.digests.map(|d| d.len())), (3, Some(1)));
    assert_eq!(
        (
            w1.version,
            w1.digests.as_ref().map(Vec::len),
            w1.geometry.tile_count
        ),
        (2, Some(12), 12)
    );
    assert_eq!(
        w1.content_kind,
        minirun_format::tile::ContentKind::CheckpointDerived
    );

    let prompt: Vec<u32> = (0..9).map(|i| (i * 41 + 3) % 512).collect();
    let own = Session::open(own.path(), Trust::Unverified).unwrap();
    let (want, _) = greedy_bits(&own.model().unwrap(), &prompt, STEPS);
    let session = Session::open(published.path(), Trust::Unverified).unwrap();
    let (got, _) = greedy_bits(&session.model().unwrap(), &prompt, STEPS);
    assert!(
        got == want,
        "resident: other logits than minirun's own layout"
    );

    let (floor, experts) = session.plan(Budget::Floor, 64).unwrap();
    assert_eq!(floor.mode, Mode::Streamed);
    let streamed = session.planned_model(&floor, &experts).unwrap();
    let (bits, decode) = greedy_bits(&streamed, &prompt, STEPS);
    assert!(bits == want, "streamed: other logits");
    assert_eq!(
        decode.expert_read_bytes,
        floor.uncached_read_per_token * STEPS as u64
    );
}

/// Without the upstream's identity the layout cannot be written (every manifest names it).
#[test]
fn the_published_layout_needs_the_upstream() {
    let out = tempfile::tempdir().unwrap();
    let err = pack_v4_published(&fixture(), out.path(), &PackOptions::default(), &|_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("--source-repo"), "{err}");
    // The fixture's matrices are not whole 128 x 128 blocks: refused before writing.
    let err = pack_v4_published(&fixture(), out.path(), &provenance(), &|_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("whole 128 x 128 blocks"), "{err}");
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none());
}
