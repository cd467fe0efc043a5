//! The published DeepSeek V4 layout's unit manifests, by the rules of
//! `docs/formats/v4-published.md`: the golden manifest (layer 2 of V4 Flash as the publication's
//! sizes describe it: 13 files of 3,596,391,128 bytes, the totals its `index.json` records) reads
//! as that layer; each broken rule on an edited copy is refused, naming what broke.

use minirun_format::artifact::v4_published::{
    PlainDtype, PlainTensor, UnitKind, V4File, V4UnitManifest,
};
use serde_json::{Value, json};

fn golden() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/v4-published/layers02.manifest.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parse(v: &Value, unit: &str) -> Result<V4UnitManifest, String> {
    V4UnitManifest::parse(v.to_string().as_bytes(), unit).map_err(|e| e.to_string())
}

#[test]
fn the_golden_manifest_reads_as_v4_flash_layer_2() {
    let m = parse(&golden(), "layers02").unwrap();
    assert_eq!(m.files.len(), 13);
    assert_eq!(m.total_bytes(), 3_596_391_128);
    let order = m.expert_order.as_ref().unwrap();
    assert_eq!((order.len(), order[2], m.slot_of(2)), (256, 10, Some(112)));
    let V4File::Container(wkv) = m.file("layers02-attn_wkv_weight.fp8tile").unwrap() else {
        panic!("wkv is a container");
    };
    assert_eq!(
        wkv.source_tensor.as_deref(),
        Some("layers.2.attn.wkv.weight")
    );
    assert_eq!((wkv.rows, wkv.cols, wkv.bytes), (512, 4096, 2_129_920));
    let Some(V4File::Blob { tensors, .. }) = m.file("layers02-plain.bin") else {
        panic!("the plain blob");
    };
    let sink = &tensors[0];
    assert_eq!(
        (sink.name.as_str(), sink.dtype, sink.bytes),
        ("layers.2.attn.attn_sink", PlainDtype::F32, 256)
    );
    let table = tensors
        .iter()
        .find(|t| t.name.ends_with("tid2eid"))
        .unwrap();
    assert_eq!(
        (table.dtype, table.shape.clone()),
        (PlainDtype::I64, vec![129_280, 6])
    );
    // Members follow each other with no padding, so some start off their element width.
    assert!(tensors.iter().any(|t| t.offset % 8 != 0));
    assert_eq!(UnitKind::of("layers02"), Some(UnitKind::Layer(2)));
    assert_eq!(UnitKind::of("mtp01"), Some(UnitKind::Mtp(1)));
    assert_eq!(
        UnitKind::of("layer02"),
        None,
        "K3's unit names are not V4's"
    );
}

