//! The checked-in golden export: today's encoder must reproduce it byte for byte, the
//! decoder must read it, and the independent Python reader must agree with the decoder.
//!
//! To regenerate after a deliberate format change: `DMEXP_BLESS=1 cargo test -p dmexp --test golden`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{GOLDEN_PATH, golden_fixture};
use dmexp::{Dtype, Export, Prefix};

fn encoded_fixture() -> Vec<u8> {
    let fixture = golden_fixture();
    dmexp::encode(&fixture.meta, &fixture.refs(), Dtype::Bf16)
        .unwrap()
        .to_bytes()
}

#[test]
fn encoder_reproduces_the_golden_file_byte_for_byte() {
    let fresh = encoded_fixture();
    if std::env::var_os("DMEXP_BLESS").is_some() {
        std::fs::write(GOLDEN_PATH, &fresh).unwrap();
    }
    let golden = std::fs::read(GOLDEN_PATH).unwrap();
    assert_eq!(golden.len(), fresh.len(), "golden length differs");
    let first_difference = golden.iter().zip(&fresh).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "golden bytes differ");
}

#[test]
fn decoder_reads_the_golden_file_with_pinned_values() {
    let golden = std::fs::read(GOLDEN_PATH).unwrap();
    let export = dmexp::decode(&golden).unwrap();
    let header = &export.header;
    assert_eq!(header.dtype, Dtype::Bf16);
    assert_eq!(header.source, "checkpoints/golden.bin@step7");
    assert_eq!(header.step, 7);
    assert_eq!(header.num_params, 48);
    assert_eq!(header.num_tensors(), 3);
    assert_eq!(header.flushed, 1, "only the f32 subnormal 2^-149 flushes");
    assert_eq!(header.max_abs.to_bits(), 0x4B80_0000, "2^24");
    assert_eq!(
        header.min_nonzero_abs.to_bits(),
        0x3089_0000,
        "1e-9 rounded to bf16"
    );
    assert_eq!(header.config["engram_hash"].as_str(), Some("mulxor-v1"));
    let (_, edges) = export.tensor("blocks.0.edges").unwrap();
    let bits: Vec<u32> = edges.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        bits,
        [
            0x3F80_0000,
            0x3F82_0000,
            0x3F81_0000,
            0x0000_0000,
            0x8000_0000,
            0x3089_0000,
            0x4B80_0000,
            0xC2F7_0000
        ]
    );
    let prefix = Prefix::read(&golden).unwrap();
    assert_eq!(
        golden.len() as u64,
        24 + u64::from(prefix.header_len) + 2 * header.num_params
    );
}

/// The lines `tools/dmexp_read.py` prints, produced from the Rust decoder's view.
fn rust_reading(golden: &[u8], export: &Export, tensor: &str, count: usize) -> String {
    let prefix = Prefix::read(golden).unwrap();
    let h = &export.header;
    let mut lines = vec![
        format!("format DMEXPRT v{}", prefix.version),
        format!("header_bytes {}", prefix.header_len),
        format!("payload_bytes {}", prefix.payload_len),
        format!("crc32 {:#010x} ok", prefix.payload_crc32),
        format!("dtype {}", h.dtype),
        format!("source {}", h.source),
        format!("step {}", h.step),
        format!("num_params {}", h.num_params),
        format!("num_tensors {}", h.num_tensors()),
        format!("flushed {}", h.flushed),
        format!("max_abs {:#010x}", h.max_abs.to_bits()),
        format!("min_nonzero_abs {:#010x}", h.min_nonzero_abs.to_bits()),
    ];
    for t in &h.tensors {
        lines.push(format!(
            "tensor {} dims={:?} offset={} bytes={}",
            t.name, t.dims, t.offset, t.byte_len
        ));
    }
    let (_, values) = export.tensor(tensor).unwrap();
    let shown: Vec<String> = values
        .iter()
        .take(count)
        .map(|v| format!("{:#010x}", v.to_bits()))
        .collect();
    lines.push(format!("values {tensor} {}", shown.join(" ")));
    lines.join("\n") + "\n"
}

#[test]
fn independent_python_reader_agrees_with_the_decoder() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/dmexp_read.py");
    let golden = std::fs::read(GOLDEN_PATH).unwrap();
    let export = dmexp::decode(&golden).unwrap();
    for (tensor, count) in [
        ("blocks.0.edges", 8),
        ("embed.weight", 12),
        ("norm.weight", 3),
    ] {
        let output = Command::new("python3")
            .arg(&script)
            .arg(GOLDEN_PATH)
            .arg(tensor)
            .args(["--count", &count.to_string()])
            .output()
            .expect("python3 must be installed to run the independent reader");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let python = String::from_utf8(output.stdout).unwrap();
        assert_eq!(python, rust_reading(&golden, &export, tensor, count));
    }
}

#[test]
fn independent_python_reader_refuses_a_corrupt_payload() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/dmexp_read.py");
    let mut golden = std::fs::read(GOLDEN_PATH).unwrap();
    let last = golden.len() - 1;
    golden[last] ^= 0x01;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.dmexp");
    std::fs::write(&path, &golden).unwrap();
    let output = Command::new("python3")
        .arg(&script)
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("checksum"));
}
