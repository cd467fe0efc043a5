//! DeepSeek V4 Flash's upstream `config.json`, read fail-closed: the real file parses to V4
//! Flash's shape (the layer kinds from `compress_ratios`, whose MTP entries past the layer count
//! are not read); transformers' own spelling (`layer_types`, `compress_rates`,
//! `mlp_layer_types`, `partial_rotary_factor`) reads the same; an unknown key, a ratio
//! transformers does not map, a missing field and a value the architecture does not have are
//! each refused by name.

use minirun_runtime::ConfigError;
use minirun_runtime::models::deepseek_v4::config::{Attention, DeepSeekV4Config};
use serde_json::{Value, json};

fn upstream() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(config: &Value) -> Result<DeepSeekV4Config, ConfigError> {
    DeepSeekV4Config::parse(&config.to_string())
}

#[test]
fn the_upstream_config_reads_as_v4_flash() {
    let c = parse(&upstream()).unwrap();
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_hidden_layers),
        (129_280, 4096, 43)
    );
    assert_eq!(
        (c.num_attention_heads, c.head_dim, c.qk_rope_head_dim),
        (64, 512, 64)
    );
    assert_eq!((c.q_lora_rank, c.o_groups, c.o_lora_rank), (1024, 8, 1024));
    assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (256, 6));
    assert_eq!(c.hash_layers, 3);
    assert_eq!(c.num_nextn_predict_layers, 1);
    assert_eq!(
        c.attention.len(),
        43,
        "46 ratios, the last 3 the MTP stages'"
    );
    assert_eq!(
        c.attention[..4],
        [
            Attention::Sliding,
            Attention::Sliding,
            Attention::CompressedSparse { rate: 4 },
            Attention::HeavilyCompressed { rate: 128 },
        ]
    );
    assert_eq!(c.attention[42], Attention::CompressedSparse { rate: 4 });
    let yarn = c.yarn.as_ref().unwrap();
    assert_eq!(
        (yarn.factor, yarn.original_max_position_embeddings),
        (16.0, 65536.0)
    );
    assert_eq!((c.rope_theta, c.compress_rope_theta), (10000.0, 160000.0));
    assert_eq!((c.sliding_window, c.index_topk, c.hc_mult), (128, 512, 4));
    for aside in [
        "dspark_block_size",
        "num_nextn_predict_layers",
        "quantization_config",
    ] {
        assert!(c.set_aside.iter().any(|k| k == aside), "{aside} set aside");
    }
}

#[test]
fn transformers_spelling_reads_the_same() {
    let mut c = upstream();
    let map = c.as_object_mut().unwrap();
    let kinds: Vec<Value> = map.remove("compress_ratios").unwrap().as_array().unwrap()[..43]
        .iter()
        .map(|r| match r.as_u64() {
            Some(0) => json!("sliding_attention"),
            Some(4) => json!("compressed_sparse_attention"),
            _ => json!("heavily_compressed_attention"),
        })
        .collect();
    map.insert("layer_types".into(), Value::Array(kinds));
    map.insert(
        "compress_rates".into(),
        json!({"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}),
    );
    map.remove("num_hash_layers");
    let mlp: Vec<Value> = (0..43)
        .map(|i| json!(if i < 3 { "hash_moe" } else { "moe" }))
        .collect();
    map.insert("mlp_layer_types".into(), Value::Array(mlp));
    map.remove("qk_rope_head_dim");
    map.insert("partial_rotary_factor".into(), json!(0.125));
    let (a, b) = (parse(&c).unwrap(), parse(&upstream()).unwrap());
    assert_eq!(a.attention, b.attention);
    assert_eq!(
        (a.hash_layers, a.qk_rope_head_dim),
        (b.hash_layers, b.qk_rope_head_dim)
    );
}

fn refused(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut c = upstream();
    edit(c.as_object_mut().unwrap());
    match parse(&c) {
        Ok(_) => panic!("an edited config was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_cannot_be_run_honestly_is_refused_by_name() {
    let err = refused(|m| {
        m.insert("attn_logit_softcap".into(), json!(30));
    });
    assert!(err.contains("attn_logit_softcap"), "{err}");
    let err = refused(|m| {
        m["compress_ratios"][5] = json!(16);
    });
    assert!(
        err.contains("compress_ratios") && err.contains("16"),
        "{err}"
    );
    let err = refused(|m| {
        m.remove("hc_mult");
    });
    assert!(err.contains("hc_mult"), "{err}");
    let err = refused(|m| {
        m.remove("num_hash_layers");
    });
    assert!(err.contains("num_hash_layers"), "{err}");
    let err = refused(|m| {
        m.insert("scoring_func".into(), json!("sigmoid"));
    });
    assert!(err.contains("scoring_func"), "{err}");
    let err = refused(|m| {
        m.insert("num_key_value_heads".into(), json!(8));
    });
    assert!(err.contains("num_key_value_heads"), "{err}");
    let err = refused(|m| {
        m.insert(
            "rope_scaling".into(),
            json!({"type": "linear", "factor": 2}),
        );
    });
    assert!(err.contains("rope_scaling"), "{err}");
    let err = refused(|m| {
        m.insert("hc_mult".into(), json!(1u64 << 30));
    });
    assert!(err.contains("too large to hold"), "{err}");
    let err = refused(|m| {
        m.insert("num_experts_per_tok".into(), json!(300));
    });
    assert!(err.contains("300 experts per token"), "{err}");
}
