//! Every kernel against the scalar reference (`kernels::reference`), over random shapes and
//! bytes; the edge cases by name; and bit-identity across thread counts and row bands.

mod common;

use common::matrices::{Rng, Stored, float_bytes};
use common::on_threads;
use minirun_kernels::{BlockScale, FloatType, Format, QMatrix, SERIAL_CELLS, decode, reference};
use proptest::prelude::*;

const FLOATS: [FloatType; 3] = [FloatType::F32, FloatType::F16, FloatType::BF16];

fn make(kind: usize, rows: usize, segments: usize, pick: usize, seed: u64) -> Stored {
    let float = FLOATS[pick % 3];
    let (format, cols) = match kind % 5 {
        0 => (Format::Dense(float), 8 * segments),
        1 => {
            let group = [32, 64, 128][pick % 3];
            let bits = if pick.is_multiple_of(2) { 4 } else { 8 };
            (
                Format::Affine {
                    bits,
                    group,
                    scale: float,
                },
                group * segments,
            )
        }
        2 => (Format::Mxfp4, 32 * segments),
        3 => {
            // Partial last blocks in both directions.
            let block_cols = [8, 16, 128][pick % 3];
            let scale = if pick.is_multiple_of(2) {
                BlockScale::E8m0
            } else {
                BlockScale::Float(float)
            };
            (
                Format::Fp8Block {
                    block_rows: 1 + pick % 5,
                    block_cols,
                    scale,
                },
                8 * (segments * 3 + 1),
            )
        }
        _ => (
            Format::Affine {
                bits: 4,
                group: 32,
                scale: FloatType::BF16,
            },
            32 * segments,
        ),
    };
    stored(format, rows, cols, seed)
}

/// A matrix of `format` with random codes and moderate scales drawn from `seed`.
fn stored(format: Format, rows: usize, cols: usize, seed: u64) -> Stored {
    let mut rng = Rng(seed);
    let cells = rows * cols;
    let (packed, scales, biases) = match format {
        Format::Dense(t) => (float_bytes(t, &rng.floats(cells, 2.0)), vec![], vec![]),
        Format::Affine { bits, group, scale } => {
            let groups = rows * cols / group;
            let packed = rng.bytes(cells * bits as usize / 8);
            (
                packed,
                float_bytes(scale, &rng.floats(groups, 0.1)),
                float_bytes(scale, &rng.floats(groups, 1.0)),
            )
        }
        Format::Mxfp4 => {
            let scales = (0..cells / 32).map(|_| 110 + rng.byte() % 30).collect();
            (rng.bytes(cells / 2), scales, vec![])
        }
        Format::Fp8Block { .. } => {
            let (packed, scales) = fp8_bytes(&mut rng, format, rows, cols);
            (packed, scales, vec![])
        }
    };
    Stored {
        format,
        rows,
        cols,
        packed,
        scales,
        biases,
    }
}

/// Random e4m3 codes without the NaN pattern (the NaN cases have their own test) and moderate
/// block scales.
fn fp8_bytes(rng: &mut Rng, format: Format, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let Format::Fp8Block {
        block_rows,
        block_cols,
        scale,
    } = format
    else {
        panic!("not an FP8 format: {format:?}");
    };
    let grid = rows.div_ceil(block_rows) * cols.div_ceil(block_cols);
    let packed = (0..rows * cols)
        .map(|_| rng.byte())
        .map(|b| if b & 0x7F == 0x7F { b ^ 1 } else { b })
        .collect();
    let scales = match scale {
        BlockScale::E8m0 => (0..grid).map(|_| 115 + rng.byte() % 20).collect(),
        BlockScale::Float(t) => float_bytes(t, &rng.floats(grid, 0.01)),
    };
    (packed, scales)
}

fn input(cols: usize, seed: u64) -> Vec<f32> {
    Rng(seed ^ 0xABCD).floats(cols, 2.0)
}

