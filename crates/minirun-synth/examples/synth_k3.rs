//! Writes a random Kimi K3 checkpoint under the upstream names and in the upstream storage at
//! the published K3's geometry (its `config.json`: hidden 7168, 896 MXFP4 experts of 3072 x
//! 3584 a layer, BF16 attention, a dense first layer, vocabulary 163,840), cut to its first
//! LAYERS layers (default 2: the dense layer, then a mixture-of-experts one): about 2.3 GB for
//! the dense layer, 17 GB a mixture-of-experts layer and 4.7 GB of embedding and head.
//! `minirun pack --layout kimi-k3-published` writes it in the published layout. The tokenizer is
//! a made-up byte-pair vocabulary of K3's size, so that every id the model picks decodes.
//!
//! `cargo run --release -p minirun-synth --example synth_k3 -- OUT_DIR [LAYERS]`

use std::path::{Path, PathBuf};

use minirun_synth::kimi_k3::write_synthetic_k3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: synth_k3 OUT_DIR [LAYERS]";
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let layers: usize = args.next().map_or(Ok(2), |s| s.parse())?;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../minirun-runtime/tests/data/kimi-k3");
    let upstream = serde_json::from_slice(&std::fs::read(data.join("config.json"))?)?;
    let g = write_synthetic_k3(&out, &upstream, layers, &|i| {
        eprintln!("layer {i} written");
    })?;
    println!(
        "{} layers ({:?}, the first {} dense) x {} experts of {} x {} MXFP4, hidden {}, vocabulary {} -> {}",
        layers,
        g.mixers,
        g.first_dense,
        g.experts,
        g.expert_inner,
        g.latent,
        g.hidden,
        g.vocab,
        out.display()
    );
    Ok(())
}
