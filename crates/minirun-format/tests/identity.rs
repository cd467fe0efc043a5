//! The fail-closed tokenizer and configuration identity rules: every rule broken alone makes the
//! whole identity absent, and the reason names the field that broke it.

use minirun_format::identity::{
    BrokenRule, IdentityAbsent, IdentityField, is_canonical_repo_id, is_canonical_root_file_name,
    is_pinned_revision, parse_configuration, parse_tokenizer,
};
use proptest::prelude::*;
use serde_json::{Value, json};

const SHA: &str = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103";
const REVISION: &str = "9f62e4e9fffbd0a83ddd60e1c209d828994b3569";

fn valid_tokenizer() -> Value {
    json!({
        "file": "tiktoken.model",
        "bytes": 2795286,
        "sha256": SHA,
        "source_repo": "moonshotai/Kimi-K3",
        "source_revision": REVISION,
        "license": "LICENSE",
    })
}

fn valid_configuration() -> Value {
    json!({
        "file": "config.json",
        "bytes": 1888,
        "sha256": SHA,
        "source_repo": "deepseek-ai/DeepSeek-V4-Flash-0731",
        "source_revision": "7872f01b1d1fe23eabc4c98b48bffcef5a386062",
    })
}

fn with(mut object: Value, key: &str, value: Value) -> Value {
    object[key] = value;
    object
}

fn without(mut object: Value, key: &str) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove(key);
    }
    object
}

/// Both parsers must refuse `object` and blame `field`.
fn assert_both_absent(key: &str, value: Value, field: IdentityField) {
    let tokenizer = parse_tokenizer(&with(valid_tokenizer(), key, value.clone()));
    let configuration = parse_configuration(&with(valid_configuration(), key, value.clone()));
    for absent in [tokenizer.err(), configuration.err()] {
        let absent = absent.unwrap_or_else(|| panic!("{key} = {value} was accepted"));
        assert_eq!(absent.field, field, "{key} = {value}: {absent}");
        assert!(
            absent.to_string().starts_with(&format!("{key}: ")),
            "{absent}"
        );
    }
}

fn assert_both_missing(key: &str, field: IdentityField) {
    let tokenizer = parse_tokenizer(&without(valid_tokenizer(), key)).unwrap_err();
    let configuration = parse_configuration(&without(valid_configuration(), key)).unwrap_err();
    let expected = IdentityAbsent {
        field,
        rule: BrokenRule::Missing,
    };
    assert_eq!(tokenizer, expected);
    assert_eq!(configuration, expected);
}

#[test]
fn valid_tokenizer_is_present_with_every_field() {
    let identity = parse_tokenizer(&valid_tokenizer()).unwrap();
    assert_eq!(identity.file, "tiktoken.model");
    assert_eq!(identity.bytes, 2_795_286);
    assert_eq!(identity.sha256, SHA);
    assert_eq!(identity.source_repo, "moonshotai/Kimi-K3");
    assert_eq!(identity.source_revision, REVISION);
    assert_eq!(identity.license, "LICENSE");
}

#[test]
fn valid_configuration_needs_no_license() {
    let identity = parse_configuration(&valid_configuration()).unwrap();
    assert_eq!(identity.file, "config.json");
    assert_eq!(identity.bytes, 1888);
}

#[test]
fn configuration_ignores_a_license_key_of_any_form() {
    for license in [json!("LICENSE"), json!("../etc/passwd"), json!(7)] {
        let object = with(valid_configuration(), "license", license);
        assert_eq!(
            parse_configuration(&object),
            parse_configuration(&valid_configuration())
        );
    }
}

#[test]
fn unknown_keys_are_ignored() {
    let object = with(valid_tokenizer(), "kind", json!({"anything": [1, 2]}));
    assert_eq!(
        parse_tokenizer(&object),
        parse_tokenizer(&valid_tokenizer())
    );
}

#[test]
fn a_non_object_is_absent() {
    for value in [
        json!(null),
        json!([]),
        json!("tokenizer.json"),
        json!(3),
        json!(true),
    ] {
        let expected = IdentityAbsent {
            field: IdentityField::Object,
            rule: BrokenRule::NotAnObject,
        };
        assert_eq!(parse_tokenizer(&value), Err(expected));
        assert_eq!(parse_configuration(&value), Err(expected));
    }
}

