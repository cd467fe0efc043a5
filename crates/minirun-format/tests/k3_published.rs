//! The published Kimi K3 layout's rules: a layer manifest (golden file
//! `tests/data/k3-published/layer01.manifest.json`) parsed into banded tensors, each rule of the
//! row-band table refused when broken, and the expert containers' geometry with K3's own sizes.

use minirun_format::artifact::k3_published::{
    BandDtype, K3Experts, K3LayerManifest, K3LayoutError, MAX_UNITS, check_globals, slot_order,
};
use minirun_format::tile::RawHeader;
use serde_json::Value;

const PATH: &str = "layer01/manifest.json";

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/k3-published/layer01.manifest.json"
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parse(v: &Value) -> Result<K3LayerManifest, K3LayoutError> {
    K3LayerManifest::parse(v.to_string().as_bytes(), PATH, 1)
}

#[test]
fn the_golden_manifest_gives_its_tensors_band_by_band() {
    let m = parse(&golden()).unwrap();
    assert_eq!(m.layer, 1);
    assert_eq!(m.nonexpert.file, "layer01-deterministic.bin");
    assert_eq!(m.nonexpert.units.len(), 10);
    let tensors = m.tensors(PATH).unwrap();
    assert_eq!(tensors.len(), 9);
    let q = &tensors["language_model.model.layers.1.self_attn.q_proj.weight"];
    assert_eq!((q.rows, q.cols, q.dtype), (128, 128, BandDtype::Bf16));
    assert_eq!(q.bands, vec![(0, 16384), (16384, 16384)]);
    assert_eq!(q.bytes(), 128 * 128 * 2);
    let conv = &tensors["language_model.model.layers.1.self_attn.q_conv1d.weight"];
    assert_eq!((conv.rows, conv.cols, conv.dtype), (128, 4, BandDtype::F32));
    // A 1-D tensor is a band of one row, padded to its 16 KiB unit.
    let bias =
        &tensors["language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias"];
    assert_eq!((bias.rows, bias.cols, bias.bands[0].1), (1, 16, 64));
}

/// Edits the golden manifest, and the refusal must say `expect`.
fn refused(edit: impl FnOnce(&mut Value), expect: &str) {
    let mut v = golden();
    edit(&mut v);
    let err = parse(&v).expect_err(expect).to_string();
    assert!(err.contains(expect), "wanted {expect:?} in: {err}");
    assert!(err.starts_with(PATH), "{err}");
}

fn unit(v: &mut Value, i: usize) -> &mut Value {
    &mut v["nonexpert"]["units"][i]
}

#[test]
fn each_rule_of_the_band_table_is_refused_by_name() {
    refused(
        |v| v["layer"] = 2.into(),
        "names layer 2, but it is layer 1's",
    );
    refused(
        |v| v["nonexpert"]["units"] = Value::Null,
        "`nonexpert.units` is missing",
    );
    refused(
        |v| unit(v, 3)["dtype"] = "F16".into(),
        "dtype \"F16\" is neither F32 nor BF16",
    );
    refused(
        |v| unit(v, 0)["offset"] = 100.into(),
        "must be positive multiples of 16384",
    );
    refused(
        |v| unit(v, 2)["payload_length"] = 100.into(),
        "payload_length 100 is not rows x cols x 2 = 32768",
    );
    refused(
        |v| unit(v, 4)["index"] = 3.into(),
        "unit indexes are not 0..10",
    );
    refused(|v| unit(v, 1)["offset"] = 0.into(), "units 0 and 1 overlap");
    refused(
        |v| unit(v, 1)["row_start"] = 65.into(),
        "its bands cover rows up to 64, and unit 1 starts at row 65",
    );
    refused(
        |v| unit(v, 1)["tensor"] = "".into(),
        "`tensor` is missing or empty",
    );
    refused(
        |v| v["nonexpert"]["bytes"] = (180224 + 16384).into(),
        "its units occupy 180224 bytes; `nonexpert.bytes` says 196608",
    );
    refused(
        |v| v["nonexpert"]["bytes"] = 16384.into(),
        "run past the blob's 16384",
    );
    for escape in ["../../etc/passwd", "/etc/passwd", "..", ".hidden", ""] {
        refused(
            |v| v["nonexpert"]["file"] = escape.into(),
            "is not a plain file name inside the layer's directory",
        );
    }
    refused(
        |v| v["nonexpert"]["unit_count"] = 9.into(),
        "`nonexpert.unit_count` is 9",
    );
    refused(
        |v| v["nonexpert"]["bytes_by_role"]["norm"] = 1.into(),
        "`nonexpert.bytes_by_role` does not match its units",
    );
    refused(
        |v| {
            unit(v, 1)["cols"] = 64.into();
            unit(v, 1)["payload_length"] = 8192.into();
        },
        "unit 0 is 64 x 128 BF16 (attention), unit 1 64 x 64",
    );
}

