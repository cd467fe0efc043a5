//! Encode -> decode for every dtype: f32 bit-exact, exact file length, header carried
//! through, and random tensor sets round-tripping.

mod common;

use common::golden_fixture;
use dmexp::{Dtype, ExportMeta, Prefix, TensorRef};
use proptest::prelude::*;

#[test]
fn every_dtype_round_trips_with_the_exact_file_length() {
    let mut fixture = golden_fixture();
    // The golden fixture's 2^24 overflows f16; keep every dtype's range.
    fixture.tensors[1].2[6] = 1000.0;
    for dtype in Dtype::ALL {
        let encoded = dmexp::encode(&fixture.meta, &fixture.refs(), dtype).unwrap();
        let bytes = encoded.to_bytes();
        let prefix = Prefix::read(&bytes).unwrap();
        let bytes_per_value = match dtype {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        };
        assert_eq!(
            bytes.len() as u64,
            24 + u64::from(prefix.header_len) + bytes_per_value * 48
        );
        assert_eq!(encoded.file_len(), bytes.len() as u64);

        let export = dmexp::decode(&bytes).unwrap();
        assert_eq!(export.header.dtype, dtype);
        assert_eq!(export.header.source, fixture.meta.source);
        assert_eq!(export.header.step, fixture.meta.step);
        assert_eq!(export.header.config, fixture.meta.config);
        assert_eq!(&export.header, encoded.header());
        for ((name, dims, values), (entry, decoded)) in fixture.tensors.iter().zip(export.tensors())
        {
            assert_eq!((&entry.name, &entry.dims), (name, dims));
            assert_eq!(decoded.len(), values.len());
            if dtype == Dtype::F32 {
                let original: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
                let back: Vec<u32> = decoded.iter().map(|v| v.to_bits()).collect();
                assert_eq!(original, back, "f32 must be bit-exact");
            }
        }
        every_reader_gives_the_same_file_and_values(&encoded, &bytes, export);
    }
}

/// `write_to` writes what `to_bytes` holds; a view widens each tensor to the values `decode`
/// gave; `into_tensors` hands over every tensor, in order.
fn every_reader_gives_the_same_file_and_values(
    encoded: &dmexp::Encoded,
    bytes: &[u8],
    export: dmexp::Export,
) {
    let mut written = Vec::new();
    encoded.write_to(&mut written).unwrap();
    assert_eq!(written, bytes);
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let view = dmexp::view(bytes).unwrap();
    let decoded: Vec<(String, Vec<u32>)> = export
        .tensors()
        .map(|(entry, values)| (entry.name.clone(), bits(values)))
        .collect();
    for (name, values) in &decoded {
        let mut widened = vec![f32::NAN; values.len()];
        view.widen_into(name, &mut widened).unwrap();
        assert_eq!(&bits(&widened), values, "{name}");
    }
    let owned: Vec<(String, Vec<u32>)> = export
        .into_tensors()
        .map(|(entry, values)| (entry.name, bits(&values)))
        .collect();
    assert_eq!(owned, decoded);
}

#[test]
fn f32_export_records_the_true_extremes_and_flushes_nothing() {
    let values = [1.1023e-9f32, -5.1545, 0.0, 1e-45];
    let tensors = [TensorRef {
        name: "w",
        dims: &[4],
        values: &values,
    }];
    let meta = ExportMeta {
        source: "s@step1".into(),
        step: 1,
        config: toml::Table::new(),
    };
    let header = dmexp::encode(&meta, &tensors, Dtype::F32)
        .unwrap()
        .header()
        .clone();
    assert_eq!(header.max_abs, 5.1545);
    assert_eq!(
        header.min_nonzero_abs.to_bits(),
        1,
        "the smallest f32 subnormal is kept"
    );
    assert_eq!(header.flushed, 0);
}