/// An edit of the golden manifest, and what the refusal must say.
type Case = (Box<dyn FnOnce(&mut Value)>, &'static str);

fn refused(edit: impl FnOnce(&mut Value)) -> String {
    let mut v = golden();
    edit(&mut v);
    match parse(&v, "layers02") {
        Ok(_) => panic!("an edited manifest was accepted"),
        Err(e) => e,
    }
}

#[test]
fn each_broken_rule_is_refused_by_name() {
    let plain = 12;
    let cases: Vec<Case> = vec![
        (Box::new(|v| v["unit"] = json!("layers03")), "its unit is"),
        (
            Box::new(|v| v["source_revision"] = json!("")),
            "source_revision",
        ),
        (
            Box::new(|v| v["expert_order"][0] = json!(1)),
            "not a permutation",
        ),
        (
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("expert_order");
            }),
            "expert_order",
        ),
        (
            Box::new(move |v| v["files"][plain]["members"][1]["offset"] = json!(300)),
            "must start at",
        ),
        (
            Box::new(move |v| v["files"][plain]["bytes"] = json!(32_985_817)),
            "members hold",
        ),
        (
            Box::new(move |v| v["files"][plain]["members"][0]["dtype"] = json!("F16")),
            "dtype must be",
        ),
        (
            Box::new(move |v| v["files"][plain]["sha256"] = json!("ABC")),
            "sha256",
        ),
        (
            Box::new(move |v| {
                v["files"][plain]["members"][0]["source_tensor"] = json!("layers.3.attn.attn_sink")
            }),
            "outside layers.2.",
        ),
        (
            Box::new(|v| v["files"][0]["kind"] = json!("tensor")),
            "kind",
        ),
        (
            Box::new(|v| v["files"][0]["layout"] = json!("affine")),
            "layout",
        ),
        (Box::new(|v| v["files"][0]["count"] = json!(2)), "one tile"),
        (
            Box::new(|v| v["files"][1]["name"] = v["files"][0]["name"].clone()),
            "listed twice",
        ),
        (
            Box::new(|v| v["files"][0]["name"] = json!("../escape.fp8tile")),
            "plain file name",
        ),
        (
            Box::new(|v| v["files"][0]["element_bits"] = json!(7)),
            "layout fp8-e4m3-block is 8-bit elements in groups of 128",
        ),
        (
            Box::new(|v| v["files"][0]["group"] = json!(0)),
            "says element_bits 8 and group 0",
        ),
        (
            Box::new(|v| {
                let files = v["files"].as_array_mut().unwrap();
                let experts = files.iter_mut().find(|f| f["layout"] == "mxfp4").unwrap();
                experts["group"] = json!(0);
            }),
            "layout mxfp4 is 4-bit elements in groups of 32",
        ),
        (
            Box::new(|v| v["files"][1]["source_tensor"] = v["files"][0]["source_tensor"].clone()),
            "a second time",
        ),
    ];
    for (edit, expected) in cases {
        let err = refused(edit);
        assert!(err.contains(expected), "expected {expected:?} in {err}");
    }
    // Sizes whose sum overflows are taken, and their total saturates instead of wrapping.
    let mut huge = golden();
    huge["files"][0]["bytes"] = json!(u64::MAX);
    assert_eq!(parse(&huge, "layers02").unwrap().total_bytes(), u64::MAX);
    let err = parse(&golden(), "layer02").unwrap_err();
    assert!(err.contains("not a layersNN"), "{err}");
    let err = V4UnitManifest::parse(&vec![b' '; (8 << 20) + 1], "layers02")
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than"), "{err}");
}

const SHA: &str = "5f0b8c3d5f0b8c3d5f0b8c3d5f0b8c3d5f0b8c3d5f0b8c3d5f0b8c3d5f0b8c3d";

/// A `global00` manifest listing `files`.
fn global(files: Value) -> Value {
    json!({
        "unit": "global00",
        "source_repo": "deepseek-ai/DeepSeek-V4-Flash-0731",
        "source_revision": "7872f01b1d1fe23eabc4c98b48bffcef5a386062",
        "files": files,
    })
}

/// A blob holding one tensor of `dtype` and `shape`, the whole of its `bytes`.
fn standalone(dtype: &str, shape: Value, bytes: u64) -> Value {
    json!({
        "name": "global00-norm.bin",
        "kind": "blob",
        "bytes": bytes,
        "sha256": SHA,
        "source_tensor": "norm.weight",
        "dtype": dtype,
        "shape": shape,
    })
}

#[test]
fn plain_dtypes_are_named_as_manifests_spell_them() {
    assert_eq!(PlainDtype::Bf16.name(), "BF16");
    assert_eq!(PlainDtype::F32.name(), "F32");
    assert_eq!(PlainDtype::I64.name(), "I64");
}

#[test]
fn layer_unit_names_pad_the_layer_to_two_digits() {
    assert_eq!(UnitKind::layer_unit(2), "layers02");
    assert_eq!(UnitKind::layer_unit(42), "layers42");
    assert_eq!(UnitKind::layer_unit(100), "layers100");
    assert_eq!(
        UnitKind::of(&UnitKind::layer_unit(7)),
        Some(UnitKind::Layer(7))
    );
}

#[test]
fn unit_numbers_of_one_digit_or_with_a_sign_are_not_units() {
    assert_eq!(UnitKind::of("layers2"), None);
    assert_eq!(UnitKind::of("mtp1"), None);
    assert_eq!(UnitKind::of("layers+5"), None);
    assert_eq!(UnitKind::of("mtp10"), Some(UnitKind::Mtp(10)));
}