/// `matvec` (the widest SIMD path the machine has), the 512-bit path without VBMI's byte
/// picks and the 256-bit path against `matvec_portable`, bit for bit, on an input drawn from
/// `seed`.
fn assert_simd_has_the_portable_bits(m: &QMatrix, seed: u64) {
    let x = input(m.cols(), seed);
    let (mut fast, mut narrow) = (vec![0f32; m.rows()], vec![0f32; m.rows()]);
    let (mut unpicked, mut portable) = (vec![0f32; m.rows()], vec![0f32; m.rows()]);
    m.matvec(&x, &mut fast).unwrap();
    m.matvec_512bit_without_vbmi(&x, &mut unpicked).unwrap();
    m.matvec_256bit(&x, &mut narrow).unwrap();
    m.matvec_portable(&x, &mut portable).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let what = format!("{:?} {} x {}", m.format(), m.rows(), m.cols());
    assert_eq!(bits(&fast), bits(&portable), "{what}");
    assert_eq!(
        bits(&unpicked),
        bits(&portable),
        "{what}: 512-bit without VBMI"
    );
    assert_eq!(bits(&narrow), bits(&portable), "{what}: 256-bit");
}

/// The E8M0 scale bytes with special values (0 is 2^-127, 255 is NaN) give every path the
/// portable bits: over twenty groups a row, so that scales held sixteen at a time run past one
/// load into a shorter one, with the NaN scale in one row and group at a time.
#[test]
fn special_mxfp4_scale_bytes_give_every_path_the_same_bits() {
    let (rows, cols) = (8, 32 * 20);
    let groups = rows * cols / 32;
    let mut rng = Rng(77);
    let packed = rng.bytes(rows * cols / 2);
    for nan_at in (0..groups).step_by(7) {
        let scales: Vec<u8> = (0..groups)
            .map(|i| match (i % 5, i == nan_at) {
                (_, true) => 0xFF,
                (0, _) => 0,
                // Row 1 has every scale 2^-127, so no larger scale hides a wrong one.
                _ if i / 20 == 1 => 0,
                (1, _) => 1,
                (2, _) => 200,
                _ => 110 + (i % 30) as u8,
            })
            .collect();
        let m = QMatrix::new(Format::Mxfp4, rows, cols, &packed, &scales, &[]).unwrap();
        assert_simd_has_the_portable_bits(&m, nan_at as u64);
        let mut y = vec![0f32; rows];
        m.matvec(&input(cols, 1), &mut y).unwrap();
        let nan_rows: Vec<usize> = (0..rows).filter(|&r| y[r].is_nan()).collect();
        assert_eq!(
            nan_rows,
            [nan_at / 20],
            "only the row with the NaN scale is NaN"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The kernel's f32 result is within f32 summation error of the exact (f64) product:
    /// at most 2^-17 of the sum of the terms' magnitudes (a row of at most 8 x 130 chunk
    /// additions per lane, 8 lanes and 3 folding steps stays far inside that).
    #[test]
    fn matvec_matches_the_reference(kind in 0usize..5, rows in 1usize..24, segments in 1usize..9, pick in 0usize..30, seed: u64) {
        let stored = make(kind, rows, segments, pick, seed);
        let m = stored.matrix();
        let x = input(m.cols(), seed);
        let mut y = vec![0f32; m.rows()];
        m.matvec(&x, &mut y).unwrap();
        for (r, (&got, &(exact, size))) in y.iter().zip(&reference::matvec(&m, &x)).enumerate() {
            let tolerance = size * 2f64.powi(-17) + 1e-30;
            prop_assert!((f64::from(got) - exact).abs() <= tolerance,
                "{:?} {}x{} row {r}: kernel {got}, reference {exact}, tolerance {tolerance}", m.format(), m.rows(), m.cols());
        }
    }

    /// Dequantizing a row is one f32 operation per element: equal to the reference's value
    /// rounded to f32 (affine: the f32 product rounded, then the bias added in f32).
    #[test]
    fn dequantized_rows_match_the_reference(kind in 0usize..5, rows in 1usize..6, segments in 1usize..5, pick in 0usize..30, seed: u64) {
        let stored = make(kind, rows, segments, pick, seed);
        let m = stored.matrix();
        let mut out = vec![0f32; m.cols()];
        for r in 0..m.rows() {
            m.dequantize_row(r, &mut out).unwrap();
            for (k, &got) in out.iter().enumerate() {
                let expected = match m.format() {
                    Format::Affine { bits, group, scale } => {
                        let cell = r * m.cols() + k;
                        let q = if bits == 4 { (m.packed()[cell / 2] >> (4 * (cell % 2))) & 15 } else { m.packed()[cell] };
                        let g = r * (m.cols() / group) + k / group;
                        let s = reference::float(scale, m.scales(), g) as f32;
                        let b = reference::float(scale, m.biases(), g) as f32;
                        s * f32::from(q) + b
                    }
                    _ => reference::element(&m, r, k).0 as f32,
                };
                prop_assert_eq!(got.to_bits(), expected.to_bits(), "{:?} ({}, {})", m.format(), r, k);
            }
        }
    }
}

/// The documented order is per row, so 1 and 2 threads (and any band of rows) give the same
/// bits. Large enough that the 2-thread run really splits the rows.
#[test]
fn results_are_bit_identical_on_one_or_two_threads_and_in_bands() {
    for kind in 0..5 {
        for pick in 0..6 {
            let stored = make(kind, 4200, 8, pick, 7 + pick as u64);
            let m = stored.matrix();
            assert!(
                m.rows() * m.cols() >= SERIAL_CELLS,
                "the product must be big enough to run in parallel"
            );
            let x = input(m.cols(), 3);
            let run = |threads| {
                on_threads(threads, || {
                    let mut y = vec![0f32; m.rows()];
                    m.matvec(&x, &mut y).unwrap();
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                })
            };
            let one = run(1);
            assert_eq!(one, run(2), "{:?}", m.format());
            let mut band = vec![0f32; 37];
            m.matvec_rows(101..138, &x, &mut band).unwrap();
            assert_eq!(
                &one[101..138],
                band.iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
                    .as_slice()
            );
        }
    }
}

/// Where an explicit SIMD path runs (AVX2 on x86-64), it gives the same bits as the portable
/// code, row by row, including the four-rows-at-a-time loop and the leftover rows.
#[test]
fn the_simd_path_and_the_portable_path_give_the_same_bits() {
    for kind in 0..5 {
        for pick in 0..12 {
            for rows in [1, 3, 4, 7, 9] {
                let stored = make(kind, rows, 5, pick, 31 * pick as u64 + rows as u64);
                assert_simd_has_the_portable_bits(&stored.matrix(), pick as u64);
            }
        }
    }
}

/// The same comparison on bytes with every special code: FP8 matrices holding NaN codes (the
/// per-element NaN path) and f16 matrices of arbitrary bits (infinities, NaNs, subnormals).
/// NaN results compare as NaN: which NaN an add returns when both operands are NaN is the
/// compiler's choice of operand order.
#[test]
fn the_simd_path_and_the_portable_path_agree_on_special_codes() {
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("avx2") {
        eprintln!(
            "NOT EXERCISED: no AVX2 on this CPU, so this test compares the portable path with itself"
        );
    }
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for seed in 0..40u64 {
        let mut rng = Rng(seed);
        let rows = 1 + (seed as usize % 9);
        let cols = 8 * (1 + seed as usize % 40);
        let fp8 = Format::Fp8Block {
            block_rows: 2,
            block_cols: 16,
            scale: BlockScale::E8m0,
        };
        let f16 = Format::Dense(FloatType::F16);
        let grid = rows.div_ceil(2) * cols.div_ceil(16);
        let cases = [
            (
                fp8,
                rng.bytes(rows * cols),
                (0..grid)
                    .map(|_| 120 + rng.byte() % 10)
                    .collect::<Vec<u8>>(),
            ),
            (f16, rng.bytes(rows * cols * 2), Vec::new()),
        ];
        for (format, packed, scales) in cases {
            let m = QMatrix::new(format, rows, cols, &packed, &scales, &[]).unwrap();
            let x = input(cols, seed);
            let (mut fast, mut portable) = (vec![0f32; rows], vec![0f32; rows]);
            m.matvec(&x, &mut fast).unwrap();
            m.matvec_portable(&x, &mut portable).unwrap();
            for (r, (&a, &b)) in fast.iter().zip(&portable).enumerate() {
                assert!(same(a, b), "{format:?} {rows} x {cols} row {r}: {a} vs {b}");
            }
            // The batched kernels, both paths, on the same codes: vector 1 is `x`; five
            // vectors take a tile of four and one more.
            let others = (100..104)
                .map(|s| input(cols, seed + s))
                .collect::<Vec<_>>();
            let xs: Vec<f32> = [&others[0], &x, &others[1], &others[2], &others[3]]
                .into_iter()
                .flatten()
                .copied()
                .collect();
            let (mut fast_batch, mut portable_batch) = (vec![0f32; 5 * rows], vec![0f32; 5 * rows]);
            m.matmul(&xs, 5, &mut fast_batch).unwrap();
            m.matmul_portable(&xs, 5, &mut portable_batch).unwrap();
            for (r, &a) in fast_batch[rows..2 * rows].iter().enumerate() {
                assert!(
                    same(a, fast[r]),
                    "{format:?} matmul row {r}: {a} vs {}",
                    fast[r]
                );
            }
            for (i, (&a, &b)) in fast_batch.iter().zip(&portable_batch).enumerate() {
                assert!(same(a, b), "{format:?} matmul output {i}: {a} vs {b}");
            }
        }
    }
}

/// Every e4m3 code but the NaNs alone in a row of an FP8 matrix that holds no NaN code (the
/// path that widens through f16 where the CPU has F16C), and every f16 code alone in a row:
/// the SIMD product has the portable one's bits, so each code decodes to the same value.
#[test]
fn every_fp8_and_f16_code_alone_gives_the_portable_bits() {
    let x: Vec<f32> = (0..8).map(|k| 1.5 - k as f32 * 0.25).collect();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let fp8 = Format::Fp8Block {
        block_rows: 1,
        block_cols: 8,
        scale: BlockScale::E8m0,
    };
    let codes = (0u8..=255).filter(|c| c & 0x7F != 0x7F);
    let fp8_rows: Vec<Vec<u8>> = codes.map(|c| vec![c, 0x38, 0, 0, 0, 0, 0, 0xB8]).collect();
    let f16_rows: Vec<Vec<u8>> = (0..=u16::MAX)
        .step_by(8)
        .map(|first| (first..=first + 7).flat_map(u16::to_le_bytes).collect())
        .collect();
    for (format, rows, scales) in [
        (fp8, fp8_rows, vec![127u8]),
        (Format::Dense(FloatType::F16), f16_rows, vec![]),
    ] {
        for row in rows {
            let m = QMatrix::new(format, 1, 8, &row, &scales, &[]).unwrap();
            let (mut fast, mut portable) = ([0f32], [0f32]);
            m.matvec(&x, &mut fast).unwrap();
            m.matvec_portable(&x, &mut portable).unwrap();
            assert!(
                same(fast[0], portable[0]),
                "{format:?} {row:02x?}: {} vs {}",
                fast[0],
                portable[0]
            );
        }
    }
}

/// FP8, affine and MXFP4 rows of widths on both sides of where the prefetches run past a row's
/// end into the next, four rows at a time and a lone row after them (FP8's with four blocks in
/// flight); for FP8 block widths of odd and even chunk counts (decoded one chunk or two at a
/// time), a partial last block and row counts off the multiple of four: the portable bits, on
/// one thread and on two.
#[test]
fn rows_of_every_width_give_the_portable_bits() {
    let shapes = [
        (224, 24),
        (1032, 128),
        (4096, 16),
        (4104, 128),
        (7176, 8),
        (7176, 24),
    ];
    for (i, (cols, block_cols)) in shapes.into_iter().enumerate() {
        for (rows, scale) in [
            (1, BlockScale::E8m0),
            (5, BlockScale::Float(FloatType::F32)),
        ] {
            let format = Format::Fp8Block {
                block_rows: 2,
                block_cols,
                scale,
            };
            let mut rng = Rng(i as u64 * 7 + rows as u64);
            let (packed, scales) = fp8_bytes(&mut rng, format, rows, cols);
            let m = QMatrix::new(format, rows, cols, &packed, &scales, &[]).unwrap();
            let x = input(cols, i as u64);
            let mut portable = vec![0f32; rows];
            m.matvec_portable(&x, &mut portable).unwrap();
            let want: Vec<u32> = portable.iter().map(|f| f.to_bits()).collect();
            for threads in [1, 2] {
                let got = on_threads(threads, || {
                    let mut fast = vec![0f32; rows];
                    m.matvec(&x, &mut fast).unwrap();
                    fast
                });
                let got: Vec<u32> = got.iter().map(|f| f.to_bits()).collect();
                assert_eq!(
                    got, want,
                    "{rows} x {cols}, blocks of {block_cols}, {threads} threads"
                );
            }
        }
    }
    // An input so large that times 256 it would overflow (the F16C path then keeps its own
    // multiply by 256), beside ordinary ones: products that stay finite stay finite.
    let format = Format::Fp8Block {
        block_rows: 1,
        block_cols: 16,
        scale: BlockScale::E8m0,
    };
    let mut rng = Rng(5);
    let (mut packed, scales) = fp8_bytes(&mut rng, format, 3, 64);
    for row in packed.chunks_exact_mut(64) {
        row[17] = 0x38; // 1.0
    }
    let m = QMatrix::new(format, 3, 64, &packed, &scales, &[]).unwrap();
    let mut x = input(64, 3);
    x[17] = 2.0e36; // above 2^120: times 256 it is infinite
    let (mut fast, mut portable) = ([0f32; 3], [0f32; 3]);
    m.matvec(&x, &mut fast).unwrap();
    m.matvec_portable(&x, &mut portable).unwrap();
    assert!(portable.iter().all(|v| v.is_finite()), "{portable:?}");
    assert_eq!(fast.map(f32::to_bits), portable.map(f32::to_bits));
    // Affine rows of several widths (groups of 32, 64, 128, each scale type), four at a time
    // and the fifth alone; scales held sixteen groups at a time run into a shorter last load.
    for segments in [20, 65, 129] {
        for (i, (bits, group, scale)) in [4, 8]
            .into_iter()
            .flat_map(|bits| [32, 64, 128].map(|group| (bits, group)))
            .flat_map(|(bits, group)| FLOATS.map(|scale| (bits, group, scale)))
            .enumerate()
        {
            let format = Format::Affine { bits, group, scale };
            let seed = 17 * segments as u64 + i as u64;
            let stored = stored(format, 5, group * segments, seed);
            assert_simd_has_the_portable_bits(&stored.matrix(), i as u64);
        }
    }
    // MXFP4 rows of several widths, odd and even group counts (its rows go four at a time, the
    // fifth alone).
    for segments in [19, 20, 127, 128, 129, 130] {
        let stored = make(2, 5, segments, segments, 31 * segments as u64);
        assert_simd_has_the_portable_bits(&stored.matrix(), segments as u64);
    }
    // Every code in both halves of a pair of chunks decoded in one step.
    let pair = Format::Fp8Block {
        block_rows: 1,
        block_cols: 16,
        scale: BlockScale::E8m0,
    };
    let x: Vec<f32> = (0..16).map(|k| 1.75 - k as f32 * 0.25).collect();
    for code in (0u8..=255).filter(|c| c & 0x7F != 0x7F) {
        let mut row = [0x30u8; 16];
        (row[3], row[12]) = (code, code ^ 0x80);
        let m = QMatrix::new(pair, 1, 16, &row, &[127], &[]).unwrap();
        let (mut fast, mut portable) = ([0f32], [0f32]);
        m.matvec(&x, &mut fast).unwrap();
        m.matvec_portable(&x, &mut portable).unwrap();
        assert_eq!(fast[0].to_bits(), portable[0].to_bits(), "code {code:#04x}");
    }
}

/// A small-batch product gives every vector exactly the bits of its own matrix-vector product,
/// serially and in parallel.
#[test]
fn matmul_gives_each_vector_the_bits_of_its_matvec() {
    for kind in 0..5 {
        for (rows, batch) in [
            (5, 3),
            (1100, 4),
            (37, 1),
            (5, 6),
            (9, 9),
            (6, 2),
            (7, 7),
            (4, 11),
        ] {
            let stored = make(kind, rows, 8, kind + batch, 11 + rows as u64);
            let m = stored.matrix();
            let xs: Vec<f32> = (0..batch).flat_map(|b| input(m.cols(), b as u64)).collect();
            for threads in [1, 2] {
                let ys = on_threads(threads, || {
                    let mut ys = vec![0f32; batch * m.rows()];
                    m.matmul(&xs, batch, &mut ys).unwrap();
                    ys
                });
                let mut portable = vec![0f32; batch * m.rows()];
                m.matmul_portable(&xs, batch, &mut portable).unwrap();
                let mut narrow = vec![0f32; batch * m.rows()];
                m.matmul_256bit(&xs, batch, &mut narrow).unwrap();
                for (path, got) in [("widest", &ys), ("256-bit", &narrow)] {
                    assert!(
                        got.iter()
                            .zip(&portable)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?}: the {path} and portable batched kernels differ",
                        m.format()
                    );
                }
                for (b, x) in xs.chunks_exact(m.cols()).enumerate() {
                    let mut y = vec![0f32; m.rows()];
                    m.matvec(x, &mut y).unwrap();
                    let got = &ys[b * m.rows()..(b + 1) * m.rows()];
                    assert!(
                        got.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} {rows} rows, vector {b} of {batch}, {threads} threads",
                        m.format()
                    );
                }
            }
        }
    }
    let stored = make(0, 4, 2, 0, 1);
    let m = stored.matrix();
    assert!(
        m.matmul(&[0.0; 15], 1, &mut [0.0; 4]).is_err(),
        "xs of the wrong length"
    );
}