#[test]
fn file_must_be_a_canonical_root_name() {
    let bad = [
        "tokenizer/tokenizer.json",
        "..\\tokenizer.json",
        "tok\\en.json",
        ".",
        "..",
        "tokenizer .json",
        "",
        "tökenizer.json",
        "tokenizer.json\n",
        "/tokenizer.json",
        "tokenizer%2Ejson",
    ];
    for name in bad {
        assert_both_absent("file", json!(name), IdentityField::File);
    }
    assert_both_absent("file", json!(null), IdentityField::File);
    assert_both_absent("file", json!(12), IdentityField::File);
    assert_both_missing("file", IdentityField::File);
}

#[test]
fn file_reason_text() {
    let absent = parse_tokenizer(&with(valid_tokenizer(), "file", json!("a/b"))).unwrap_err();
    assert_eq!(
        absent.to_string(),
        "file: not a canonical repository-root file name"
    );
    let absent = parse_tokenizer(&with(valid_tokenizer(), "file", json!(1))).unwrap_err();
    assert_eq!(absent.to_string(), "file: not a string");
}

#[test]
fn names_with_dots_inside_are_canonical() {
    for name in [
        "...",
        ".hidden",
        "a..b",
        "tokenizer.json",
        "LICENSE",
        "x_y-z.1",
    ] {
        assert!(is_canonical_root_file_name(name), "{name}");
        let object = with(valid_tokenizer(), "file", json!(name));
        assert_eq!(parse_tokenizer(&object).unwrap().file, name);
    }
}

#[test]
fn bytes_must_be_a_positive_integer() {
    let bad = [
        json!(0),
        json!(-1),
        json!(1.5),
        json!(1.0),
        json!(1e3),
        json!(true),
        json!(false),
        json!("12"),
        json!(null),
        json!([12]),
    ];
    for value in bad {
        assert_both_absent("bytes", value, IdentityField::Bytes);
    }
    assert_both_missing("bytes", IdentityField::Bytes);
    let absent = parse_tokenizer(&with(valid_tokenizer(), "bytes", json!(0))).unwrap_err();
    assert_eq!(absent.to_string(), "bytes: not a positive integer");
}

#[test]
fn bytes_accepts_the_whole_u64_range() {
    for bytes in [1, u64::MAX] {
        let object = with(valid_tokenizer(), "bytes", json!(bytes));
        assert_eq!(parse_tokenizer(&object).unwrap().bytes, bytes);
    }
}

#[test]
fn bytes_beyond_u64_are_absent() {
    // serde_json reads an integer beyond u64 as a float, which is not an integer here.
    let text = format!(
        r#"{{"file":"a","bytes":18446744073709551616,"sha256":"{SHA}","source_repo":"a/b","source_revision":"{REVISION}"}}"#
    );
    let value: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        parse_configuration(&value).unwrap_err().field,
        IdentityField::Bytes
    );
}

#[test]
fn sha256_must_be_64_hex_characters() {
    let bad = [
        SHA[..63].to_owned(),
        format!("{SHA}0"),
        format!("{}g", &SHA[..63]),
        format!(" {}", &SHA[..63]),
        format!("0x{}", &SHA[..62]),
        String::new(),
        "é".repeat(32),
    ];
    for digest in bad {
        assert_both_absent("sha256", json!(digest), IdentityField::Sha256);
    }
    assert_both_absent("sha256", json!(7), IdentityField::Sha256);
    assert_both_missing("sha256", IdentityField::Sha256);
    let absent = parse_tokenizer(&with(valid_tokenizer(), "sha256", json!("ab"))).unwrap_err();
    assert_eq!(absent.to_string(), "sha256: not 64 hex characters");
}

#[test]
fn sha256_of_any_case_is_stored_lowercase() {
    let upper = SHA.to_ascii_uppercase();
    let tokenizer = parse_tokenizer(&with(valid_tokenizer(), "sha256", json!(upper))).unwrap();
    let configuration =
        parse_configuration(&with(valid_configuration(), "sha256", json!(upper))).unwrap();
    assert_eq!(tokenizer.sha256, SHA);
    assert_eq!(configuration.sha256, SHA);
}

