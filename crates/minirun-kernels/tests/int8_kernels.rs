//! Affine 4- and 8-bit and MXFP4 products with 8-bit activations (`QMatrix::matvec_int8`): the
//! SIMD and portable paths give the same bits, so do one and two threads; the result stays
//! within the error the activations' rounding allows of the exact product
//! (`kernels::reference`); other formats, mismatched groups and lengths are refused; NaN inputs
//! propagate.

mod common;

use common::matrices::{Rng, Stored, float_bytes};
use common::on_threads;
use minirun_kernels::{Activations, FloatType, Format, Int8Vector, QMatrix, reference};
use proptest::prelude::*;

const FLOATS: [FloatType; 3] = [FloatType::BF16, FloatType::F16, FloatType::F32];

/// An affine 4-bit matrix of `groups` groups per row (an odd count of 32-column blocks
/// included, which the SIMD path pads).
fn affine4(rows: usize, group: usize, groups: usize, scale: FloatType, seed: u64) -> Stored {
    affine(4, rows, group, groups, scale, seed)
}

/// An affine matrix of `bits`-bit codes, `groups` groups per row.
fn affine(
    bits: u32,
    rows: usize,
    group: usize,
    groups: usize,
    scale: FloatType,
    seed: u64,
) -> Stored {
    let mut rng = Rng(seed);
    let cols = group * groups;
    let n = rows * groups;
    Stored {
        format: Format::Affine { bits, group, scale },
        rows,
        cols,
        packed: (0..rows * cols * bits as usize / 8)
            .map(|_| rng.next() as u8)
            .collect(),
        scales: float_bytes(scale, &rng.floats(n, 0.1)),
        biases: float_bytes(scale, &rng.floats(n, 1.0)),
    }
}

/// An MXFP4 matrix of `groups` groups of 32 per row, its scale bytes drawn from `exponents`
/// (the codes 0 and 0xFF included where the caller asks for them).
fn mxfp4(rows: usize, groups: usize, exponents: &[u8], seed: u64) -> Stored {
    let mut rng = Rng(seed);
    let cols = 32 * groups;
    Stored {
        format: Format::Mxfp4,
        rows,
        cols,
        packed: (0..rows * cols / 2).map(|_| rng.next() as u8).collect(),
        scales: (0..rows * groups)
            .map(|_| exponents[rng.next() as usize % exponents.len()])
            .collect(),
        biases: Vec::new(),
    }
}

/// Scale codes around 2^0: products stay finite.
const MODERATE_EXPONENTS: [u8; 6] = [120, 124, 126, 127, 128, 131];

fn input(cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed ^ 0x5EED);
    (0..cols).map(|_| rng.unit() * 3.0).collect()
}

fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

/// The largest error 8-bit activations may add to row `r` of the exact product: each code
/// stands for its input within half a step (plus f32 rounding of the division), so a group adds
/// at most its scale x step_g / 2 x the sum of its weights' magnitudes (affine: the codes);
/// f32 rounding of the fold and of the group sums adds the rest.
fn allowed_error(m: &QMatrix, r: usize, x: &[f32], size: f64) -> f64 {
    let group = match m.format() {
        Format::Affine { group, .. } => group,
        Format::Mxfp4 => 32,
        other => unreachable!("{other:?} takes no 8-bit activations"),
    };
    let groups = m.cols() / group;
    let mut bound = size * 2f64.powi(-16);
    for g in 0..groups {
        let cols = g * group..(g + 1) * group;
        let amax = x[cols.clone()]
            .iter()
            .fold(0f64, |a, v| a.max(f64::from(v.abs())));
        let nibble = |k: usize| {
            let cell = r * m.cols() + k;
            (m.packed()[cell / 2] >> (4 * (cell % 2))) & 15
        };
        let (s, weights): (f64, f64) = match m.format() {
            Format::Affine { bits: 8, scale, .. } => (
                reference::float(scale, m.scales(), r * groups + g).abs(),
                cols.map(|k| f64::from(m.packed()[r * m.cols() + k])).sum(),
            ),
            Format::Affine { scale, .. } => (
                reference::float(scale, m.scales(), r * groups + g).abs(),
                cols.map(|k| f64::from(nibble(k))).sum(),
            ),
            _ => (
                reference::e8m0(m.scales()[r * groups + g]),
                cols.map(|k| reference::e2m1(nibble(k)).abs()).sum(),
            ),
        };
        bound += s * (amax / 127.0) * (0.5 + 1e-5) * weights;
    }
    bound
}

