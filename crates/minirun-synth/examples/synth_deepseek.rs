//! Writes a synthetic DeepSeek-V3-shaped checkpoint (MLX layout, affine 4-bit, stacked
//! experts) of about `GB` gigabytes: for streaming benchmarks and the budget demo in docs/minirun.md.
//! The tokenizer is copied from one of the runtime's test fixtures.
//!
//! `cargo run --release -p minirun-synth --example synth_deepseek -- OUT_DIR [GB] [HIDDEN] [EXPERTS] [TOP_K]`

use std::path::{Path, PathBuf};

use minirun_synth::tiny_models::{SyntheticShape, write_synthetic_deepseek};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: synth_deepseek OUT_DIR [GB] [HIDDEN] [EXPERTS] [TOP_K]";
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let gb: f64 = args.next().map_or(Ok(0.2), |s| s.parse())?;
    let hidden: usize = args.next().map_or(Ok(512), |s| s.parse())?;
    let experts: usize = args.next().map_or(Ok(32), |s| s.parse())?;
    let top_k: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let mut shape = SyntheticShape {
        hidden,
        layers: 2,
        experts,
        experts_per_token: top_k,
        // hidden x moe_intermediate a multiple of 2^19 keeps every expert tile page aligned.
        moe_intermediate: (1 << 19) / hidden.min(1 << 19),
        vocab: 512,
        seed: 42,
    };
    shape.moe_intermediate = shape.moe_intermediate.max(1024);
    let per_layer = shape.expert_bytes() * experts as u64;
    shape.layers = 1 + ((gb * 1e9) / per_layer as f64).ceil().max(1.0) as usize;
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    write_synthetic_deepseek(&out, &shape, &tokenizer)?;
    println!(
        "{} layers ({} MoE) x {} experts of {} bytes (top {}), hidden {}, moe_intermediate {} -> {}",
        shape.layers,
        shape.layers - 1,
        experts,
        shape.expert_bytes(),
        top_k,
        hidden,
        shape.moe_intermediate,
        out.display()
    );
    Ok(())
}
