//! Kimi K3's published `config.json`, read fail-closed: the real file parses to the published
//! shape; an unknown key, a missing field, a value the architecture does not have, a flat
//! config and an inconsistent layer list are each refused by name; vision and bookkeeping keys
//! are set aside by name and reported.

use minirun_runtime::ConfigError;
use minirun_runtime::models::kimi_k3::config::KimiK3Config;
use serde_json::Value;

fn published() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(config: &Value) -> Result<KimiK3Config, ConfigError> {
    KimiK3Config::parse(&config.to_string())
}

#[test]
fn the_published_config_reads_as_k3s_shape() {
    let c = parse(&published()).unwrap();
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.num_hidden_layers),
        (163_840, 7168, 93)
    );
    assert_eq!(c.kda.layers.len(), 69);
    let mla: Vec<usize> = (0..93).filter(|&i| !c.is_kda(i)).collect();
    assert_eq!(mla.len(), 24);
    assert_eq!(&mla[..3], &[3, 7, 11], "1-indexed 4, 8, 12 in the config");
    assert_eq!(mla.last(), Some(&92));
    assert_eq!((c.kda.num_heads, c.kda.head_dim), (96, 128));
    assert_eq!(c.kda.gate_lower_bound, -5.0);
    assert_eq!(
        (c.num_experts, c.num_experts_per_token, c.num_shared_experts),
        (896, 16, 2)
    );
    assert_eq!(
        (c.routed_expert_hidden_size, c.moe_intermediate_size),
        (3584, 3072)
    );
    assert_eq!(c.attn_res_block_size, 12);
    assert!(!c.is_moe(0) && c.is_moe(1), "layer 0 is dense");
    assert_eq!(c.eos_token_ids, vec![163_586]);
    for aside in [
        "vision_config",
        "media_placeholder_token_id",
        "text_config.quantization_config",
        "text_config.num_key_value_heads",
    ] {
        assert!(
            c.set_aside.iter().any(|k| k == aside),
            "{aside}: {:?}",
            c.set_aside
        );
    }
}

#[test]
fn unknown_keys_are_refused_by_name_at_every_level() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 3] = [
        ("speculative", |c| {
            c["speculative"] = 1.into();
        }),
        ("text_config.rope_theta", |c| {
            c["text_config"]["rope_theta"] = 10000.into();
        }),
        ("text_config.linear_attn_config.chunk_size", |c| {
            c["text_config"]["linear_attn_config"]["chunk_size"] = 64.into();
        }),
    ];
    for (key, edit) in cases {
        let mut config = published();
        edit(&mut config);
        let err = parse(&config).unwrap_err();
        assert_eq!(err, ConfigError::Unknown(key.to_string()), "{err}");
    }
}

#[test]
fn missing_fields_and_values_the_architecture_lacks_are_refused() {
    let mut config = published();
    config["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("routed_expert_hidden_size");
    let err = parse(&config).unwrap_err();
    assert!(
        err.to_string()
            .contains("text_config.routed_expert_hidden_size"),
        "{err}"
    );

    for (key, value) in [
        ("hidden_act", Value::from("silu")),
        ("moe_router_activation_func", Value::from("softmax")),
        ("mla_use_nope", Value::from(false)),
    ] {
        let mut config = published();
        config["text_config"][key] = value;
        let err = parse(&config).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Unsupported { key: k, .. } if k == &format!("text_config.{key}")),
            "{err}"
        );
    }
    let mut config = published();
    config["text_config"]["linear_attn_config"]["use_full_rank_gate"] = false.into();
    assert!(matches!(
        parse(&config),
        Err(ConfigError::Unsupported { .. })
    ));
}

