//! `export info`: everything the header says, for a person or a script, with the payload
//! checksum verified and no tensor materialised.

use crate::identify::printable;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::error::Error;
use crate::file::DmexpFile;
use crate::layout::MAGIC;
use crate::narrow::f16_bits_to_f32;

/// The description of one export, serializable to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Info {
    pub path: String,
    pub file_bytes: u64,
    pub magic: String,
    pub format_version: u8,
    pub header_bytes: u32,
    pub payload_bytes: u64,
    pub payload_crc32: String,
    /// Always true: an export whose checksum fails is an error, not an `Info`.
    pub checksum_verified: bool,
    pub dtype: String,
    pub bytes_per_value: u64,
    pub source: String,
    pub step: u64,
    pub num_params: u64,
    pub num_tensors: usize,
    pub flushed: u64,
    pub max_abs: f32,
    pub min_nonzero_abs: f32,
    pub config: toml::Table,
    pub tensors: Vec<InfoTensor>,
}

/// One tensor's entry and where it lies in the payload.
#[derive(Debug, Clone, Serialize)]
pub struct InfoTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub payload_offset: u64,
    pub bytes: u64,
}

/// Opens `path` lazily (checksum streamed, tensors not read) and describes it.
pub fn info(path: &Path) -> Result<Info, Error> {
    let file = DmexpFile::open(path)?;
    Ok(Info::from_file(&file))
}

impl Info {
    /// Describes an already opened (and therefore verified) export.
    pub fn from_file(file: &DmexpFile) -> Info {
        let header = file.header();
        let prefix = file.prefix();
        Info {
            path: file.path().display().to_string(),
            file_bytes: file.file_len(),
            magic: String::from_utf8_lossy(MAGIC).into_owned(),
            format_version: prefix.version,
            header_bytes: prefix.header_len,
            payload_bytes: prefix.payload_len,
            payload_crc32: format!("{:#010x}", prefix.payload_crc32),
            checksum_verified: true,
            dtype: header.dtype.name().to_string(),
            bytes_per_value: header.dtype.size(),
            source: header.source.clone(),
            step: header.step,
            num_params: header.num_params,
            num_tensors: header.num_tensors(),
            flushed: header.flushed,
            max_abs: header.max_abs,
            min_nonzero_abs: header.min_nonzero_abs,
            config: header.config.clone(),
            tensors: header
                .tensors
                .iter()
                .map(|t| InfoTensor {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    payload_offset: t.offset,
                    bytes: t.byte_len,
                })
                .collect(),
        }
    }

    /// Pretty JSON, for `export info --json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The text `export info` prints.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> std::fmt::Result {
        writeln!(
            s,
            "file        {} ({} bytes)",
            printable(&self.path),
            grouped(self.file_bytes)
        )?;
        writeln!(
            s,
            "format      {} v{}",
            printable(&self.magic),
            self.format_version
        )?;
        writeln!(
            s,
            "dtype       {} ({} bytes per value; loads as f32)",
            printable(&self.dtype),
            self.bytes_per_value
        )?;
        writeln!(s, "source      {}", printable(&self.source))?;
        writeln!(s, "step        {}", self.step)?;
        writeln!(
            s,
            "params      {} in {} tensors",
            grouped(self.num_params),
            self.num_tensors
        )?;
        writeln!(
            s,
            "layout      24-byte prefix + {} header bytes + {} payload bytes",
            grouped(u64::from(self.header_bytes)),
            grouped(self.payload_bytes)
        )?;
        writeln!(
            s,
            "checksum    ok (CRC-32 {} over the payload)",
            self.payload_crc32
        )?;
        writeln!(s, "max |w|     {:.6e}", self.max_abs)?;
        writeln!(s, "min |w|>0   {:.6e}", self.min_nonzero_abs)?;
        writeln!(
            s,
            "flushed     {} non-zero weights became 0 when narrowed",
            grouped(self.flushed)
        )?;
        writeln!(
            s,
            "f16 range   {}",
            f16_verdict(self.max_abs, self.min_nonzero_abs)
        )?;
        writeln!(s, "config")?;
        for line in toml::to_string(&self.config).unwrap_or_default().lines() {
            writeln!(s, "  {}", printable(line))?;
        }
        writeln!(s, "tensors     (name, dims, payload offset, bytes)")?;
        for t in &self.tensors {
            writeln!(
                s,
                "  {:<40} {:<16} {:>12} {:>12}",
                printable(&t.name),
                format!("{:?}", t.dims),
                t.payload_offset,
                t.bytes
            )?;
        }
        Ok(())
    }
}

/// Whether these weights would survive an f16 export: the comparison the seed says a
/// stranger should be able to make without rebuilding anything.
fn f16_verdict(max_abs: f32, min_nonzero_abs: f32) -> String {
    let f16_max = f16_bits_to_f32(0x7BFF);
    // 65520 is the midpoint between 65504 and 2^16: from there on, rounding gives infinity.
    let f16_overflow = 65520.0;
    let f16_min_subnormal = f16_bits_to_f32(0x0001);
    let f16_min_normal = f16_bits_to_f32(0x0400);
    let top = if max_abs >= f16_overflow {
        format!("max |w| at or above {f16_overflow} would overflow f16 (use bf16)")
    } else {
        format!("max |w| stays finite in f16 (largest {f16_max})")
    };
    let bottom = if min_nonzero_abs == 0.0 {
        "no non-zero weights".to_string()
    } else if min_nonzero_abs < f16_min_subnormal {
        format!("some weights below f16's smallest subnormal {f16_min_subnormal:e} may become 0")
    } else if min_nonzero_abs < f16_min_normal {
        format!(
            "some weights are f16 subnormals (below {f16_min_normal:e}), with reduced precision"
        )
    } else {
        "every non-zero weight is an f16 normal".to_string()
    };
    format!("{top}; {bottom}")
}

/// 1234567 -> "1,234,567".
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_verdict_names_the_range_each_weight_falls_in() {
        let tiny = f16_bits_to_f32(0x0001);
        let normal = f16_bits_to_f32(0x0400);
        let cases = [
            (0.0, "no non-zero weights"),
            (tiny / 2.0, "below f16's smallest subnormal"),
            (tiny, "are f16 subnormals"),
            (normal / 2.0, "are f16 subnormals"),
            (normal, "every non-zero weight is an f16 normal"),
        ];
        for (min, expected) in cases {
            let verdict = f16_verdict(1.0, min);
            assert!(verdict.contains(expected), "{min:e}: {verdict}");
            assert!(verdict.starts_with("max |w| stays finite"), "{verdict}");
        }
        assert!(f16_verdict(65520.0, 1.0).contains("would overflow f16"));
        assert!(f16_verdict(65519.0, 1.0).contains("stays finite"));
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
        ];
        for (n, shown) in cases {
            assert_eq!(grouped(n), shown);
        }
    }
}
