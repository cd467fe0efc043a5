//! Narrowing is pinned two independent ways: hand-computed bit patterns at the edges,
//! and a reference rounding written in f64 arithmetic (no bit tricks, no `half`) swept
//! over a large slice of all f32 values.

use dmexp::narrow::{bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
use dmexp::{Dtype, Error, ExportMeta, TensorRef};
use proptest::prelude::*;

fn meta() -> ExportMeta {
    ExportMeta {
        source: "test.bin@step0".into(),
        step: 0,
        config: toml::Table::new(),
    }
}

/// Stores `values` through the whole encoder and returns the payload's 16-bit patterns.
fn stored_halves(dtype: Dtype, values: &[f32]) -> Result<(Vec<u16>, u64), Error> {
    let dims = [values.len() as u64];
    let tensors = [TensorRef {
        name: "w",
        dims: &dims,
        values,
    }];
    let encoded = dmexp::encode(&meta(), &tensors, dtype)?;
    let bytes = encoded.to_bytes();
    let payload = &bytes[bytes.len() - 2 * values.len()..];
    let halves = payload
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect();
    Ok((halves, encoded.header().flushed))
}

fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

#[test]
fn f16_edges_match_hand_computed_bits() {
    let cases: [(f32, u16, &str); 14] = [
        (
            f(0x3380_0000),
            0x0001,
            "2^-24, the smallest f16 subnormal, is kept",
        ),
        (
            f(0x3300_0000),
            0x0000,
            "2^-25 is a tie between 0 and 2^-24: ties to even give 0",
        ),
        (
            f(0x3300_0001),
            0x0001,
            "just above 2^-25 rounds up to 2^-24",
        ),
        (
            f(0x33C0_0000),
            0x0002,
            "1.5 x 2^-24 ties to the even subnormal 2 x 2^-24",
        ),
        (
            f(0x387B_A882),
            0x03EF,
            "6.0e-5 is a subnormal in f16 and keeps 10 bits of scale",
        ),
        (f(0x3880_0000), 0x0400, "2^-14, the smallest f16 normal"),
        (1.0, 0x3C00, "one"),
        (
            f(0x3F80_1000),
            0x3C00,
            "1 + 2^-11 ties down to the even 1.0",
        ),
        (
            f(0x3F80_3000),
            0x3C02,
            "1 + 3 x 2^-11 ties up to the even 1 + 2^-9",
        ),
        (65504.0, 0x7BFF, "65504, the largest f16"),
        (
            f(0x477F_EFFD),
            0x7BFF,
            "65519.99 is below the 65520 midpoint",
        ),
        (-0.0, 0x8000, "-0.0 stays -0.0"),
        (-2.5, 0xC100, "negative normal"),
        (f(0xB280_0000), 0x8000, "-2^-26 becomes -0.0"),
    ];
    for (value, expected, why) in cases {
        assert_eq!(f32_to_f16_bits(value), expected, "{why}");
        let (stored, _) = stored_halves(Dtype::F16, &[value]).unwrap();
        assert_eq!(stored, [expected], "encoder: {why}");
    }
}

#[test]
fn bf16_edges_match_hand_computed_bits() {
    let cases: [(f32, u16, &str); 10] = [
        (1.0, 0x3F80, "one"),
        (f(0x3F80_8000), 0x3F80, "tie rounds down to even"),
        (f(0x3F81_8000), 0x3F82, "tie rounds up to even"),
        (f(0x3F80_8001), 0x3F81, "above the tie rounds up"),
        (f(0x3F80_7FFF), 0x3F80, "below the tie rounds down"),
        (
            f(0x7F7F_7FFF),
            0x7F7F,
            "just below the largest bf16's rounding edge",
        ),
        (f(0x3089_705F), 0x3089, "1.0e-9 keeps its exponent in bf16"),
        (f(0x0001_8000), 0x0002, "subnormal tie rounds to even 2"),
        (f(0x0000_8000), 0x0000, "subnormal tie rounds to even 0"),
        (-0.0, 0x8000, "-0.0 stays -0.0"),
    ];
    for (value, expected, why) in cases {
        assert_eq!(f32_to_bf16_bits(value), expected, "{why}");
        let (stored, _) = stored_halves(Dtype::Bf16, &[value]).unwrap();
        assert_eq!(stored, [expected], "encoder: {why}");
    }
}

#[test]
fn flushed_counts_nonzero_inputs_that_became_zero_and_nothing_else() {
    // f16: 2^-25 and -2^-26 flush; -0.0 and 0.0 were zero already; 2^-24 survives.
    let values = [f(0x3300_0000), f(0xB280_0000), -0.0, 0.0, f(0x3380_0000)];
    let (_, flushed) = stored_halves(Dtype::F16, &values).unwrap();
    assert_eq!(flushed, 2);
    // bf16 has f32's exponent: only values below 2^-133 (deep f32 subnormals) flush.
    let values = [f(0x0000_0001), f(0x8000_7FFF), 1.0e-38, -0.0];
    let (_, flushed) = stored_halves(Dtype::Bf16, &values).unwrap();
    assert_eq!(flushed, 2);
}

#[test]
fn f16_overflow_is_refused_naming_tensor_index_value_and_bf16() {
    for value in [65520.0f32, -65520.0, 70000.0, f32::MAX] {
        let values = [0.5, 1.0, value];
        let err = stored_halves(Dtype::F16, &values).unwrap_err();
        match &err {
            Error::Overflow {
                tensor,
                index,
                value: v,
                dtype,
                suggest,
                max,
            } => {
                assert_eq!(
                    (tensor.as_str(), *index, *dtype, *suggest),
                    ("w", 2, Dtype::F16, Dtype::Bf16)
                );
                assert_eq!(*max, 65504.0, "f16's largest finite value");
                assert_eq!(v.to_bits(), value.to_bits());
            }
            other => panic!("expected Overflow, got {other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains("\"w\"") && message.contains("#2") && message.contains("--dtype bf16"),
            "{message}"
        );
        // The same weights are fine in bf16 (f32::MAX aside, which overflows bf16 too).
        if value != f32::MAX {
            assert!(stored_halves(Dtype::Bf16, &values).is_ok());
        }
    }
}

#[test]
fn bf16_overflow_at_f32_max_is_refused_naming_f32() {
    for value in [f32::MAX, f(0x7F7F_8000), -f32::MAX] {
        let err = stored_halves(Dtype::Bf16, &[value]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Overflow {
                    dtype: Dtype::Bf16,
                    suggest: Dtype::F32,
                    index: 0,
                    max,
                    ..
                } if max.to_bits() == 0x7F7F_0000
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("--dtype f32"));
    }
}

#[test]
fn nan_and_infinite_inputs_are_refused_as_a_broken_model_in_every_dtype() {
    for dtype in Dtype::ALL {
        for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f(0x7FC0_0001)] {
            let values = vec![0.0; 5000]
                .into_iter()
                .chain([value])
                .collect::<Vec<f32>>();
            let dims = [values.len() as u64];
            let tensors = [TensorRef {
                name: "blocks.3.w",
                dims: &dims,
                values: &values,
            }];
            let err = dmexp::encode(&meta(), &tensors, dtype).unwrap_err();
            match &err {
                Error::NonFiniteInput { tensor, index, .. } => {
                    assert_eq!((tensor.as_str(), *index), ("blocks.3.w", 5000));
                }
                other => panic!("{dtype}: expected NonFiniteInput, got {other:?}"),
            }
            assert!(err.to_string().contains("non-finite weight"), "{err}");
            assert!(
                !err.to_string().contains("--dtype"),
                "the format is not the problem: {err}"
            );
        }
    }
}