fn tensor_set() -> impl Strategy<Value = Vec<(Vec<u64>, Vec<f32>)>> {
    let tensor = proptest::collection::vec(1u64..6, 1..4).prop_flat_map(|dims| {
        let n = dims.iter().product::<u64>() as usize;
        let value = prop_oneof![
            -60000.0f32..60000.0,
            -1.0f32..1.0,
            any::<u32>().prop_map(|b| f32::from_bits(b & 0x807F_FFFF)),
            Just(0.0f32),
            Just(-0.0f32),
        ];
        (Just(dims), proptest::collection::vec(value, n))
    });
    proptest::collection::vec(tensor, 1..6)
}

proptest! {
    #[test]
    fn random_tensor_sets_round_trip(
        set in tensor_set(),
        step in 0u64..1_000_000,
        dtype in prop::sample::select(Dtype::ALL.to_vec()),
    ) {
        let names: Vec<String> = (0..set.len()).map(|i| format!("blocks.{i}.w")).collect();
        let tensors: Vec<TensorRef<'_>> = set
            .iter()
            .zip(&names)
            .map(|((dims, values), name)| TensorRef { name, dims, values })
            .collect();
        let mut config = toml::Table::new();
        config.insert("d_model".into(), toml::Value::Integer(step as i64));
        let meta = ExportMeta { source: format!("ckpt.bin@step{step}"), step, config };
        let encoded = dmexp::encode(&meta, &tensors, dtype).unwrap();
        let bytes = encoded.to_bytes();
        let export = dmexp::decode(&bytes).unwrap();
        prop_assert_eq!(&export.header, encoded.header());
        let mut max_abs = 0.0f32;
        let decoded: Vec<Vec<f32>> = export.tensors().map(|(_, v)| v.to_vec()).collect();
        for ((_, original), back) in set.iter().zip(&decoded) {
            prop_assert_eq!(original.len(), back.len());
            if dtype == Dtype::F32 {
                for (a, b) in original.iter().zip(back) {
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
            }
            max_abs = back.iter().fold(max_abs, |m, v| m.max(v.abs()));
        }
        prop_assert_eq!(export.header.max_abs, max_abs);
        // Narrowed values are representable: exporting them again changes no byte.
        let again: Vec<TensorRef<'_>> = tensors
            .iter()
            .zip(&decoded)
            .map(|(t, values)| TensorRef { values, ..*t })
            .collect();
        let re_encoded = dmexp::encode(&meta, &again, dtype).unwrap();
        let payload = |b: &[u8]| b[b.len() - encoded.prefix().payload_len as usize..].to_vec();
        prop_assert_eq!(payload(&re_encoded.to_bytes()), payload(&bytes));
        prop_assert_eq!(re_encoded.header().flushed, 0);
    }
}

#[test]
fn encode_refuses_malformed_tensor_sets() {
    let meta = ExportMeta {
        source: "s".into(),
        step: 0,
        config: toml::Table::new(),
    };
    let v = [1.0f32; 4];
    let cases: Vec<(Vec<TensorRef<'_>>, &str)> = vec![
        (vec![], "NoTensors"),
        (
            vec![TensorRef {
                name: "",
                dims: &[4],
                values: &v,
            }],
            "EmptyTensorName",
        ),
        (
            vec![
                TensorRef {
                    name: "a",
                    dims: &[4],
                    values: &v,
                },
                TensorRef {
                    name: "a",
                    dims: &[4],
                    values: &v,
                },
            ],
            "DuplicateTensor",
        ),
        (
            vec![TensorRef {
                name: "a",
                dims: &[2, 3],
                values: &v,
            }],
            "ValueCountMismatch",
        ),
        (
            vec![TensorRef {
                name: "a",
                dims: &[4, 0],
                values: &v,
            }],
            "InvalidDims",
        ),
    ];
    for (tensors, expected) in cases {
        let err = dmexp::encode(&meta, &tensors, Dtype::Bf16).unwrap_err();
        assert!(
            format!("{err:?}").starts_with(expected),
            "{expected}: {err:?}"
        );
    }
}
