//! The fixture behind the golden file and the cross-language reader test.
#![allow(dead_code)]

use dmexp::{ExportMeta, TensorRef};

/// Path of the checked-in golden export.
pub const GOLDEN_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden.bf16.dmexp");

/// A small model-shaped tensor set whose values exercise bf16 rounding: ties to even in
/// both directions, a value that flushes to zero, -0.0, a subnormal that survives, and
/// the largest magnitudes a model would hold.
pub struct Fixture {
    pub meta: ExportMeta,
    pub tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

impl Fixture {
    pub fn refs(&self) -> Vec<TensorRef<'_>> {
        self.tensors
            .iter()
            .map(|(name, dims, values)| TensorRef { name, dims, values })
            .collect()
    }
}

pub fn golden_fixture() -> Fixture {
    let config: toml::Table = toml::from_str(
        r#"
d_model = 8
n_layers = 1
n_heads = 2
vocab_size = 4
use_engram = true
engram_orders = [2, 3]
engram_hash = "mulxor-v1"
"#,
    )
    .unwrap();
    let embed: Vec<f32> = (0..32).map(|i| ((i as f32) - 15.5) / 7.0).collect();
    let edges: Vec<f32> = [
        0x3F80_8000u32, // 1 + 2^-8: tie, rounds down to even 0x3F80
        0x3F81_8000,    // tie, rounds up to even 0x3F82
        0x3F80_8001,    // just above the tie: rounds up
        0x0000_0001,    // smallest f32 subnormal: flushes to 0
        0x8000_0000,    // -0.0: stays -0.0, not counted as flushed
        0x3089_705F,    // 1.0e-9: bf16 keeps it (f32's exponent range)
        0x4B80_0000,    // 2^24
        0xC2F6_E979,    // -123.456
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect();
    let norm = vec![1.0f32; 8];
    Fixture {
        meta: ExportMeta {
            source: "checkpoints/golden.bin@step7".to_string(),
            step: 7,
            config,
        },
        tensors: vec![
            ("embed.weight".to_string(), vec![4, 8], embed),
            ("blocks.0.edges".to_string(), vec![2, 4], edges),
            ("norm.weight".to_string(), vec![8], norm),
        ],
    }
}
