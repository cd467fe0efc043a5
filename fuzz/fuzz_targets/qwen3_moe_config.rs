//! Any bytes as a Qwen3-MoE `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_runtime::models::qwen3_moe::config::Qwen3MoeConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = Qwen3MoeConfig::parse(text) {
        assert!(c.num_attention_heads % c.num_key_value_heads == 0);
        assert!(c.head_dim % 2 == 0);
        assert!(c.num_experts_per_tok <= c.num_experts);
        assert!(c.mlp_only_layers.iter().all(|&l| l < c.num_hidden_layers));
    }
});