/// Round to nearest, ties to even, in f64 arithmetic: the value a correct narrowing to a
/// format with `mantissa_bits` and smallest normal exponent `min_exp` must produce, or
/// `None` when it overflows. Every f32 is exact in f64, and so is each step here.
fn reference_round(x: f32, mantissa_bits: i32, min_exp: i32, max_finite: f64) -> Option<f64> {
    let v = f64::from(x);
    if v == 0.0 {
        return Some(v);
    }
    let exponent = ((v.abs().to_bits() >> 52) as i32 - 1023).max(min_exp);
    let quantum = 2f64.powi(exponent - mantissa_bits);
    let rounded = (v / quantum).round_ties_even() * quantum;
    (rounded.abs() <= max_finite).then_some(rounded)
}

fn f16_reference(x: f32) -> Option<f64> {
    reference_round(x, 10, -14, 65504.0)
}

fn bf16_reference(x: f32) -> Option<f64> {
    reference_round(x, 7, -126, (2.0 - 2f64.powi(-7)) * 2f64.powi(127))
}

fn check_against_reference(bits: u32) {
    let x = f32::from_bits(bits);
    if !x.is_finite() {
        return;
    }
    let f16_out = f16_bits_to_f32(f32_to_f16_bits(x));
    match f16_reference(x) {
        Some(r) => assert_eq!(
            f64::from(f16_out).to_bits(),
            r.to_bits(),
            "f16 of {bits:#010x}"
        ),
        None => assert!(f16_out.is_infinite(), "f16 of {bits:#010x} must overflow"),
    }
    let bf16_out = bf16_bits_to_f32(f32_to_bf16_bits(x));
    match bf16_reference(x) {
        Some(r) => assert_eq!(
            f64::from(bf16_out).to_bits(),
            r.to_bits(),
            "bf16 of {bits:#010x}"
        ),
        None => assert!(bf16_out.is_infinite(), "bf16 of {bits:#010x} must overflow"),
    }
}

#[test]
fn narrowing_matches_the_f64_reference_across_a_sweep_of_all_f32() {
    // Every 997th bit pattern (4.3M values) plus every pattern near the f16 and bf16 edges.
    for bits in (0..=u32::MAX).step_by(997) {
        check_against_reference(bits);
    }
    for base in [
        0x3300_0000u32,
        0x3380_0000,
        0x3880_0000,
        0x477F_E000,
        0x7F7F_0000,
        0x0000_0000,
    ] {
        for bits in base..base + 0x1_0000 {
            check_against_reference(bits);
            check_against_reference(bits | 0x8000_0000);
        }
    }
}

