//! Affine 4-bit products with 8-bit activations (`QMatrix::matvec_int8`): the SIMD and
//! portable paths give the same bits, so do one and two threads; the result stays within the
//! error the activations' rounding allows of the exact product (`kernels::reference`); other
//! formats, mismatched groups and lengths are refused; NaN inputs propagate.

mod common;

use common::matrices::{Rng, Stored, float_bytes};
use common::on_threads;
use minirun_runtime::kernels::{Activations, FloatType, Format, Int8Vector, QMatrix, reference};
use proptest::prelude::*;

const FLOATS: [FloatType; 3] = [FloatType::BF16, FloatType::F16, FloatType::F32];

/// An affine 4-bit matrix of `groups` groups per row (an odd count of 32-column blocks
/// included, which the SIMD path pads).
fn affine4(rows: usize, group: usize, groups: usize, scale: FloatType, seed: u64) -> Stored {
    let mut rng = Rng(seed);
    let cols = group * groups;
    let n = rows * groups;
    Stored {
        format: Format::Affine {
            bits: 4,
            group,
            scale,
        },
        rows,
        cols,
        packed: (0..rows * cols / 2).map(|_| rng.next() as u8).collect(),
        scales: float_bytes(scale, &rng.floats(n, 0.1)),
        biases: float_bytes(scale, &rng.floats(n, 1.0)),
    }
}

fn input(cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed ^ 0x5EED);
    (0..cols).map(|_| rng.unit() * 3.0).collect()
}

fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

/// The largest error 8-bit activations may add to row `r` of the exact product: each code
/// stands for its input within half a step (plus f32 rounding of the division), so a group adds
/// at most |s_g| x step_g / 2 x the sum of its weight codes; f32 rounding of the fold and of the
/// group sums adds the rest.
fn allowed_error(m: &QMatrix, r: usize, x: &[f32], size: f64) -> f64 {
    let Format::Affine { group, scale, .. } = m.format() else {
        unreachable!("affine matrices only")
    };
    let groups = m.cols() / group;
    let mut bound = size * 2f64.powi(-16);
    for g in 0..groups {
        let cols = g * group..(g + 1) * group;
        let amax = x[cols.clone()]
            .iter()
            .fold(0f64, |a, v| a.max(f64::from(v.abs())));
        let codes: f64 = cols
            .map(|k| {
                let cell = r * m.cols() + k;
                f64::from((m.packed()[cell / 2] >> (4 * (cell % 2))) & 15)
            })
            .sum();
        let s = reference::float(scale, m.scales(), r * groups + g).abs();
        bound += s * (amax / 127.0) * (0.5 + 1e-5) * codes;
    }
    bound
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn simd_and_portable_paths_agree_bit_for_bit_and_stay_near_the_exact_product(
        rows in 1usize..12, pick in 0usize..9, groups in 1usize..20, seed: u64,
    ) {
        let group = [32, 64, 128][pick % 3];
        let stored = affine4(rows, group, groups, FLOATS[pick / 3], seed);
        let m = stored.matrix();
        let x = input(m.cols(), seed);
        let q = Int8Vector::quantize(&x, group).unwrap();
        let mut fast = vec![0f32; rows];
        let mut portable = vec![0f32; rows];
        m.matvec_int8(&q, &mut fast).unwrap();
        m.matvec_int8_portable(&q, &mut portable).unwrap();
        prop_assert_eq!(bits(&fast), bits(&portable));
        let mut avx2 = vec![0f32; rows];
        m.with_activations(Activations::Int8).matmul_int8_avx2(&x, 1, &mut avx2).unwrap();
        prop_assert_eq!(bits(&avx2), bits(&portable));
        for (r, (&got, &(exact, size))) in fast.iter().zip(&reference::matvec(&m, &x)).enumerate() {
            let allowed = allowed_error(&m, r, &x, size);
            prop_assert!((f64::from(got) - exact).abs() <= allowed,
                "group {group} row {r}: int8 {got}, exact {exact}, allowed {allowed}");
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
    assert!(err.to_string().contains("affine 4-bit only"), "{err}");
    assert!(Int8Vector::quantize(&input(100, 5), 64).is_err());
    assert!(Int8Vector::quantize(&[], 64).is_err());
}

/// A batch (prefill) gives each vector the bits of its own product, through the SIMD and the
/// portable code, on one thread and on two; `matvec` on a matrix set to 8-bit activations is
/// `matvec_int8`.
#[test]
fn a_batch_gives_each_vector_the_bits_of_its_own_product() {
    for (group, groups) in [(32, 5), (64, 20), (128, 9)] {
        let stored = affine4(300, group, groups, FloatType::BF16, group as u64);
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
                assert_eq!(bits(&through_matvec), bits(&y), "group {group}: matvec");
                alone.extend(bits(&y));
            }
            for threads in [1, 2] {
                let (fast, avx2, portable) = on_threads(threads, || {
                    let mut fast = vec![0f32; batch * m.rows()];
                    let mut avx2 = vec![0f32; batch * m.rows()];
                    let mut portable = vec![0f32; batch * m.rows()];
                    m.matmul(&xs, batch, &mut fast).unwrap();
                    m.matmul_int8_avx2(&xs, batch, &mut avx2).unwrap();
                    m.matmul_int8_portable(&xs, batch, &mut portable).unwrap();
                    (bits(&fast), bits(&avx2), bits(&portable))
                });
                // `matmul` takes VNNI where the machine has it; the AVX2 path must agree.
                assert_eq!(fast, alone, "group {group} batch {batch} {threads} threads");
                assert_eq!(avx2, alone, "group {group} batch {batch} AVX2");
                assert_eq!(portable, alone, "group {group} batch {batch} portable");
            }
        }
    }
}
