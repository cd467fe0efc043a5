//! `index.json` recognition, count claims and the never-fails policy, against the recorded
//! Kimi K3 and DeepSeek V4 Flash documents and an H3-shaped document built for these tests.

use std::path::PathBuf;

use minirun_format::identity::IdentityField;
use minirun_format::index::{ArtifactIndex, IndexShape, MAX_INDEX_BYTES, Source};
use proptest::prelude::*;
use serde_json::{Value, json};

const K3_REVISION: &str = "9f62e4e9fffbd0a83ddd60e1c209d828994b3569";
const V4_REVISION: &str = "7872f01b1d1fe23eabc4c98b48bffcef5a386062";

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/index")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&fixture(name)).unwrap()
}

fn parse_value(value: &Value) -> ArtifactIndex {
    ArtifactIndex::parse(value.to_string().as_bytes())
}

fn claim(value: Value) -> (Option<u64>, Option<u64>) {
    let index = parse_value(&value);
    (index.files, index.bytes)
}

// ---- the recorded documents ----

#[test]
fn kimi_k3_is_single_source_totals() {
    let index = ArtifactIndex::parse(&fixture("kimi-k3.index.json"));
    assert_eq!(index.shape, IndexShape::SingleSourceTotals);
    assert_eq!(
        index.sources,
        vec![Source {
            key: None,
            repo: "moonshotai/Kimi-K3".to_owned(),
            revision: Some(K3_REVISION.to_owned()),
            role: None,
            license: None,
        }]
    );
    assert_eq!(index.files, Some(372));
    assert_eq!(index.bytes, Some(1_559_976_181_760));
    assert_eq!(index.format.as_deref(), Some("quantized_tile_container"));
    assert_eq!(index.format_version, Some(1));
    assert_eq!(
        index.relationship.as_deref(),
        Some("byte_preserving_repack")
    );
    assert!(index.units.is_empty());
    assert_eq!(index.configuration, None);
    assert_eq!(index.parse_problem, None);
    assert_eq!(
        index.top_level_keys,
        [
            "bytes",
            "files",
            "format",
            "format_version",
            "globals",
            "layers",
            "relationship",
            "source_repo",
            "source_revision",
            "tokenizer"
        ]
    );
}

#[test]
fn kimi_k3_tokenizer_identity_is_present() {
    let index = ArtifactIndex::parse(&fixture("kimi-k3.index.json"));
    let tokenizer = index.tokenizer.unwrap().unwrap();
    assert_eq!(tokenizer.file, "tiktoken.model");
    assert_eq!(tokenizer.bytes, 2_795_286);
    assert_eq!(
        tokenizer.sha256,
        "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
    );
    assert_eq!(tokenizer.source_repo, "moonshotai/Kimi-K3");
    assert_eq!(tokenizer.source_revision, K3_REVISION);
    assert_eq!(tokenizer.license, "LICENSE");
}

#[test]
fn kimi_k3_description() {
    let index = ArtifactIndex::parse(&fixture("kimi-k3.index.json"));
    let expected = "\
shape: single-source-totals (one upstream repository; file and byte totals stated at the top level)
source: moonshotai/Kimi-K3 @ 9f62e4e9fffbd0a83ddd60e1c209d828994b3569
payload files: 372
payload bytes: 1,559,976,181,760
format: quantized_tile_container (version 1)
relationship: byte_preserving_repack
units: none listed
tokenizer: tiktoken.model, 2,795,286 B, sha256 b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103, from moonshotai/Kimi-K3 @ 9f62e4e9fffbd0a83ddd60e1c209d828994b3569, licence file LICENSE
configuration: not published";
    assert_eq!(index.describe(), expected);
}