#[test]
fn decoders_agree_with_the_definitions_on_every_code() {
    for code in 0..16u8 {
        assert_eq!(
            decode::e2m1(u32::from(code)).to_bits(),
            (reference::e2m1(code) as f32).to_bits(),
            "e2m1 {code}"
        );
    }
    for byte in 0..=255u8 {
        let (fast, slow) = (decode::e4m3(u32::from(byte)), reference::e4m3(byte));
        assert!(
            fast.to_bits() == (slow as f32).to_bits() || (fast.is_nan() && slow.is_nan()),
            "e4m3 {byte:#04x}: {fast} vs {slow}"
        );
        let (fast, slow) = (decode::e8m0(u32::from(byte)), reference::e8m0(byte));
        assert!(
            fast.to_bits() == (slow as f32).to_bits() || (fast.is_nan() && slow.is_nan()),
            "e8m0 {byte}: {fast} vs {slow}"
        );
    }
    assert!(decode::e4m3(0x7F).is_nan() && decode::e4m3(0xFF).is_nan());
    assert_eq!(decode::e4m3(0x7E), 448.0);
    assert_eq!(decode::e4m3(0x01), 2f32.powi(-9));
    assert_eq!(decode::e8m0(0), 2f32.powi(-127));
    assert!(decode::e8m0(0xFF).is_nan());
    assert_eq!(decode::e8m0(254), 2f32.powi(127));
    for bits in 0..=u16::MAX {
        let want = half::bf16::from_bits(bits).to_f32();
        let got = decode::bf16(u32::from(bits));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "bf16 {bits:#06x}"
        );
        let want = half::f16::from_bits(bits).to_f32();
        let got = decode::f16(u32::from(bits));
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "f16 {bits:#06x}"
        );
    }
}

