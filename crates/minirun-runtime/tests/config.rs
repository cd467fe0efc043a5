//! config.json is read fail-closed: what the forward pass needs must be there, what it does not
//! implement is refused by name, and nothing is filled in silently.

use minirun_runtime::ConfigError;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;
use serde_json::{Value, json};

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/deepseek-v3/hf-fp8-f32scales/config.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(v: &Value) -> Result<DeepSeekV3Config, ConfigError> {
    DeepSeekV3Config::parse(&v.to_string())
}

#[test]
fn the_fixture_config_reads_with_every_field_as_written() {
    let c = parse(&fixture()).unwrap();
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.n_routed_experts,
            c.n_group,
            c.topk_group
        ),
        (128, 3, 8, 2, 1)
    );
    assert_eq!(
        (c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim),
        (Some(64), 64, 16)
    );
    let yarn = c.rope_scaling.clone().unwrap();
    assert_eq!(
        (yarn.factor, yarn.original_max_position_embeddings),
        (4.0, 64.0)
    );
    assert!(c.is_moe(1) && !c.is_moe(0));
}

#[test]
fn an_unknown_field_is_refused_by_name() {
    let mut v = fixture();
    v["sliding_window"] = json!(128);
    assert_eq!(
        parse(&v).unwrap_err(),
        ConfigError::Unknown("sliding_window".into())
    );
    let mut v = fixture();
    v["rope_scaling"]["truncate"] = json!(false);
    assert_eq!(
        parse(&v).unwrap_err(),
        ConfigError::Unknown("rope_scaling.truncate".into())
    );
}

#[test]
fn a_value_of_an_architecture_field_other_than_deepseek_v3s_is_refused() {
    for (key, value) in [
        ("scoring_func", json!("softmax")),
        ("topk_method", json!("greedy")),
        ("model_type", json!("deepseek_v2")),
        ("tie_word_embeddings", json!(true)),
        ("moe_layer_freq", json!(2)),
        ("attention_bias", json!(true)),
    ] {
        let mut v = fixture();
        v[key] = value;
        let err = parse(&v).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Unsupported { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
}

#[test]
fn a_missing_number_is_refused_never_defaulted() {
    for key in [
        "hidden_size",
        "n_group",
        "routed_scaling_factor",
        "rms_norm_eps",
        "q_lora_rank",
        "rope_scaling",
        "norm_topk_prob",
    ] {
        let mut v = fixture();
        v.as_object_mut().unwrap().remove(key);
        let err = parse(&v).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Missing(k) if k == key),
            "{key}: {err}"
        );
    }
    let mut v = fixture();
    v["rope_scaling"]
        .as_object_mut()
        .unwrap()
        .remove("beta_fast");
    assert_eq!(
        parse(&v).unwrap_err(),
        ConfigError::Missing("beta_fast".into())
    );
}

#[test]
fn rope_scaling_other_than_yarn_and_inconsistent_routing_are_refused() {
    let mut v = fixture();
    v["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
    assert!(matches!(
        parse(&v).unwrap_err(),
        ConfigError::Unsupported { .. }
    ));
    let mut v = fixture();
    v["topk_group"] = json!(3);
    assert!(matches!(
        parse(&v).unwrap_err(),
        ConfigError::Inconsistent(_)
    ));
    let mut v = fixture();
    v["n_routed_experts"] = json!(7);
    assert!(matches!(
        parse(&v).unwrap_err(),
        ConfigError::Inconsistent(_)
    ));
    let mut v = fixture();
    v["hidden_size"] = json!(-5);
    assert!(matches!(parse(&v).unwrap_err(), ConfigError::Type { .. }));
    assert!(matches!(
        DeepSeekV3Config::parse("[1, 2]").unwrap_err(),
        ConfigError::NotJson(_)
    ));
    let mut v = fixture();
    v["n_shared_experts"] = Value::Null;
    assert_eq!(
        parse(&v).unwrap().n_shared_experts,
        0,
        "null is mlx-lm's \"no shared experts\""
    );
    let mut v = fixture();
    v["q_lora_rank"] = Value::Null;
    assert_eq!(
        parse(&v).unwrap().q_lora_rank,
        None,
        "null q_lora_rank is DeepSeek-V2-Lite's plain q_proj"
    );
}

#[test]
fn an_unknown_or_missing_model_type_is_refused_naming_every_known_one() {
    use minirun_runtime::registry::{ARCHITECTURES, Architecture};
    let mut v = fixture();
    v["model_type"] = json!("qwen9_moe");
    let err = Architecture::parse(&v.to_string()).err().unwrap();
    assert!(matches!(err, ConfigError::UnknownModelType { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("qwen9_moe"), "{message}");
    for row in ARCHITECTURES {
        assert!(message.contains(row.model_type), "{message}");
    }
    v.as_object_mut().unwrap().remove("model_type");
    let err = Architecture::parse(&v.to_string()).err().unwrap();
    assert_eq!(err, ConfigError::Missing("model_type".into()));
    v["model_type"] = json!("deepseek_v3");
    let known = Architecture::parse(&v.to_string()).unwrap();
    assert_eq!(known.model_type(), "deepseek_v3");
}

/// The keys the Hugging Face libraries write into every config they save are accepted by every
/// architecture alike (a Kimi K3 config mlx-lm saved, with `torch_dtype`, was once refused while
/// the other readers took it), and a key no reader knows is still refused by every one.
#[test]
fn every_architecture_accepts_the_keys_transformers_writes_and_refuses_an_unknown_one() {
    use minirun_runtime::registry::{ARCHITECTURES, Architecture};
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");
    let configs = [
        "deepseek-v3/hf-fp8-f32scales/config.json",
        "deepseek-v4/tiny-fp8-fp4/config.json",
        "gpt-oss/openai-mxfp4/config.json",
        "kimi-k3/mlx-k3mix/config.json",
        "llama/hf-bf16/config.json",
        "qwen3/hf-bf16/config.json",
        "qwen3-moe/hf-bf16/config.json",
    ];
    let mut covered = Vec::new();
    for path in configs {
        let text = std::fs::read_to_string(format!("{data}{path}")).unwrap();
        let mut v: Value = serde_json::from_str(&text).unwrap();
        let written = [
            ("architectures", json!(["SomeForCausalLM"])),
            ("dtype", json!("bfloat16")),
            ("torch_dtype", json!("bfloat16")),
            ("transformers_version", json!("5.0.0")),
        ];
        for (key, value) in &written {
            v[*key] = value.clone();
        }
        if let Some(text_config) = v.get_mut("text_config") {
            for (key, value) in &written {
                text_config[*key] = value.clone();
            }
        }
        let architecture =
            Architecture::parse(&v.to_string()).unwrap_or_else(|e| panic!("{path}: {e}"));
        covered.push(architecture.model_type().to_string());
        v["certainly_not_a_config_key"] = json!(1);
        let err = Architecture::parse(&v.to_string()).err().unwrap();
        assert!(
            err.to_string().contains("certainly_not_a_config_key"),
            "{path}: {err}"
        );
    }
    covered.sort();
    let mut rows: Vec<String> = ARCHITECTURES
        .iter()
        .map(|r| r.model_type.to_string())
        .collect();
    rows.sort();
    assert_eq!(
        covered, rows,
        "a registry row without a config in this test"
    );
}
