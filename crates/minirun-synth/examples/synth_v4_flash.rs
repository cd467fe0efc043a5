//! Writes a random checkpoint in DeepSeek's own storage at the published DeepSeek V4 Flash's
//! geometry (its upstream `config.json`: hidden 4096, 256 FP4 experts of 2048 x 4096 per layer,
//! FP8 attention, vocabulary 129,280), cut to its first LAYERS layers: about 3.6 GB a layer
//! and 2.1 GB of embedding and head. `minirun pack --layout deepseek-v4-published` writes it in the
//! published layout. The tokenizer is the runtime's tiny V4 fixture's.
//!
//! `cargo run --release -p minirun-synth --example synth_v4_flash -- OUT_DIR [LAYERS]`

use std::path::{Path, PathBuf};

use minirun_synth::deepseek_v4::write_synthetic_v4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: synth_v4_flash OUT_DIR [LAYERS]";
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let layers: usize = args.next().map_or(Ok(5), |s| s.parse())?;
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../minirun-runtime/tests/data/deepseek-v4");
    let upstream = serde_json::from_slice(&std::fs::read(data.join("config.json"))?)?;
    let g = write_synthetic_v4(&out, &upstream, layers, &data.join("tiny-fp8-fp4"), &|i| {
        eprintln!("layer {i} written");
    })?;
    println!(
        "{} layers (rates {:?}) x {} experts of {} x {} FP4, hidden {}, vocabulary {} -> {}",
        layers,
        g.compress_ratios,
        g.experts,
        g.inner,
        g.hidden,
        g.hidden,
        g.vocab,
        out.display()
    );
    Ok(())
}