#[test]
fn unknown_keys_are_the_publishers_and_the_dense_flag_is_not_read() {
    let mut v = golden();
    v["containers"] = serde_json::json!([{"projection": "w1"}]);
    v["dense"] = false.into();
    unit(&mut v, 0)["note"] = "anything".into();
    assert_eq!(parse(&v).unwrap(), parse(&golden()).unwrap());
}

fn header(rows: u32, cols: u32, tile_count: u32, tile_stride: u64) -> RawHeader {
    RawHeader {
        version: 1,
        rows,
        cols,
        tile_count,
        tile_stride,
        ..RawHeader::default()
    }
}

#[test]
fn k3s_expert_containers_hold_896_experts_in_text_order_of_their_numbers() {
    let w13 = header(1024, 3584, 2688, 1_949_696);
    let w2 = header(512, 3072, 6272, 835_584);
    let e = K3Experts::from_headers(5, &w13, &w13, &w2).unwrap();
    assert_eq!((e.experts, e.latent, e.intermediate), (896, 3584, 3072));
    assert_eq!((e.gate_up_bands, e.down_bands), (3, 7));
    let order = slot_order(896);
    assert_eq!(&order[..5], &[0, 1, 10, 100, 101]);
    assert_eq!(&order[893..], &[97, 98, 99]);
    assert_eq!(order.iter().position(|&x| x == 2), Some(112));
    assert_eq!(e.tiles("w1", 2), Some(336..339));
    assert_eq!(e.tiles("w2", 2), Some(784..791));
    assert_eq!(e.tiles("w1", 896), None);
    // The last slot's last band ends where the published file does.
    assert_eq!(
        e.byte_range("w1", 99, 1_949_696).unwrap().end,
        5_240_799_232
    );

    let w3_other = header(1024, 3584, 2687, 1_949_696);
    assert!(K3Experts::from_headers(5, &w13, &w3_other, &w2).is_err());
    let w2_short = header(512, 3072, 6265, 835_584);
    let err = K3Experts::from_headers(5, &w13, &w13, &w2_short).unwrap_err();
    assert!(
        err.to_string().contains("w1 holds 896 experts and w2 895"),
        "{err}"
    );
    let ragged = header(500, 3072, 6272, 835_584);
    assert!(K3Experts::from_headers(5, &w13, &w13, &ragged).is_err());
}

#[test]
fn globals_are_checked_by_length() {
    let dense = 163_840u64 * 7168 * 2;
    assert_eq!(dense, 2_348_810_240);
    assert_eq!(
        check_globals(163_840, 7168, dense, dense, 49_152).unwrap(),
        [0, 16384, 32768]
    );
    assert!(check_globals(163_840, 7168, dense - 2, dense, 49_152).is_err());
    assert!(check_globals(163_840, 7168, dense, dense, 49_153).is_err());
}

fn without_role_totals(v: &mut Value) {
    v["nonexpert"]
        .as_object_mut()
        .expect("nonexpert is an object")
        .remove("bytes_by_role");
}

#[test]
fn a_band_of_another_dtype_than_its_tensors_is_refused() {
    refused(
        |v| {
            unit(v, 1)["dtype"] = "F32".into();
            unit(v, 1)["rows"] = 32.into();
        },
        "unit 0 is 64 x 128 BF16 (attention), unit 1 32 x 128 F32 (attention)",
    );
}

#[test]
fn a_band_of_another_role_than_its_tensors_is_refused() {
    refused(
        |v| {
            unit(v, 1)["role"] = "router".into();
            without_role_totals(v);
        },
        "unit 0 is 64 x 128 BF16 (attention), unit 1 64 x 128 BF16 (router)",
    );
}