/// The fast (VNNI where present), AVX2 and portable paths give the same bits for `m x`, and
/// each row stays within `allowed_error` of the f64 reference.
fn check_paths_and_error(m: &QMatrix, group: usize, seed: u64) -> Result<(), TestCaseError> {
    let x = input(m.cols(), seed);
    let q = Int8Vector::quantize(&x, group).unwrap();
    let mut fast = vec![0f32; m.rows()];
    let mut portable = vec![0f32; m.rows()];
    m.matvec_int8(&q, &mut fast).unwrap();
    m.matvec_int8_portable(&q, &mut portable).unwrap();
    prop_assert_eq!(bits(&fast), bits(&portable));
    let mut avx2 = vec![0f32; m.rows()];
    m.with_activations(Activations::Int8)
        .matmul_int8_avx2(&x, 1, &mut avx2)
        .unwrap();
    prop_assert_eq!(bits(&avx2), bits(&portable));
    for (r, (&got, &(exact, size))) in fast.iter().zip(&reference::matvec(m, &x)).enumerate() {
        let allowed = allowed_error(m, r, &x, size);
        prop_assert!(
            (f64::from(got) - exact).abs() <= allowed,
            "{:?} row {r}: int8 {got}, exact {exact}, allowed {allowed}",
            m.format()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn simd_and_portable_paths_agree_bit_for_bit_and_stay_near_the_exact_product(
        rows in 1usize..12, pick in 0usize..9, groups in 1usize..20, eight_bit: bool, seed: u64,
    ) {
        let group = [32, 64, 128][pick % 3];
        let code_bits = if eight_bit { 8 } else { 4 };
        let stored = affine(code_bits, rows, group, groups, FLOATS[pick / 3], seed);
        check_paths_and_error(&stored.matrix(), group, seed)?;
    }

    #[test]
    fn mxfp4_simd_and_portable_paths_agree_bit_for_bit_and_stay_near_the_exact_product(
        rows in 1usize..12, groups in 1usize..40, seed: u64,
    ) {
        let stored = mxfp4(rows, groups, &MODERATE_EXPONENTS, seed);
        check_paths_and_error(&stored.matrix(), 32, seed)?;
    }
}

/// The scale codes the exponent-bits formula misses (0: 2^-127; 0xFF: NaN) and the extremes
/// beside them give the portable path's bits through the SIMD code, in the eight-group blocks
/// and in the tail; a row with a 0xFF scale is NaN, one with only 0 scales tiny but not zero.
#[test]
fn mxfp4_special_scale_codes_match_the_portable_path() {
    let x = input(32 * 19, 3);
    let q = Int8Vector::quantize(&x, 32).unwrap();
    for exponents in [&[0u8, 1, 2, 254][..], &[0, 255, 127], &[0]] {
        let stored = mxfp4(9, 19, exponents, 17);
        let m = stored.matrix();
        let mut fast = vec![0f32; m.rows()];
        let mut portable = vec![0f32; m.rows()];
        m.matvec_int8(&q, &mut fast).unwrap();
        m.matvec_int8_portable(&q, &mut portable).unwrap();
        assert_eq!(bits(&fast), bits(&portable), "scale codes {exponents:?}");
        for (r, &y) in fast.iter().enumerate() {
            let scales = &m.scales()[r * 19..(r + 1) * 19];
            if scales.contains(&255) {
                assert!(y.is_nan(), "row {r}: {y} with a NaN scale");
            } else if scales.iter().all(|&e| e == 0) {
                assert!(
                    y != 0.0 && y.abs() < 1e-30,
                    "row {r}: {y} with scales of 2^-127"
                );
            }
        }
    }
}

#[test]
fn one_and_two_threads_give_the_same_bits() {
    let stored = affine4(512, 64, 32, FloatType::BF16, 7);
    let m = stored.matrix();
    let q = Int8Vector::quantize(&input(m.cols(), 7), 64).unwrap();
    let run = |threads| {
        on_threads(threads, || {
            let mut y = vec![0f32; m.rows()];
            m.matvec_int8(&q, &mut y).unwrap();
            bits(&y)
        })
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn the_result_differs_from_the_exact_path_only_by_the_rounding_of_activations() {
    // Activations that are already multiples of their group's step (codes -127..127 times
    // amax / 127 with amax = 127) quantize without error: the integer path then computes the
    // exact products, so it lands within f32 rounding of the reference.
    let stored = affine4(8, 64, 4, FloatType::F32, 3);
    let m = stored.matrix();
    let x: Vec<f32> = (0..m.cols())
        .map(|k| {
            if k % 64 == 0 {
                127.0
            } else {
                (k % 255) as f32 - 127.0
            }
        })
        .collect();
    let q = Int8Vector::quantize(&x, 64).unwrap();
    let mut y = vec![0f32; m.rows()];
    m.matvec_int8(&q, &mut y).unwrap();
    for (&got, &(exact, size)) in y.iter().zip(&reference::matvec(&m, &x)) {
        assert!(
            (f64::from(got) - exact).abs() <= size * 2f64.powi(-16),
            "{got} vs {exact}"
        );
    }
}

#[test]
fn zero_and_nan_inputs() {
    let stored = affine4(4, 32, 3, FloatType::BF16, 11);
    let m = stored.matrix();
    let mut y = vec![1f32; 4];
    m.matvec_int8(
        &Int8Vector::quantize(&vec![0.0; m.cols()], 32).unwrap(),
        &mut y,
    )
    .unwrap();
    assert!(y.iter().all(|&v| v == 0.0), "{y:?}");
    let mut x = input(m.cols(), 11);
    x[40] = f32::NAN;
    m.matvec_int8(&Int8Vector::quantize(&x, 32).unwrap(), &mut y)
        .unwrap();
    assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
}

#[test]
fn other_formats_groups_and_lengths_are_refused() {
    let stored = affine4(4, 64, 2, FloatType::BF16, 5);
    let m = stored.matrix();
    let mut y = vec![0f32; 4];
    let other_group = Int8Vector::quantize(&input(128, 5), 32).unwrap();
    let err = m.matvec_int8(&other_group, &mut y).unwrap_err();
    assert!(err.to_string().contains("group"), "{err}");
    let short = Int8Vector::quantize(&input(64, 5), 64).unwrap();
    assert!(m.matvec_int8(&short, &mut y).is_err());
    assert!(
        m.matvec_int8(
            &Int8Vector::quantize(&input(128, 5), 64).unwrap(),
            &mut [0.0; 3]
        )
        .is_err()
    );

    let dense = [0u8; 4 * 64 * 4];
    let f32_matrix = QMatrix::new(Format::Dense(FloatType::F32), 4, 64, &dense, &[], &[]).unwrap();
    let q = Int8Vector::quantize(&input(64, 5), 64).unwrap();
    let err = f32_matrix.matvec_int8(&q, &mut y).unwrap_err();
    assert!(
        err.to_string()
            .contains("affine 4- and 8-bit and MXFP4 only"),
        "{err}"
    );
    let fp8 = [0u8; 4 * 128];
    let fp8_matrix = QMatrix::new(
        Format::Fp8Block {
            block_rows: 128,
            block_cols: 128,
            scale: minirun_kernels::BlockScale::E8m0,
        },
        4,
        128,
        &fp8,
        &[127],
        &[],
    )
    .unwrap();
    let q128 = Int8Vector::quantize(&input(128, 5), 32).unwrap();
    assert!(fp8_matrix.matvec_int8(&q128, &mut y).is_err());
    let mxfp4_matrix = mxfp4(4, 4, &MODERATE_EXPONENTS, 5);
    let err = mxfp4_matrix
        .matrix()
        .matvec_int8(&Int8Vector::quantize(&input(128, 5), 64).unwrap(), &mut y)
        .unwrap_err();
    assert!(err.to_string().contains("group"), "{err}");
    assert!(Int8Vector::quantize(&input(100, 5), 64).is_err());
    assert!(Int8Vector::quantize(&[], 64).is_err());
}

/// A product big enough to quantize its batch and transpose its outputs on every worker (rows
/// past a whole number of transpose bands) gives each vector the bits of its own product.
#[test]
fn a_large_batch_split_between_workers_keeps_each_vectors_bits() {
    let stored = affine(4, 2100, 64, 2, FloatType::BF16, 5);
    let m = stored.matrix().with_activations(Activations::Int8);
    let batch = 9;
    let xs: Vec<f32> = (0..batch)
        .flat_map(|b| input(m.cols(), 300 + b as u64))
        .collect();
    let mut alone = Vec::new();
    for x in xs.chunks_exact(m.cols()) {
        let mut y = vec![0f32; m.rows()];
        m.matvec(x, &mut y).unwrap();
        alone.extend(bits(&y));
    }
    let split = on_threads(2, || {
        let mut ys = vec![0f32; batch * m.rows()];
        m.matmul(&xs, batch, &mut ys).unwrap();
        bits(&ys)
    });
    assert_eq!(split, alone);
}

/// A batch (prefill) gives each vector the bits of its own product, through the SIMD and the
/// portable code, on one thread and on two; `matvec` on a matrix set to 8-bit activations is
/// `matvec_int8`.
#[test]
fn a_batch_gives_each_vector_the_bits_of_its_own_product() {
    // (bits, group, groups): 0 bits for MXFP4 (an even group count takes octets of rows, an
    // odd one the row path). Rows of fewer than eight groups take octets even alone, their
    // per-group floats read past each row's end but the matrix's.
    let cases = [
        (4, 32, 5),
        (4, 64, 20),
        (4, 128, 9),
        (4, 64, 2),
        (4, 128, 1),
        (8, 64, 3),
        (0, 32, 21),
        (0, 32, 20),
        (0, 32, 2),
        (8, 32, 11),
        (8, 64, 9),
        (8, 128, 10),
    ];
    for (code_bits, group, groups) in cases {
        let stored = match code_bits {
            0 => mxfp4(300, groups, &MODERATE_EXPONENTS, 21),
            _ => affine(code_bits, 300, group, groups, FloatType::BF16, group as u64),
        };
        let m = stored.matrix().with_activations(Activations::Int8);
        // 1 takes the row path, the others octets of rows (300 rows: 37 octets and 4 rows).
        for batch in [1, 2, 4, 5, 9] {
            let xs: Vec<f32> = (0..batch)
                .flat_map(|b| input(m.cols(), 100 + b as u64))
                .collect();
            let mut alone = Vec::new();
            for x in xs.chunks_exact(m.cols()) {
                let mut y = vec![0f32; m.rows()];
                m.matvec_int8(&Int8Vector::quantize(x, group).unwrap(), &mut y)
                    .unwrap();
                let mut through_matvec = vec![0f32; m.rows()];
                m.matvec(x, &mut through_matvec).unwrap();
                assert_eq!(
                    bits(&through_matvec),
                    bits(&y),
                    "{code_bits} bits group {group}: matvec"
                );
                alone.extend(bits(&y));
            }
            for threads in [1, 2] {
                let (fast, vnni256, avx2, portable) = on_threads(threads, || {
                    let mut fast = vec![0f32; batch * m.rows()];
                    let mut vnni256 = vec![0f32; batch * m.rows()];
                    let mut avx2 = vec![0f32; batch * m.rows()];
                    let mut portable = vec![0f32; batch * m.rows()];
                    m.matmul(&xs, batch, &mut fast).unwrap();
                    m.matmul_int8_vnni256(&xs, batch, &mut vnni256).unwrap();
                    m.matmul_int8_avx2(&xs, batch, &mut avx2).unwrap();
                    m.matmul_int8_portable(&xs, batch, &mut portable).unwrap();
                    (bits(&fast), bits(&vnni256), bits(&avx2), bits(&portable))
                });
                // `matmul` takes the widest VNNI the machine has (sixteen rows at a time with
                // 512-bit registers); the 256-bit VNNI and AVX2 paths must agree.
                assert_eq!(
                    fast, alone,
                    "{code_bits} bits group {group} batch {batch} {threads} threads"
                );
                assert_eq!(
                    vnni256, alone,
                    "{code_bits} bits group {group} batch {batch} 256-bit VNNI"
                );
                assert_eq!(
                    avx2, alone,
                    "{code_bits} bits group {group} batch {batch} AVX2"
                );
                assert_eq!(
                    portable, alone,
                    "{code_bits} bits group {group} batch {batch} portable"
                );
            }
        }
    }
}
