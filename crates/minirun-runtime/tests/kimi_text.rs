//! Kimi K3's tokenizer against tiktoken: `tests/data/kimi-k3/tiktoken/` holds a tiny K3-format
//! vocabulary and, for each case, the ids tiktoken 0.12.0 gives with K3's split pattern
//! (`tools/make_k3_tokenizer_fixture.py`), and the no-thinking chat template's ids.

use std::path::Path;

use minirun_text::tiktoken::{K3_PATTERN, KimiText};
use serde_json::Value;

fn fixture() -> (KimiText, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/tiktoken");
    let text = KimiText::parse(&std::fs::read(dir.join("tiktoken.model")).unwrap()).unwrap();
    let cases = serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    (text, cases)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn ordinary_text_encodes_to_tiktokens_ids_and_back() {
    let (text, cases) = fixture();
    assert_eq!(
        cases["pattern"], K3_PATTERN,
        "the fixture's pattern is ours"
    );
    let mergeable = cases["mergeable_tokens"].as_u64().unwrap() as usize;
    assert_eq!(text.vocab_size(), mergeable + 256);
    for case in cases["encodings"].as_array().unwrap() {
        let s = case["text"].as_str().unwrap();
        let got = text.encode(s).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{s:?}");
        assert_eq!(text.decode(&got).unwrap(), s);
    }
}

#[test]
fn reserved_ids_follow_the_mergeable_tokens_by_name() {
    let (text, cases) = fixture();
    for (name, id) in cases["special_tokens"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(text.special_id(name), Some(id), "{name}");
        assert_eq!(text.decode(&[id]).unwrap(), *name);
    }
    let base = cases["mergeable_tokens"].as_u64().unwrap() as u32;
    assert_eq!(text.stop_ids(), vec![base + 1, base + 2, base + 4]);
    assert!(text.decode(&[base + 256]).is_err());
}

#[test]
fn the_chat_template_gives_the_reference_ids() {
    let (text, cases) = fixture();
    for chat in cases["chats"].as_array().unwrap() {
        let messages: Vec<(String, String)> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_string(),
                    m["content"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            text.chat_ids(&messages).unwrap(),
            ids(&chat["ids"]),
            "{messages:?}"
        );
    }
    let odd = [("tool".to_string(), "x".to_string())];
    assert!(text.chat_ids(&odd).is_err());
}

#[test]
fn text_spelling_a_control_token_is_refused() {
    let (text, _) = fixture();
    let err = text.encode("ignore this <|open|> please").unwrap_err();
    assert!(err.to_string().contains("<|open|>"), "{err}");
}

#[test]
fn a_malformed_vocabulary_is_refused_by_line() {
    let good = "AA== 0\n";
    for (model, expect) in [
        (&b"\xff\xfe"[..], "not UTF-8"),
        (b"AA==\n", "line 1: not `base64 rank`"),
        (b"!!! 0\n", "line 1: the token is not base64"),
        (b"AA== 1\n", "line 1: rank \"1\" where 0 comes next"),
        (b"AA== 0\nAA== 1\n", "line 2: the token is listed twice"),
        (good.as_bytes(), "no token for the byte 0x01"),
    ] {
        let Err(err) = KimiText::parse(model) else {
            panic!("{expect}: parsed");
        };
        assert!(err.to_string().contains(expect), "{expect}: {err}");
    }
}
