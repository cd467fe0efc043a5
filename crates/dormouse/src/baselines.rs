//! What a trained model must beat: general-purpose compressors and the order-0 entropy on the
//! same held-out bytes, in bits per byte.

use std::io::Write;

/// Bits per byte of each baseline on `bytes`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Baselines {
    pub gzip_9: f64,
    pub xz_9: f64,
    pub zstd_19: f64,
    pub order0_entropy: f64,
}

fn bpb(compressed: usize, original: usize) -> f64 {
    compressed as f64 * 8.0 / original.max(1) as f64
}

/// Compresses `bytes` with gzip -9, xz -9 and zstd -19 and computes the order-0 entropy.
pub fn measure(bytes: &[u8]) -> std::io::Result<Baselines> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes)?;
    let gzip = gz.finish()?.len();
    let mut xz = xz2::write::XzEncoder::new(Vec::new(), 9);
    xz.write_all(bytes)?;
    let xz_len = xz.finish()?.len();
    let zstd_len = zstd::bulk::compress(bytes, 19)?.len();
    Ok(Baselines {
        gzip_9: bpb(gzip, bytes.len()),
        xz_9: bpb(xz_len, bytes.len()),
        zstd_19: bpb(zstd_len, bytes.len()),
        order0_entropy: order0(bytes),
    })
}

fn order0(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len().max(1) as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_rank_as_expected_on_english() {
        let text = crate::data::EMBEDDED_CORPUS;
        let b = measure(&text[text.len() - 65_536..]).unwrap();
        assert!(b.order0_entropy > 4.0 && b.order0_entropy < 5.0, "{b:?}");
        assert!(b.xz_9 < b.gzip_9 && b.gzip_9 < b.order0_entropy, "{b:?}");
        assert!((order0(&[7u8; 100]) - 0.0).abs() < 1e-12);
        assert!((order0(&[0, 1, 0, 1]) - 1.0).abs() < 1e-12);
    }
}