#[test]
fn deepseek_v4_is_single_source_units_with_summed_files() {
    let index = ArtifactIndex::parse(&fixture("deepseek-v4-flash.index.json"));
    assert_eq!(index.shape, IndexShape::SingleSourceUnits);
    assert_eq!(index.sources.len(), 1);
    assert_eq!(index.sources[0].repo, "deepseek-ai/DeepSeek-V4-Flash-0731");
    assert_eq!(index.sources[0].revision.as_deref(), Some(V4_REVISION));
    assert_eq!(index.units.len(), 47);
    assert_eq!(index.units[0].name.as_deref(), Some("layers00"));
    assert_eq!(index.units[0].files, Some(12));
    assert_eq!(index.units[0].bytes, Some(3_566_452_184));
    assert_eq!(index.units[46].name.as_deref(), Some("global00"));
    assert_eq!(index.files, Some(577));
    assert_eq!(index.bytes, Some(166_893_192_184));
    assert_eq!(index.format, None);
    assert_eq!(
        index.relationship.as_deref(),
        Some("byte-preserving repack")
    );
    assert_eq!(index.tokenizer, None);
    assert_eq!(index.configuration, None);
    let text = index.describe();
    assert!(text.contains("units: 47"), "{text}");
    assert!(text.contains("tokenizer: not published"), "{text}");
    assert!(text.contains("payload files: 577"), "{text}");
}

#[test]
fn deepseek_v4_with_published_identities() {
    let mut document = fixture_json("deepseek-v4-flash.index.json");
    document["tokenizer"] = json!({
        "file": "tokenizer.json", "bytes": 6_367_146,
        "sha256": "1F2E3D4C5B6A79881F2E3D4C5B6A79881F2E3D4C5B6A79881F2E3D4C5B6A7988",
        "source_repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "source_revision": V4_REVISION,
        "license": "LICENSE",
    });
    document["configuration"] = json!({
        "file": "config.json", "bytes": 1_888,
        "sha256": "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
        "source_repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "source_revision": V4_REVISION,
    });
    let index = parse_value(&document);
    assert_eq!(index.shape, IndexShape::SingleSourceUnits);
    let tokenizer = index.tokenizer.clone().unwrap().unwrap();
    assert_eq!(tokenizer.file, "tokenizer.json");
    assert_eq!(tokenizer.bytes, 6_367_146);
    assert_eq!(
        tokenizer.sha256,
        "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988"
    );
    let configuration = index.configuration.clone().unwrap().unwrap();
    assert_eq!(configuration.file, "config.json");
    assert_eq!(configuration.bytes, 1_888);
    assert!(
        index
            .describe()
            .contains("configuration: config.json, 1,888 B")
    );
}

#[test]
fn a_broken_identity_is_absent_with_its_reason() {
    let mut document = fixture_json("kimi-k3.index.json");
    document["tokenizer"]["source_revision"] = json!("main");
    document["configuration"] = json!(null);
    let index = parse_value(&document);
    let absent = index.tokenizer.clone().unwrap().unwrap_err();
    assert_eq!(absent.field, IdentityField::SourceRevision);
    assert_eq!(
        index.configuration.clone().unwrap().unwrap_err().field,
        IdentityField::Object
    );
    let text = index.describe();
    assert!(
        text.contains(
            "tokenizer: absent: source_revision: not a pinned 40-character lowercase hex commit"
        ),
        "{text}"
    );
    assert!(
        text.contains("configuration: absent: identity: not a JSON object"),
        "{text}"
    );
}

// ---- the multi-source shape ----

#[test]
fn h3_shaped_document_is_multi_source_sorted_by_key() {
    let index = ArtifactIndex::parse(&fixture("h3-shaped.index.json"));
    assert_eq!(index.shape, IndexShape::MultiSourceUnits);
    let keys: Vec<_> = index.sources.iter().map(|s| s.key.as_deref()).collect();
    assert_eq!(
        keys,
        [
            Some("dit"),
            Some("lora"),
            Some("official"),
            Some("tae"),
            Some("text_encoder")
        ]
    );
    assert_eq!(
        index.sources[0],
        Source {
            key: Some("dit".to_owned()),
            repo: "pipenetwork/MiniMax-H3-MLX-8bit".to_owned(),
            revision: Some("3ac52081470b0488921c3ec3ba84a39097bf2361".to_owned()),
            role: Some("diffusion transformer, affine 8-bit, group 64".to_owned()),
            license: Some("MiniMax H3 Community License Agreement".to_owned()),
        }
    );
    assert_eq!(index.units.len(), 5);
    assert_eq!(index.files, Some(21));
    assert_eq!(index.bytes, Some(8_668_863_086));
    let text = index.describe();
    assert!(
        text.contains("sources (5):\n  dit: pipenetwork/MiniMax-H3-MLX-8bit @ 3ac5"),
        "{text}"
    );
    assert!(text.contains("    licence: Apache-2.0"), "{text}");
}

