//! Writes a synthetic MLX-layout (affine 4-bit, group 64, bf16 scales) checkpoint of about
//! `--gb` gigabytes for the pack benchmark: `layers` layers of 16 stacked experts of
//! 2048 x 4096 (gate, up, down), plus bf16 norms, in one shard per layer. The bytes are
//! SplitMix64 content: the packer copies bytes and never interprets values.
//!
//! `cargo run --release -p minirun-synth --example synth_checkpoint -- OUT_DIR [GB]`

use std::collections::HashMap;
use std::path::PathBuf;

use minirun_format::synthetic::fill_content;
use safetensors::tensor::{Dtype, TensorView};

const EXPERTS: usize = 16;
const ROWS: usize = 2048;
const COLS: usize = 4096;
const GROUP: usize = 64;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_content(seed, 0, &mut out);
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: synth_checkpoint OUT_DIR [GB]")?);
    let gb: f64 = args.next().map_or(Ok(2.0), |s| s.parse())?;
    let per_layer = 3 * EXPERTS * (ROWS * COLS / 2 + 2 * ROWS * (COLS / GROUP) * 2);
    let layers = ((gb * 1e9) / per_layer as f64).ceil().max(1.0) as usize;
    std::fs::create_dir_all(&out)?;
    let mut weight_map = serde_json::Map::new();
    for layer in 0..layers {
        let shard = format!("model-{:05}-of-{:05}.safetensors", layer + 1, layers);
        let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (p, proj) in ["gate_proj", "up_proj", "down_proj"].iter().enumerate() {
            let (rows, cols) = if *proj == "down_proj" {
                (COLS / 2, ROWS * 2)
            } else {
                (ROWS, COLS)
            };
            let base = format!("model.layers.{layer}.mlp.switch_mlp.{proj}");
            let seed = (layer * 10 + p) as u64;
            data.push((
                format!("{base}.weight"),
                Dtype::U32,
                vec![EXPERTS, rows, cols / 8],
                bytes(seed, EXPERTS * rows * cols / 2),
            ));
            let groups = vec![EXPERTS, rows, cols / GROUP];
            data.push((
                format!("{base}.scales"),
                Dtype::BF16,
                groups.clone(),
                bytes(seed + 1000, EXPERTS * rows * cols / GROUP * 2),
            ));
            data.push((
                format!("{base}.biases"),
                Dtype::BF16,
                groups,
                bytes(seed + 2000, EXPERTS * rows * cols / GROUP * 2),
            ));
        }
        data.push((
            format!("model.layers.{layer}.input_layernorm.weight"),
            Dtype::BF16,
            vec![COLS],
            bytes(layer as u64 + 3000, COLS * 2),
        ));
        let views: Vec<(String, TensorView<'_>)> = data
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                Ok((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?))
            })
            .collect::<Result<_, safetensors::SafeTensorError>>()?;
        for (name, _) in &views {
            weight_map.insert(name.clone(), serde_json::Value::String(shard.clone()));
        }
        let metadata: HashMap<String, String> = [("format".to_string(), "mlx".to_string())].into();
        safetensors::serialize_to_file(views, Some(metadata), &out.join(&shard))?;
        eprintln!("wrote {shard}");
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        out.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index)?,
    )?;
    let config = serde_json::json!({ "model_type": "synthetic", "num_hidden_layers": layers,
        "quantization": { "group_size": GROUP, "bits": 4 }, "quantization_config": { "group_size": GROUP, "bits": 4 } });
    std::fs::write(out.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    std::fs::write(
        out.join("tokenizer.json"),
        b"{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n",
    )?;
    std::fs::write(
        out.join("LICENSE"),
        b"Synthetic benchmark data; no model.\n",
    )?;
    println!("{} layers, {} shards in {}", layers, layers, out.display());
    Ok(())
}
