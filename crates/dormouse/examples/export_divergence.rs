//! What each export dtype costs, measured against the checkpoint's own f32 model: file bytes,
//! ratio vs the training container, max |w|, min non-zero |w|, flushed weights, max and mean
//! abs logit delta, top-1 agreement over 16 windows of 256 held-out bytes, and whether 64
//! greedy bytes are identical. The checkpoint is only read; exports go to a temporary folder.
//!
//! ```sh
//! cargo run --release -p dormouse --example export_divergence -- --ckpt-dir checkpoints --ckpt-name latest
//! ```

use std::ops::ControlFlow;
use std::path::PathBuf;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use dmexp::Dtype;
use dormouse::checkpoint::{Checkpoint, SectionKind};
use dormouse::export::{ExportRequest, export_run};
use dormouse::sample::{Sampler, SamplingParams, generate};
use dormouse::serving::load_export;
use dormouse::{Dormouse, DormouseConfig};

const WINDOWS: usize = 16;
const WINDOW: usize = 256;
const HELD_OUT: usize = 65_536;
const GREEDY: usize = 64;

fn flag(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ckpt_dir = PathBuf::from(flag("--ckpt-dir", "checkpoints"));
    let ckpt_name = flag("--ckpt-name", "latest");
    let bin = ckpt_dir.join(format!("{ckpt_name}.bin"));
    let cfg = DormouseConfig::from_toml(&std::fs::read_to_string(
        ckpt_dir.join(format!("{ckpt_name}.config.toml")),
    )?)?;
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let reference = Dormouse::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    let section = Checkpoint::open(&bin)?.read(SectionKind::Model)?;
    dormouse::weights::load_into_varmap(&varmap, &section, &device)?;

    let corpus = dormouse::data::EMBEDDED_CORPUS;
    let held_out = &corpus[corpus.len() - HELD_OUT..];
    let stride = (held_out.len() - WINDOW) / (WINDOWS - 1);
    let windows: Vec<&[u8]> = (0..WINDOWS)
        .map(|i| &held_out[i * stride..i * stride + WINDOW])
        .collect();
    let reference_logits = reference.forward(&windows, None)?;
    let reference_greedy = greedy(&reference, windows[0])?;
    let container = std::fs::metadata(&bin)?.len();

    let scratch = tempfile::tempdir()?;
    println!(
        "checkpoint {} ({container} bytes), {WINDOWS} windows of {WINDOW} B from the held-out tail\n",
        bin.display()
    );
    println!(
        "| format | file bytes | vs container | max abs weight | min non-zero weight | flushed to 0 | max abs logit delta | mean abs logit delta | top-1 agree | greedy {GREEDY} |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let out = scratch
            .path()
            .join(format!("export.{}.dmexp", dtype.name()));
        let done = export_run(&ExportRequest {
            ckpt_dir: ckpt_dir.clone(),
            ckpt_name: ckpt_name.clone(),
            dtype,
            out: Some(out.clone()),
            preset: None,
        })?;
        let h = &done.written.header;
        let served = load_export(&out, &device)?;
        let logits = served.model.forward(&windows, None)?;
        let delta = (&logits - &reference_logits)?.abs()?.flatten_all()?;
        let max_delta = delta.max(0)?.to_scalar::<f32>()?;
        let mean_delta = delta.mean(0)?.to_scalar::<f32>()?;
        let agree = agreement(&logits, &reference_logits)?;
        let same_greedy = greedy(&served.model, windows[0])? == reference_greedy;
        let bytes = done.written.file_len();
        println!(
            "| {} | {bytes} | {:.1}x | {:.4e} | {:.4e} | {} | {max_delta:.3e} | {mean_delta:.3e} | {:.1}% | {} |",
            dtype.name(),
            container as f64 / bytes as f64,
            h.max_abs,
            h.min_nonzero_abs,
            h.flushed,
            agree * 100.0,
            if same_greedy { "identical" } else { "DIFFERS" }
        );
    }
    Ok(())
}

/// The fraction of positions whose most likely byte is the same.
fn agreement(a: &Tensor, b: &Tensor) -> candle_core::Result<f64> {
    let a = a.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?;
    let b = b.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?;
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    Ok(same as f64 / a.len() as f64)
}

/// 64 greedy bytes after the first half of `window`.
fn greedy(model: &Dormouse, window: &[u8]) -> candle_core::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    generate(
        model,
        &window[..WINDOW / 2],
        GREEDY,
        &mut Sampler::new(SamplingParams::default()),
        |b| {
            bytes.push(b);
            ControlFlow::Continue(())
        },
    )?;
    Ok(bytes)
}