/// Widening, checked against the IEEE definition of each 16-bit format in f64.
#[test]
fn widening_every_16_bit_pattern_is_exact_and_round_trips() {
    for h in 0..=u16::MAX {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((h >> 10) & 0x1F), f64::from(h & 0x3FF));
        if e != 0x1F {
            let magnitude = if e == 0 {
                m * 2f64.powi(-24)
            } else {
                (1024.0 + m) * 2f64.powi(e - 25)
            };
            assert_eq!(
                f64::from(f16_bits_to_f32(h)),
                sign * magnitude,
                "f16 {h:#06x}"
            );
            assert_eq!(f32_to_f16_bits(f16_bits_to_f32(h)), h);
        }
        let (e, m) = (i32::from((h >> 7) & 0xFF), f64::from(h & 0x7F));
        if e != 0xFF {
            let magnitude = if e == 0 {
                m * 2f64.powi(-133)
            } else {
                (128.0 + m) * 2f64.powi(e - 134)
            };
            assert_eq!(
                f64::from(bf16_bits_to_f32(h)),
                sign * magnitude,
                "bf16 {h:#06x}"
            );
            assert_eq!(f32_to_bf16_bits(bf16_bits_to_f32(h)), h);
        }
    }
}

proptest! {
    #[test]
    fn encoder_payload_matches_the_reference_for_random_tensors(
        bits in proptest::collection::vec(any::<u32>(), 1..300)
    ) {
        let values: Vec<f32> = bits
            .into_iter()
            .map(f32::from_bits)
            .filter(|x| x.is_finite() && x.abs() < 60000.0)
            .collect();
        prop_assume!(!values.is_empty());
        for (dtype, reference) in [(Dtype::F16, f16_reference as fn(f32) -> Option<f64>), (Dtype::Bf16, bf16_reference)] {
            let (stored, flushed) = stored_halves(dtype, &values).unwrap();
            let widen = if dtype == Dtype::F16 { f16_bits_to_f32 } else { bf16_bits_to_f32 };
            let mut expected_flushed = 0;
            for (&x, &s) in values.iter().zip(&stored) {
                let r = reference(x).unwrap();
                prop_assert_eq!(f64::from(widen(s)).to_bits(), r.to_bits());
                expected_flushed += u64::from(x != 0.0 && r == 0.0);
            }
            prop_assert_eq!(flushed, expected_flushed);
        }
    }
}

/// A large export is scanned in two halves on two threads; the problem reported is still the
/// first in payload order, with its index counted within its own tensor, for a tensor that
/// straddles the halves and whichever half the problems are in.
#[test]
fn a_large_export_reports_its_first_bad_value_in_payload_order() {
    let (a_len, b_len) = (600_000usize, 1_400_000usize); // the halves meet inside "b"
    let encode_with = |bad: &[(usize, usize)]| {
        let mut a = vec![0.01f32; a_len];
        let mut b = vec![0.02f32; b_len];
        for &(tensor, index) in bad {
            [&mut a, &mut b][tensor][index] = f32::NAN;
        }
        let (da, db) = ([a_len as u64], [b_len as u64]);
        let tensors = [
            TensorRef {
                name: "a",
                dims: &da,
                values: &a,
            },
            TensorRef {
                name: "b",
                dims: &db,
                values: &b,
            },
        ];
        match dmexp::encode(&meta(), &tensors, Dtype::Bf16) {
            Err(Error::NonFiniteInput { tensor, index, .. }) => (tensor, index),
            other => panic!("expected NonFiniteInput, got {other:?}"),
        }
    };
    let front_of_b = 100_000; // before the midpoint (1,000,000 values in)
    let back_of_b = 900_000; // after it
    assert_eq!(
        encode_with(&[(1, back_of_b)]),
        ("b".into(), back_of_b as u64)
    );
    assert_eq!(
        encode_with(&[(1, back_of_b), (1, front_of_b)]),
        ("b".into(), front_of_b as u64)
    );
    assert_eq!(encode_with(&[(1, back_of_b), (0, 7)]), ("a".into(), 7));
    // A clean export of the same size stores every value's own bf16.
    let values: Vec<f32> = (0..2_000_000).map(|i| (i as f32 * 1e-3).sin()).collect();
    let dims = [values.len() as u64];
    let whole = [TensorRef {
        name: "w",
        dims: &dims,
        values: &values,
    }];
    let encoded = dmexp::encode(&meta(), &whole, Dtype::Bf16)
        .unwrap()
        .to_bytes();
    let decoded = dmexp::decode(&encoded).unwrap();
    let (_, stored) = decoded.tensor("w").unwrap();
    for (x, y) in values.iter().zip(stored) {
        assert_eq!(f32_to_bf16_bits(*x), f32_to_bf16_bits(*y));
    }
}
