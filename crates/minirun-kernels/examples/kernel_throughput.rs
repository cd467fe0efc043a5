//! Kernel throughput at decode shapes, against the memory bandwidth of a plain read of the
//! same bytes in the same run.
//!
//! For each format, enough distinct matrices to fill `--mib` MiB (default 1024, far past the
//! last-level cache, as a model's experts are) are multiplied with one vector each, in turn;
//! weight bytes consumed per second is the figure. The reference is a plain read of exactly
//! those bytes (a sum of every 64-bit word), split over the same threads the same way. The
//! goal is a ratio of at least 0.5. The last column is the time of one `--batch`-vector (default
//! 4) `matmul` over the same matrices divided by the time of that many `matvec`s (below 1: the
//! batch pays). For affine 4- and 8-bit and MXFP4, the 8-bit-activation columns give the same
//! two figures with the input quantized for every product (`--activations int8`).
//!
//!     cargo run --release -p minirun-kernels --example kernel_throughput [-- --mib 1024 --threads 2 --batch 4]
//!         [--only FORMAT-SUBSTRING] [--shape ROWSxCOLS]

use std::time::Instant;

use minirun_kernels::{Activations, BlockScale, FloatType, Format, Int8Vector, QMatrix};
use rayon::prelude::*;

struct Args {
    only: Option<String>,
    /// `(rows, cols)` of the matrices; both decode shapes when not given.
    shape: Option<(usize, usize)>,
    mib: usize,
    threads: usize,
    repeats: usize,
    batch: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: kernel_throughput [--mib N] [--threads N] [--repeats N] [--batch N] [--only FORMAT-SUBSTRING] [--shape ROWSxCOLS]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        only: None,
        shape: None,
        mib: 1024,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        repeats: 3,
        batch: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let raw = it.next();
        if flag == "--only" {
            a.only = raw;
            continue;
        }
        if flag == "--shape" {
            let parsed = raw
                .as_deref()
                .and_then(|v| v.split_once('x'))
                .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)));
            a.shape = Some(parsed.unwrap_or_else(|| usage()));
            continue;
        }
        let value = raw.and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--mib", Some(v)) => a.mib = v,
            ("--threads", Some(v)) => a.threads = v,
            ("--repeats", Some(v)) => a.repeats = v,
            ("--batch", Some(v)) if v > 0 => a.batch = v,
            _ => usage(),
        }
    }
    a
}

/// Deterministic filler bytes; scales are kept finite and moderate.
fn fill(n: usize, seed: u64, scale_like: Option<Format>) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(n);
    match scale_like {
        Some(
            Format::Mxfp4
            | Format::Fp8Block {
                scale: BlockScale::E8m0,
                ..
            },
        ) => out.iter_mut().for_each(|b| *b = 120 + *b % 8),
        Some(Format::Affine { .. } | Format::Fp8Block { .. }) | Some(Format::Dense(_)) => {
            // Small positive floats (bf16/f16 pairs or f32 words): clear the exponent's top bits.
            for pair in out.chunks_exact_mut(2) {
                pair[1] = 0x3C;
            }
        }
        None => {}
    }
    out
}

fn sizes(format: Format, rows: usize, cols: usize) -> (usize, usize, usize) {
    match format {
        Format::Dense(t) => (rows * cols * t.size(), 0, 0),
        Format::Affine { bits, group, scale } => {
            let g = rows * cols / group * scale.size();
            (rows * cols * bits as usize / 8, g, g)
        }
        Format::Mxfp4 => (rows * cols / 2, rows * cols / 32, 0),
        Format::Fp8Block {
            block_rows,
            block_cols,
            scale,
        } => {
            let s = match scale {
                BlockScale::E8m0 => 1,
                BlockScale::Float(t) => t.size(),
            };
            (
                rows * cols,
                rows.div_ceil(block_rows) * cols.div_ceil(block_cols) * s,
                0,
            )
        }
    }
}

fn dense_values(format: Format, n: usize) -> Vec<u8> {
    // Dense weights: finite small values (bf16/f16: high byte 0x3C; f32: exponent set).
    let mut v = fill(n, 1, None);
    match format {
        Format::Dense(FloatType::F32) => v.chunks_exact_mut(4).for_each(|w| w[3] = 0x3C),
        Format::Dense(_) => v.chunks_exact_mut(2).for_each(|w| w[1] = 0x3C),
        _ => {}
    }
    v
}

/// A sum of every 64-bit word, in parallel bands: the plain-read reference.
fn plain_read(buffers: &[Vec<u8>]) -> u64 {
    buffers
        .iter()
        .map(|b| {
            b.par_chunks(64 * 1024)
                .map(|band| {
                    band.as_chunks::<8>()
                        .0
                        .iter()
                        .fold(0u64, |s, w| s.wrapping_add(u64::from_le_bytes(*w)))
                })
                .reduce(|| 0, u64::wrapping_add)
        })
        .fold(0, u64::wrapping_add)
}

fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let a = args();
    rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build_global()
        .ok();
    // On a worker of the pool, as `minirun run` decodes: each product splits with the other
    // workers without a hand-off to the pool.
    rayon::scope(|_| measure(&a));
}

fn measure(a: &Args) {
    let formats: [(&str, Format); 8] = [
        (
            "affine 4-bit g64 bf16",
            Format::Affine {
                bits: 4,
                group: 64,
                scale: FloatType::BF16,
            },
        ),
        (
            "affine 8-bit g64 bf16",
            Format::Affine {
                bits: 8,
                group: 64,
                scale: FloatType::BF16,
            },
        ),
        ("mxfp4", Format::Mxfp4),
        (
            "fp8 e4m3 128x128 e8m0",
            Format::Fp8Block {
                block_rows: 128,
                block_cols: 128,
                scale: BlockScale::E8m0,
            },
        ),
        (
            "fp8 e4m3 128x128 f32",
            Format::Fp8Block {
                block_rows: 128,
                block_cols: 128,
                scale: BlockScale::Float(FloatType::F32),
            },
        ),
        ("bf16", Format::Dense(FloatType::BF16)),
        ("f16", Format::Dense(FloatType::F16)),
        ("f32", Format::Dense(FloatType::F32)),
    ];
    println!(
        "| format | shape (rows x cols) | matrices | kernel GB/s | plain read GB/s | ratio | batch of {n}: time vs {n} products | 8-bit activations GB/s | ratio | 8-bit batch of {n} vs {n} products |",
        n = a.batch
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, format) in formats {
        if a.only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let shapes = a
            .shape
            .map_or(vec![(2048, 7168), (7168, 2048)], |s| vec![s]);
        for (rows, cols) in shapes {
            let (p, s, b) = sizes(format, rows, cols);
            let per = p + s + b;
            let count = (a.mib << 20).div_ceil(per).max(1);
            let parts: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..count)
                .map(|i| {
                    let packed = match format {
                        Format::Dense(_) => dense_values(format, p),
                        // Real FP8 weights hold no NaN codes (0x7F, 0xFF).
                        Format::Fp8Block { .. } => fill(p, i as u64, None)
                            .into_iter()
                            .map(|b| if b & 0x7F == 0x7F { b ^ 1 } else { b })
                            .collect(),
                        _ => fill(p, i as u64, None),
                    };
                    (
                        packed,
                        fill(s, 7 + i as u64, Some(format)),
                        fill(b, 9 + i as u64, Some(format)),
                    )
                })
                .collect();
            let matrices: Vec<QMatrix> = parts
                .iter()
                .map(|(p, s, b)| {
                    QMatrix::new(format, rows, cols, p, s, b).expect("a consistent matrix")
                })
                .collect();
            let x: Vec<f32> = (0..cols).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
            let mut y = vec![0f32; rows];
            let total = (per * count) as f64;
            let kernel = best_of(a.repeats, || {
                for m in &matrices {
                    m.matvec(&x, &mut y).expect("the product runs");
                }
            });
            let xs: Vec<f32> = (0..a.batch).flat_map(|_| x.iter().copied()).collect();
            let mut ys = vec![0f32; a.batch * rows];
            let batched = best_of(a.repeats, || {
                for m in &matrices {
                    m.matmul(&xs, a.batch, &mut ys).expect("the product runs");
                }
            });
            // Affine 4- and 8-bit and MXFP4 with 8-bit activations, the input quantized for every
            // product.
            let int8_group = match format {
                Format::Affine {
                    bits: 4 | 8, group, ..
                } => Some(group),
                Format::Mxfp4 => Some(32),
                _ => None,
            };
            let int8 = int8_group.map(|group| {
                let lone = best_of(a.repeats, || {
                    for m in &matrices {
                        let q = Int8Vector::quantize(&x, group).expect("a group of the matrix");
                        m.matvec_int8(&q, &mut y).expect("the product runs");
                    }
                });
                let batched = best_of(a.repeats, || {
                    for m in &matrices {
                        m.with_activations(Activations::Int8)
                            .matmul(&xs, a.batch, &mut ys)
                            .expect("the product runs");
                    }
                });
                (lone, batched)
            });
            let all: Vec<Vec<u8>> = parts.into_iter().flat_map(|(p, s, b)| [p, s, b]).collect();
            let mut sink = 0;
            let read = best_of(a.repeats, || sink ^= plain_read(&all));
            std::hint::black_box((sink, &y, &ys));
            let (k, r) = (total / kernel / 1e9, total / read / 1e9);
            let int8 = int8.map_or("| - | - | - |".to_string(), |(t, batched)| {
                let g = total / t / 1e9;
                format!(
                    "| {g:.2} | {:.2} | {:.2} |",
                    g / r,
                    batched / (a.batch as f64 * t)
                )
            });
            println!(
                "| {name} | {rows} x {cols} | {count} | {k:.2} | {r:.2} | {:.2} | {:.2} {int8}",
                k / r,
                batched / (a.batch as f64 * kernel)
            );
        }
    }
}