/// NaN codes are not silently zero or finite: a NaN element or a NaN scale makes its row NaN
/// and leaves the other rows alone.
#[test]
fn nan_codes_and_scales_propagate_to_their_row_only() {
    let format = Format::Fp8Block {
        block_rows: 1,
        block_cols: 32,
        scale: BlockScale::E8m0,
    };
    let mut packed = vec![0x38u8; 4 * 64]; // e4m3 0x38 = 1.0
    let mut scales = vec![127u8; 4 * 2]; // 2^0
    packed[5] = 0x7F; // row 0: NaN element
    packed[64 + 9] = 0xFF; // row 1: negative NaN element
    scales[2 * 2 + 1] = 0xFF; // row 2, second block: NaN scale
    let m = QMatrix::new(format, 4, 64, &packed, &scales, &[]).unwrap();
    let mut y = vec![0f32; 4];
    m.matvec(&[1.0; 64], &mut y).unwrap();
    assert!(y[0].is_nan() && y[1].is_nan() && y[2].is_nan(), "{y:?}");
    assert_eq!(y[3], 64.0);

    let scales = [0u8, 0xFF];
    let packed = [0x22u8; 32]; // e2m1 code 2 = 1.0 in both nibbles
    let m = QMatrix::new(Format::Mxfp4, 2, 32, &packed, &scales, &[]).unwrap();
    m.matvec(&[1.0; 32], &mut y[..2]).unwrap();
    assert_eq!(y[0], 32.0 * 2f32.powi(-127), "e8m0 0 is 2^-127, not zero");
    assert!(y[1].is_nan());
}