#[test]
fn sources_without_a_repo_are_skipped_and_role_defaults_to_key() {
    let index = parse_value(&json!({
        "sources": {
            "b": {"repo": "owner/b"},
            "a": {"repo": ""},
            "c": {"revision": "x"},
            "d": "owner/d",
            "e": {"repo": "owner/e", "role": 3, "revision": 4, "license": false},
        }
    }));
    assert_eq!(index.shape, IndexShape::MultiSourceUnits);
    assert_eq!(index.sources.len(), 2);
    assert_eq!(index.sources[0].role.as_deref(), Some("b"));
    assert_eq!(index.sources[0].revision, None);
    assert_eq!(index.sources[1].key.as_deref(), Some("e"));
    assert_eq!(index.sources[1].role.as_deref(), Some("e"));
    assert_eq!(index.sources[1].revision, None);
    assert_eq!(index.sources[1].license, None);
}

#[test]
fn a_sources_map_with_no_valid_entry_is_unrecognized() {
    let index = parse_value(&json!({"sources": {"a": {"repo": ""}, "b": {}}, "total_bytes": 1}));
    assert_eq!(index.shape, IndexShape::Unrecognized);
    assert!(index.sources.is_empty());
    assert_eq!(index.parse_problem, None);
}

#[test]
fn a_single_source_repo_wins_over_a_sources_map() {
    let index = parse_value(&json!({
        "source_repo": "owner/one",
        "sources": {"a": {"repo": "owner/a"}},
        "units": [],
    }));
    assert_eq!(index.shape, IndexShape::SingleSourceUnits);
    assert_eq!(index.sources.len(), 1);
    assert_eq!(index.sources[0].repo, "owner/one");
}

#[test]
fn an_empty_or_non_string_source_repo_falls_through() {
    for repo in [json!(""), json!(null), json!(["owner/name"])] {
        let index =
            parse_value(&json!({"source_repo": repo.clone(), "sources": {"k": {"repo": "o/k"}}}));
        assert_eq!(index.shape, IndexShape::MultiSourceUnits);
        let index = parse_value(&json!({"source_repo": repo}));
        assert_eq!(index.shape, IndexShape::Unrecognized);
    }
}

#[test]
fn units_that_are_not_an_array_mean_totals() {
    let index = parse_value(&json!({"source_repo": "o/n", "units": {"a": 1}}));
    assert_eq!(index.shape, IndexShape::SingleSourceTotals);
    assert!(index.units.is_empty());
}

#[test]
fn source_revision_is_kept_only_as_a_string() {
    let index = parse_value(&json!({"source_repo": "o/n", "source_revision": 12}));
    assert_eq!(index.sources[0].revision, None);
    assert!(
        index
            .describe()
            .contains("source: o/n (no revision stated)")
    );
}

// ---- unrecognized and unreadable documents ----