#[test]
fn a_flat_config_another_model_type_and_inconsistent_layers_are_refused() {
    let mut flat = published()["text_config"].clone();
    flat["model_type"] = "kimi_k3".into();
    let err = parse(&flat).unwrap_err();
    assert!(err.to_string().contains("text_config"), "{err}");

    let mut other = published();
    other["model_type"] = "kimi_linear".into();
    assert!(matches!(
        parse(&other),
        Err(ConfigError::Unsupported { .. })
    ));

    let mut both = published();
    both["text_config"]["linear_attn_config"]["full_attn_layers"] = serde_json::json!([4, 5]);
    let err = parse(&both).unwrap_err();
    assert!(err.to_string().contains("complement"), "{err}");

    let mut past_the_end = published();
    past_the_end["text_config"]["linear_attn_config"]["kda_layers"] = serde_json::json!([1, 94]);
    assert!(matches!(
        parse(&past_the_end),
        Err(ConfigError::Inconsistent(_))
    ));

    let mut tie = published();
    tie["tie_word_embeddings"] = true.into();
    assert!(matches!(parse(&tie), Err(ConfigError::Inconsistent(_))));
}

/// The tiny checkpoints `tools/make_k3_fixtures.py` builds with mlx-lm's `kimi_k3` carry the
/// config mlx-lm writes (its quantization keys at the top level): it reads as their shape.
#[test]
fn the_mlx_lm_fixture_configs_read_as_the_tiny_shape() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kimi-k3");
    for variant in ["mlx-affine4-g64", "mlx-mxfp4", "mlx-k3mix"] {
        let text = std::fs::read_to_string(data.join(variant).join("config.json")).unwrap();
        let c = KimiK3Config::parse(&text).unwrap_or_else(|e| panic!("{variant}: {e}"));
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.vocab_size),
            (128, 6, 512)
        );
        assert_eq!(c.kda.layers, vec![0, 1, 2, 4], "{variant}");
        assert_eq!(c.routed_scaling_factor, 2.5);
        assert!(c.set_aside.iter().any(|k| k == "quantization"), "{variant}");
    }
}

/// The planner's cache reserve: K3's state and latents, and a saturated figure (not an overflow)
/// for sizes whose product no machine holds.
#[test]
fn the_cache_reserve_counts_kda_state_and_saturates_on_absurd_sizes() {
    use minirun_stream::plan::Shape;
    let c = parse(&published()).unwrap();
    // 69 KDA layers of 96 x 128 x 128 state and a 3 x 3 x 12,288 window; 24 MLA layers of
    // (512 + 64) floats a position; all f32.
    let fixed = 69 * (96 * 128 * 128 + 3 * 3 * 96 * 128) * 4;
    assert_eq!(c.cache_bytes(0), fixed);
    assert_eq!(c.cache_bytes(10), fixed + 10 * 24 * 576 * 4);
    let mut absurd = published();
    absurd["text_config"]["linear_attn_config"]["head_dim"] = ((1u64 << 31) - 1).into();
    absurd["text_config"]["linear_attn_config"]["num_heads"] = ((1u64 << 31) - 1).into();
    assert_eq!(parse(&absurd).unwrap().cache_bytes(1), u64::MAX);
}

/// The dtype a checkpoint was saved in cannot change the logits (the artifact's manifests say
/// how each tensor is stored): `torch_dtype`, which mlx-lm writes, is set aside like `dtype`, at
/// the top level and in `text_config`, as the other architectures' readers accept both.
#[test]
fn torch_dtype_is_set_aside_like_dtype() {
    for path in [&[][..], &["text_config"][..]] {
        for key in ["torch_dtype", "dtype"] {
            let mut config = published();
            let mut at = &mut config;
            for step in path {
                at = &mut at[*step];
            }
            at[key] = "bfloat16".into();
            let parsed = parse(&config).unwrap_or_else(|e| panic!("{path:?} {key}: {e}"));
            let named = [path, &[key][..]].concat().join(".");
            assert!(
                parsed.set_aside.contains(&named),
                "{named}: {:?}",
                parsed.set_aside
            );
        }
    }
}