#[test]
fn inconsistent_byte_lengths_and_shapes_are_refused() {
    let f = Format::Affine {
        bits: 4,
        group: 64,
        scale: FloatType::BF16,
    };
    assert!(QMatrix::new(f, 2, 64, &[0; 64], &[0; 4], &[0; 4]).is_ok());
    assert!(QMatrix::new(f, 2, 64, &[0; 63], &[0; 4], &[0; 4]).is_err());
    assert!(QMatrix::new(f, 2, 64, &[0; 64], &[0; 4], &[]).is_err());
    assert!(
        QMatrix::new(f, 2, 96, &[0; 96], &[0; 4], &[0; 4]).is_err(),
        "96 is not a multiple of 64"
    );
    let f = Format::Affine {
        bits: 3,
        group: 64,
        scale: FloatType::BF16,
    };
    assert!(QMatrix::new(f, 2, 64, &[0; 48], &[0; 4], &[0; 4]).is_err());
    assert!(
        QMatrix::new(Format::Dense(FloatType::F32), 1, 12, &[0; 48], &[], &[]).is_err(),
        "cols % 8"
    );
    let m = QMatrix::new(Format::Dense(FloatType::F32), 1, 8, &[0; 32], &[], &[]).unwrap();
    assert!(m.matvec(&[0.0; 7], &mut [0.0]).is_err());
    assert!(m.matvec_rows(0..2, &[0.0; 8], &mut [0.0; 2]).is_err());
}

#[test]
fn vecmat_is_the_transposed_product_of_dequantized_rows() {
    let stored = make(3, 20, 3, 1, 99);
    let m = stored.matrix();
    let x = input(10, 5);
    let mut y = vec![0f32; m.cols()];
    m.vecmat_rows(4..14, &x, &mut y).unwrap();
    for (c, &got) in y.iter().enumerate() {
        let (exact, size) = (4..14).fold((0.0, 0.0), |(s, b), r| {
            let (w, bound) = reference::element(&m, r, c);
            (
                s + w * f64::from(x[r - 4]),
                b + bound * f64::from(x[r - 4]).abs(),
            )
        });
        assert!(
            (f64::from(got) - exact).abs() <= size * 1e-6 + 1e-30,
            "col {c}"
        );
    }
}