#[test]
fn a_sha256_of_64_non_hex_characters_is_refused() {
    let err = refused(|v| v["files"][12]["sha256"] = json!("g".repeat(64)));
    assert!(
        err.contains("sha256 is not 64 lowercase hex digits"),
        "{err}"
    );
    let err = refused(|v| v["files"][12]["sha256"] = json!(SHA.to_uppercase()));
    assert!(
        err.contains("sha256 is not 64 lowercase hex digits"),
        "{err}"
    );
}

#[test]
fn a_sha256_of_short_lowercase_hex_is_refused() {
    let err = refused(|v| v["files"][12]["sha256"] = json!(&SHA[..63]));
    assert!(
        err.contains("sha256 is not 64 lowercase hex digits"),
        "{err}"
    );
}

#[test]
fn a_manifest_of_exactly_the_size_limit_is_read() {
    let mut text = golden().to_string().into_bytes();
    text.resize(8 << 20, b' ');
    let m = V4UnitManifest::parse(&text, "layers02").unwrap();
    assert_eq!(m.files.len(), 13);
}

#[test]
fn an_empty_file_list_is_refused() {
    let err = refused(|v| v["files"] = json!([]));
    assert!(
        err.contains("files must be a list of 1 to 65536 entries"),
        "{err}"
    );
}

#[test]
fn a_file_name_inside_a_directory_is_refused() {
    let err = refused(|v| v["files"][0]["name"] = json!("sub/layers02-attn.fp8tile"));
    assert!(
        err.contains("file sub/layers02-attn.fp8tile: is not a plain file name"),
        "{err}"
    );
}

#[test]
fn a_file_of_zero_bytes_is_refused() {
    let err = refused(|v| v["files"][0]["bytes"] = json!(0));
    assert!(err.contains("has no positive bytes"), "{err}");
}

#[test]
fn a_global_blob_of_bf16_or_f32_tensors_is_read() {
    for (dtype, expected) in [("F32", PlainDtype::F32), ("BF16", PlainDtype::Bf16)] {
        let width = expected.width();
        let m = parse(
            &global(json!([standalone(dtype, json!([2048]), 2048 * width)])),
            "global00",
        )
        .unwrap();
        let Some(V4File::Blob { tensors, .. }) = m.file("global00-norm.bin") else {
            panic!("the blob");
        };
        assert_eq!(
            tensors,
            &vec![PlainTensor {
                name: "norm.weight".to_string(),
                dtype: expected,
                shape: vec![2048],
                offset: 0,
                bytes: 2048 * width,
            }]
        );
    }
}

#[test]
fn a_global_blob_with_an_i64_tensor_is_refused() {
    let err = parse(
        &global(json!([standalone("I64", json!([1024]), 8192)])),
        "global00",
    )
    .unwrap_err();
    assert!(
        err.contains("global00 holds BF16 and F32 tensors only"),
        "{err}"
    );
}

#[test]
fn a_standalone_tensor_that_does_not_fill_its_blob_is_refused() {
    let err = parse(
        &global(json!([standalone("F32", json!([2048]), 8196)])),
        "global00",
    )
    .unwrap_err();
    assert!(
        err.contains("norm.weight holds 8192 bytes, the file 8196"),
        "{err}"
    );
}

#[test]
fn a_tensor_with_no_dims_is_refused() {
    let err = parse(
        &global(json!([standalone("F32", json!([]), 4)])),
        "global00",
    )
    .unwrap_err();
    assert!(
        err.contains("norm.weight: shape must be 1 to 8 positive dims"),
        "{err}"
    );
}

#[test]
fn a_tensor_with_a_zero_dim_is_refused() {
    let blob = json!({
        "name": "global00-plain.bin",
        "kind": "blob",
        "bytes": 8192,
        "sha256": SHA,
        "members": [
            {"source_tensor": "empty", "dtype": "F32", "shape": [0], "offset": 0, "bytes": 0},
            {"source_tensor": "norm.weight", "dtype": "F32", "shape": [2048], "offset": 0, "bytes": 8192},
        ],
    });
    let err = parse(&global(json!([blob])), "global00").unwrap_err();
    assert!(
        err.contains("empty: shape must be 1 to 8 positive dims"),
        "{err}"
    );
}

#[test]
fn an_empty_member_list_is_refused() {
    let err = refused(|v| v["files"][12]["members"] = json!([]));
    assert!(
        err.contains("members must be a list of 1 to 65536"),
        "{err}"
    );
}