#[test]
fn valid_json_naming_no_repository_keeps_sorted_keys() {
    let index = ArtifactIndex::parse(br#"{"zeta": 1, "Alpha": 2, "alpha": [], "_": null}"#);
    assert_eq!(index.shape, IndexShape::Unrecognized);
    assert_eq!(index.top_level_keys, ["Alpha", "_", "alpha", "zeta"]);
    assert_eq!(index.parse_problem, None);
    assert!(index.sources.is_empty());
    assert!(
        index
            .describe()
            .contains("top-level keys: Alpha, _, alpha, zeta")
    );
}

#[test]
fn the_documented_unrecognized_example() {
    let index = ArtifactIndex::parse(
        br#"{"name": "something-else", "weights": ["a.bin"], "total_bytes": 12}"#,
    );
    let text = index.describe();
    assert!(
        text.starts_with(
            "shape: unrecognized (names no repository this reader understands; \
             the artifact is unidentified)\ntop-level keys: name, total_bytes, weights\n"
        ),
        "{text}"
    );
    assert!(text.contains("sources: none named"), "{text}");
}

#[test]
fn an_unrecognized_document_still_reports_its_claims() {
    let index = parse_value(&json!({"name": "x", "files": 2, "bytes": 10}));
    assert_eq!(index.shape, IndexShape::Unrecognized);
    assert_eq!((index.files, index.bytes), (Some(2), Some(10)));
}

fn assert_unreadable(bytes: &[u8], problem_contains: &str) {
    let index = ArtifactIndex::parse(bytes);
    assert_eq!(index.shape, IndexShape::Unrecognized);
    assert!(index.sources.is_empty());
    assert!(index.top_level_keys.is_empty());
    assert_eq!((index.files, index.bytes), (None, None));
    assert_eq!(index.tokenizer, None);
    let problem = index.parse_problem.clone().unwrap();
    assert!(problem.contains(problem_contains), "{problem}");
    let text = index.describe();
    assert!(text.starts_with("shape: unrecognized"), "{text}");
    assert!(text.contains("parse problem: "), "{text}");
}

#[test]
fn non_objects_are_unrecognized() {
    assert_unreadable(br#"[{"source_repo": "o/n"}]"#, "an array, not an object");
    assert_unreadable(br#""o/n""#, "a string, not an object");
    assert_unreadable(b"42", "a number, not an object");
    assert_unreadable(b"null", "null, not an object");
    assert_unreadable(b"true", "a boolean, not an object");
}

#[test]
fn unreadable_bytes_are_unrecognized() {
    assert_unreadable(b"", "empty");
    assert_unreadable(b" \n\t ", "empty");
    assert_unreadable(b"{\"source_repo\": \"o/n\"", "not JSON");
    assert_unreadable(b"{\"source_repo\": \"o/n\"} trailing", "not JSON");
    assert_unreadable(b"{\"source_repo\": \"o/\xff\"}", "not UTF-8");
    assert_unreadable(b"\xef\xbb\xbf{}", "not JSON");
    assert_unreadable(b"{'source_repo': 'o/n'}", "not JSON");
}

#[test]
fn ten_megabytes_of_brackets_is_an_ordinary_failure() {
    assert_unreadable(
        &vec![b'['; 10_000_000],
        "not JSON: recursion limit exceeded at line 1 column 128",
    );
    assert_unreadable(&vec![b'{'; 10_000_000], "not JSON");
}

#[test]
fn documents_over_the_limit_are_refused_before_parsing() {
    let mut huge = vec![b' '; MAX_INDEX_BYTES + 1];
    huge[0] = b'{';
    huge[MAX_INDEX_BYTES] = b'}';
    assert_unreadable(&huge, "over the 67108864-byte limit");
}

#[test]
fn a_document_of_exactly_the_limit_is_read() {
    let mut exact = vec![b' '; MAX_INDEX_BYTES];
    let body = br#"{"source_repo": "o/r""#;
    exact[..body.len()].copy_from_slice(body);
    exact[MAX_INDEX_BYTES - 1] = b'}';
    let index = ArtifactIndex::parse(&exact);
    assert_eq!(index.parse_problem, None);
    assert_eq!(index.sources[0].repo, "o/r");
}

/// One entry of a sources map keeps its key on show: only a single unnamed source is shown as
/// one line.
#[test]
fn a_sources_map_of_one_entry_is_described_with_its_key() {
    let index = parse_value(&json!({"sources": {"text": {"repo": "owner/t"}}}));
    let text = index.describe();
    assert!(text.contains("sources (1):\n  text: owner/t"), "{text}");
    let single = parse_value(&json!({"source_repo": "owner/t"})).describe();
    assert!(single.contains("source: owner/t"), "{single}");
}

#[test]
fn duplicate_keys_keep_the_last_value() {
    let index = ArtifactIndex::parse(br#"{"source_repo": "o/first", "source_repo": "o/last"}"#);
    assert_eq!(index.sources[0].repo, "o/last");
    assert_eq!(index.top_level_keys, ["source_repo"]);
}

#[test]
fn describe_escapes_control_characters_from_the_document() {
    let index = parse_value(&json!({
        "source_repo": "o/n\u{1b}[2J",
        "relationship": "line\nbreak \u{202e}reversed",
    }));
    let text = index.describe();
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(!text.contains('\u{202e}'), "{text}");
    assert!(text.contains("o/n\\u{1b}[2J"), "{text}");
    assert!(
        text.contains("relationship: line\\u{a}break \\u{202e}reversed"),
        "{text}"
    );
}

#[test]
fn serializes_shape_and_identities_readably() {
    let mut document = fixture_json("kimi-k3.index.json");
    document["configuration"] = json!({"file": "config.json"});
    let value = serde_json::to_value(parse_value(&document)).unwrap();
    assert_eq!(value["shape"], "single-source-totals");
    assert_eq!(value["tokenizer"]["present"]["file"], "tiktoken.model");
    assert_eq!(value["configuration"]["absent"], "bytes: missing");
    assert_eq!(value["parse_problem"], Value::Null);
    let unpublished = serde_json::to_value(ArtifactIndex::parse(b"{}")).unwrap();
    assert_eq!(unpublished["tokenizer"], Value::Null);
    assert_eq!(unpublished["shape"], "unrecognized");
}

// ---- count claims ----

#[test]
fn files_of_the_wrong_kind_claim_nothing() {
    for files in [
        json!(true),
        json!("3"),
        json!(-1),
        json!(1.5),
        json!(3.0),
        json!(null),
    ] {
        assert_eq!(
            claim(json!({"files": files, "bytes": 10})),
            (None, None),
            "{files}"
        );
    }
}

#[test]
fn file_count_is_used_when_files_is_absent() {
    assert_eq!(
        claim(json!({"file_count": 4, "bytes": 10})),
        (Some(4), Some(10))
    );
    assert_eq!(claim(json!({"files": 0, "bytes": 0})), (Some(0), Some(0)));
}

#[test]
fn an_invalid_files_does_not_fall_back_to_file_count() {
    assert_eq!(
        claim(json!({"files": true, "file_count": 4, "bytes": 10})),
        (None, None)
    );
    assert_eq!(
        claim(json!({"files": 2, "file_count": "x", "bytes": 10})),
        (Some(2), Some(10))
    );
}

#[test]
fn a_stated_count_is_not_replaced_by_the_units_sum() {
    let units = json!([{"files": 5}, {"files": 6}]);
    assert_eq!(
        claim(json!({"files": 1, "units": units, "bytes": 3})),
        (Some(1), Some(3))
    );
    assert_eq!(
        claim(json!({"files": "x", "units": units, "bytes": 3})),
        (None, None)
    );
}

#[test]
fn units_without_files_are_skipped_in_the_sum() {
    let units = json!([{"files": 5}, {"unit": "no-count"}, {"files": 6}]);
    assert_eq!(
        claim(json!({"units": units, "total_bytes": 3})),
        (Some(11), Some(3))
    );
}

#[test]
fn an_invalid_unit_voids_the_sum() {
    for bad in [
        json!({"files": -1}),
        json!({"files": "2"}),
        json!({"files": true}),
        json!(7),
    ] {
        let units = json!([{"files": 5}, bad, {"files": 6}]);
        assert_eq!(
            claim(json!({"units": units, "total_bytes": 3})),
            (None, None),
            "{bad}"
        );
    }
}

#[test]
fn an_overflowing_unit_sum_is_void() {
    let units = json!([{"files": u64::MAX}, {"files": 1}]);
    assert_eq!(
        claim(json!({"units": units, "total_bytes": 3})),
        (None, None)
    );
}

#[test]
fn an_empty_units_array_sums_to_zero_and_no_units_claims_nothing() {
    assert_eq!(
        claim(json!({"units": [], "total_bytes": 0})),
        (Some(0), Some(0))
    );
    assert_eq!(claim(json!({"total_bytes": 3})), (None, None));
    assert_eq!(
        claim(json!({"units": {"files": 3}, "total_bytes": 3})),
        (None, None)
    );
}

#[test]
fn file_counts_above_i64_are_refused() {
    let limit = i64::MAX as u64;
    assert_eq!(
        claim(json!({"files": limit, "bytes": 1})),
        (Some(limit), Some(1))
    );
    assert_eq!(claim(json!({"files": limit + 1, "bytes": 1})), (None, None));
}

#[test]
fn bytes_comes_before_total_bytes() {
    assert_eq!(
        claim(json!({"files": 1, "bytes": 7, "total_bytes": 9})),
        (Some(1), Some(7))
    );
    assert_eq!(
        claim(json!({"files": 1, "total_bytes": 9})),
        (Some(1), Some(9))
    );
    assert_eq!(
        claim(json!({"files": 1, "bytes": "7", "total_bytes": 9})),
        (None, None)
    );
    assert_eq!(
        claim(json!({"files": 1, "bytes": u64::MAX})),
        (Some(1), Some(u64::MAX))
    );
}

#[test]
fn files_without_bytes_is_no_claim() {
    assert_eq!(claim(json!({"files": 1})), (None, None));
    assert_eq!(claim(json!({"units": [{"files": 1}]})), (None, None));
    let index = parse_value(&json!({"source_repo": "o/n", "files": 1}));
    assert!(index.describe().contains("payload files: not claimed"));
}

#[test]
fn format_version_and_format_are_kept_only_when_well_typed() {
    let index = parse_value(&json!({"format": 3, "format_version": "1"}));
    assert_eq!((index.format, index.format_version), (None, None));
    let index = parse_value(&json!({"format_version": 2}));
    assert!(
        index
            .describe()
            .contains("format: not stated (format_version 2)")
    );
}

// ---- never panics ----

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z0-9/._-]{0,12}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(index_key(), inner, 0..8)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Mostly the keys the reader looks at, so the rules themselves are exercised.
fn index_key() -> impl Strategy<Value = String> {
    let known = vec![
        "source_repo",
        "source_revision",
        "sources",
        "repo",
        "revision",
        "role",
        "license",
        "units",
        "unit",
        "files",
        "file_count",
        "bytes",
        "total_bytes",
        "format",
        "format_version",
        "relationship",
        "tokenizer",
        "configuration",
        "file",
        "sha256",
    ];
    prop_oneof![
        3 => prop::sample::select(known).prop_map(str::to_owned),
        1 => any::<String>(),
    ]
}

fn assert_consistent(index: &ArtifactIndex) {
    let _ = index.describe();
    let _ = serde_json::to_string(index).unwrap();
    assert!(index.top_level_keys.is_sorted());
    assert_eq!(index.files.is_some(), index.bytes.is_some());
    assert_eq!(
        index.shape == IndexShape::Unrecognized,
        index.sources.is_empty()
    );
    if index.parse_problem.is_some() {
        assert_eq!(index.shape, IndexShape::Unrecognized);
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        assert_consistent(&ArtifactIndex::parse(&bytes));
    }

    #[test]
    fn arbitrary_json_never_panics(value in arbitrary_json()) {
        let index = parse_value(&value);
        assert_consistent(&index);
        prop_assert_eq!(index.parse_problem.is_some(), !value.is_object());
    }

    #[test]
    fn arbitrary_top_level_objects_never_panic(
        map in prop::collection::btree_map(index_key(), arbitrary_json(), 0..12)
    ) {
        let value = Value::Object(map.into_iter().collect());
        let index = parse_value(&value);
        assert_consistent(&index);
        prop_assert!(index.parse_problem.is_none());
    }

    #[test]
    fn truncated_fixtures_never_panic(cut in 0_usize..4153) {
        let bytes = fixture("deepseek-v4-flash.index.json");
        let index = ArtifactIndex::parse(&bytes[..cut.min(bytes.len())]);
        assert_consistent(&index);
    }
}
