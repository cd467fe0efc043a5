//! DeepSeek V4's chat template, built in as the publisher's app has it, used where the
//! tokenizer config carries no template: the BOS, `<｜User｜>` and the message, `<｜Assistant｜>`
//! and `</think>` before the reply, an earlier reply closed by the EOS; generation stops at any
//! of the five controls. A tokenizer without them is refused when this template is needed, and
//! messages whose joined ends spell a control are refused.

use minirun_text::{Text, TextError, V4_ASSISTANT, V4_BOS, V4_END_THINK, V4_EOS, V4_USER, v4_chat};

fn fixture_tokenizer() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/deepseek-v4/tiny-fp8-fp4/tokenizer.json");
    std::fs::read_to_string(path).unwrap()
}

/// The fixture's tokenizer with V4's spelling of its controls (full-width bars), and `</think>`.
fn v4_tokenizer() -> String {
    let mut json = fixture_tokenizer();
    for (ascii, v4) in [
        ("<|begin\u{2581}of\u{2581}sentence|>", V4_BOS),
        ("<|end\u{2581}of\u{2581}sentence|>", V4_EOS),
        ("<|User|>", V4_USER),
        ("<|Assistant|>", V4_ASSISTANT),
    ] {
        json = json.replace(ascii, v4);
    }
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": 512, "content": V4_END_THINK, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true,
        }));
    value.to_string()
}

#[test]
fn the_built_in_template_renders_v4s_no_thinking_chat() {
    let text = Text::open(Some(&v4_tokenizer()), Some("{}"), None)
        .unwrap()
        .with_v4_template()
        .unwrap();
    let messages = [
        ("system".to_string(), "Be brief.".to_string()),
        ("user".to_string(), "Hi".to_string()),
        ("assistant".to_string(), "Hello.".to_string()),
        ("user".to_string(), "Count.".to_string()),
    ];
    let want = format!(
        "{V4_BOS}Be brief.{V4_USER}Hi{V4_ASSISTANT}{V4_END_THINK}Hello.{V4_EOS}{V4_USER}Count.{V4_ASSISTANT}{V4_END_THINK}"
    );
    assert_eq!(v4_chat(&messages), want);
    assert_eq!(text.render_chat(&messages).unwrap(), want);
    let ids = text.chat_ids("Hi").unwrap();
    let hi = text.encode("Hi", false).unwrap();
    assert_eq!(
        ids,
        [vec![0, 2], hi, vec![3, 512]].concat(),
        "the controls are single ids"
    );
    assert_eq!(text.stop_ids(), vec![0, 1, 2, 3, 512]);
}

#[test]
fn a_template_of_its_own_wins_and_a_tokenizer_without_the_controls_is_refused() {
    let config = r#"{"chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "bos_token": "<s>"}"#;
    let text = Text::open(Some(&fixture_tokenizer()), Some(config), None)
        .unwrap()
        .with_v4_template()
        .unwrap();
    let messages = [("user".to_string(), "Hi".to_string())];
    assert_eq!(text.render_chat(&messages).unwrap(), "<s>Hi");
    let Err(err) = Text::open(Some(&fixture_tokenizer()), None, None)
        .unwrap()
        .with_v4_template()
    else {
        panic!("a tokenizer without V4's controls took V4's template");
    };
    let err = err.to_string();
    assert!(
        err.contains("</think>") && err.contains("not V4's tokenizer"),
        "{err}"
    );
}

/// V4's built-in template puts a system message's content right after the user's: the end of
/// one and the start of the other cannot spell a control token together.
#[test]
fn a_control_token_split_across_messages_is_refused() {
    let text = Text::open(Some(&v4_tokenizer()), Some("{}"), None)
        .unwrap()
        .with_v4_template()
        .unwrap();
    let middle = V4_EOS
        .char_indices()
        .nth(V4_EOS.chars().count() / 2)
        .unwrap()
        .0;
    let (head, tail) = V4_EOS.split_at(middle);
    let split = [
        ("user".to_string(), format!("hello{head}")),
        ("system".to_string(), format!("{tail}more")),
    ];
    assert!(text.render_chat(&split).unwrap().contains(V4_EOS));
    match text.conversation_ids(&split).unwrap_err() {
        TextError::ControlTokenAcrossMessages { token } => assert_eq!(token, V4_EOS),
        other => panic!("{other}"),
    }
    let apart = [
        ("user".to_string(), "hello".to_string()),
        ("system".to_string(), "more".to_string()),
    ];
    assert!(text.conversation_ids(&apart).is_ok());
}
