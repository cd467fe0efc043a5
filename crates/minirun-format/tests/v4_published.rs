//! The published DeepSeek V4 layout's unit manifests, by the rules of
//! `docs/formats/v4-published.md`: the golden manifest (layer 2 of V4 Flash as the publication's
//! sizes describe it: 13 files of 3,596,391,128 bytes, the totals its `index.json` records) reads
//! as that layer; each broken rule on an edited copy is refused, naming what broke.

use minirun_format::artifact::v4_published::{PlainDtype, UnitKind, V4File, V4UnitManifest};
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