#[test]
fn source_repo_must_be_owner_slash_name() {
    let bad = [
        "Kimi-K3",
        "moonshotai/Kimi-K3/main",
        "/Kimi-K3",
        "moonshotai/",
        "/",
        "",
        "moonshotai/Kimi K3",
        "moonshotai\\Kimi-K3",
        "moonshotai/Kimi%2DK3",
        "./Kimi-K3",
        "moonshotai/..",
        "moonshotаi/Kimi-K3", // Cyrillic а
    ];
    for repo in bad {
        assert!(!is_canonical_repo_id(repo), "{repo}");
        assert_both_absent("source_repo", json!(repo), IdentityField::SourceRepo);
    }
    assert_both_absent("source_repo", json!(null), IdentityField::SourceRepo);
    assert_both_missing("source_repo", IdentityField::SourceRepo);
    assert!(is_canonical_repo_id("deepseek-ai/DeepSeek-V4-Flash-0731"));
    assert!(is_canonical_repo_id("a.b/c_d"));
}

#[test]
fn source_revision_must_be_a_pinned_commit() {
    let bad = [
        REVISION.to_ascii_uppercase(),
        format!("{}A", &REVISION[..39]),
        REVISION[..39].to_owned(),
        format!("{REVISION}0"),
        "main".to_owned(),
        "refs/heads/main".to_owned(),
        format!("{}g", &REVISION[..39]),
        String::new(),
    ];
    for revision in bad {
        assert!(!is_pinned_revision(&revision), "{revision}");
        assert_both_absent(
            "source_revision",
            json!(revision),
            IdentityField::SourceRevision,
        );
    }
    assert_both_absent("source_revision", json!(1), IdentityField::SourceRevision);
    assert_both_missing("source_revision", IdentityField::SourceRevision);
}

#[test]
fn tokenizer_license_is_required_and_canonical() {
    let missing = parse_tokenizer(&without(valid_tokenizer(), "license")).unwrap_err();
    assert_eq!(
        missing,
        IdentityAbsent {
            field: IdentityField::License,
            rule: BrokenRule::Missing
        }
    );
    assert_eq!(missing.to_string(), "license: missing");
    for license in [
        json!("docs/LICENSE"),
        json!(".."),
        json!(""),
        json!("MIT License"),
        json!(null),
    ] {
        let absent = parse_tokenizer(&with(valid_tokenizer(), "license", license)).unwrap_err();
        assert_eq!(absent.field, IdentityField::License);
    }
}

#[test]
fn the_first_broken_field_in_reading_order_is_reported() {
    let object = with(
        with(valid_tokenizer(), "license", json!("")),
        "bytes",
        json!(0),
    );
    assert_eq!(
        parse_tokenizer(&object).unwrap_err().field,
        IdentityField::Bytes
    );
}

#[test]
fn absent_reason_serializes_as_field_and_rule() {
    let absent = parse_tokenizer(&json!([])).unwrap_err();
    assert_eq!(
        serde_json::to_value(absent).unwrap(),
        json!({"field": "object", "rule": "not_an_object"})
    );
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-zA-Z0-9./_ -]{0,70}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(identity_key(), inner, 0..8)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn identity_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "file",
            "bytes",
            "sha256",
            "source_repo",
            "source_revision",
            "license"
        ])
        .prop_map(str::to_owned),
        "[a-z_]{0,12}",
    ]
}

proptest! {
    /// Whatever the value, the parsers return, and anything they accept obeys every rule.
    #[test]
    fn arbitrary_values_never_panic_and_never_pass_a_broken_field(value in arbitrary_json()) {
        if let Ok(identity) = parse_tokenizer(&value) {
            prop_assert!(is_canonical_root_file_name(&identity.file));
            prop_assert!(is_canonical_root_file_name(&identity.license));
            prop_assert!(identity.bytes > 0);
            prop_assert!(is_pinned_revision(&identity.source_revision));
            prop_assert!(is_canonical_repo_id(&identity.source_repo));
        }
        if let Ok(identity) = parse_configuration(&value) {
            prop_assert!(is_canonical_root_file_name(&identity.file));
            prop_assert!(identity.bytes > 0);
            prop_assert_eq!(identity.sha256.len(), 64);
        }
    }

    /// Replacing one field of a valid tokenizer with an arbitrary value either still passes
    /// that field's rule or makes the identity absent naming that field.
    #[test]
    fn one_replaced_field_is_blamed(
        key in prop::sample::select(vec!["file", "bytes", "sha256", "source_repo", "source_revision", "license"]),
        value in arbitrary_json(),
    ) {
        let object = with(valid_tokenizer(), key, value);
        if let Err(absent) = parse_tokenizer(&object) {
            prop_assert_eq!(absent.field.key(), key);
        }
    }
}