#[test]
fn a_band_of_zero_rows_is_refused() {
    refused(
        |v| unit(v, 1)["rows"] = 0.into(),
        "unit 1 (language_model.model.layers.1.self_attn.q_proj.weight): a band of no rows or no columns",
    );
}

#[test]
fn a_band_of_zero_columns_is_refused() {
    refused(
        |v| unit(v, 1)["cols"] = 0.into(),
        "unit 1 (language_model.model.layers.1.self_attn.q_proj.weight): a band of no rows or no columns",
    );
}

#[test]
fn a_band_of_an_unaligned_length_is_refused() {
    refused(
        |v| unit(v, 9)["length"] = (16_384 + 1).into(),
        "offset 163840 and length 16385 must be positive multiples of 16384",
    );
}

#[test]
fn a_band_of_zero_length_is_refused() {
    refused(
        |v| unit(v, 9)["length"] = 0.into(),
        "offset 163840 and length 0 must be positive multiples of 16384",
    );
}

/// Every unit here is malformed, so which error comes back says whether the count was refused.
fn units_of(count: usize) -> Value {
    let mut v = golden();
    v["nonexpert"]["units"] = Value::Array(vec![Value::from(0); count]);
    v
}

#[test]
fn a_manifest_of_max_units_is_not_refused_for_its_count() {
    let err = parse(&units_of(MAX_UNITS)).expect_err("its units are malformed");
    assert_eq!(
        err,
        K3LayoutError::Manifest {
            path: PATH.to_string(),
            reason: "`nonexpert.units[0]`: `dtype` is missing or empty".to_string(),
        }
    );
}

#[test]
fn a_manifest_of_more_than_max_units_is_refused_for_its_count() {
    let err = parse(&units_of(MAX_UNITS + 1)).expect_err("too many units");
    assert_eq!(
        err,
        K3LayoutError::Manifest {
            path: PATH.to_string(),
            reason: "more than 1048576 units".to_string(),
        }
    );
}

#[test]
fn experts_of_no_inner_width_are_refused() {
    let w13 = header(1024, 3584, 2688, 1_949_696);
    let w2 = header(512, 0, 6272, 835_584);
    assert_eq!(
        K3Experts::from_headers(5, &w13, &w13, &w2),
        Err(K3LayoutError::Experts {
            layer: 5,
            reason: "w1's 0 output rows are not whole bands of 1024".to_string(),
        })
    );
}

#[test]
fn experts_of_no_latent_width_are_refused() {
    let w13 = header(1024, 0, 2688, 1_949_696);
    let w2 = header(512, 3072, 6272, 835_584);
    assert_eq!(
        K3Experts::from_headers(5, &w13, &w13, &w2),
        Err(K3LayoutError::Experts {
            layer: 5,
            reason: "w2's 0 output rows are not whole bands of 512".to_string(),
        })
    );
}

#[test]
fn an_experts_bytes_are_its_slots_tiles_after_the_header() {
    let w13 = header(1024, 3584, 2688, 1_949_696);
    let w2 = header(512, 3072, 6272, 835_584);
    let e = K3Experts::from_headers(5, &w13, &w13, &w2).expect("K3's geometry");
    // Expert 2 is in slot 112: w1 tiles 336..339.
    assert_eq!(
        e.byte_range("w1", 2, 1_949_696),
        Some(655_114_240..660_963_328)
    );
    // Expert 0 is in slot 0: its bands start right after the header.
    assert_eq!(e.byte_range("w2", 0, 835_584), Some(16_384..5_865_472));
    assert_eq!(e.byte_range("w4", 0, 835_584), None);
}

#[test]
fn a_final_vector_filling_its_unit_is_accepted() {
    let dense = 4 * 8192 * 2;
    assert_eq!(
        check_globals(4, 8192, dense, dense, 49_152),
        Ok([0, 16_384, 32_768])
    );
}

#[test]
fn a_final_vector_overflowing_its_unit_is_refused() {
    let dense = 4 * 8193 * 2;
    assert_eq!(
        check_globals(4, 8193, dense, dense, 49_152),
        Err(K3LayoutError::Global {
            file: "final.bin".to_string(),
            reason: "49152 bytes, not three 16 KiB units each holding 8193 BF16 values".to_string(),
        })
    );
}
