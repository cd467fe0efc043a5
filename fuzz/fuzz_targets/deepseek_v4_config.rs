//! Any bytes as a DeepSeek V4 `config.json`: parsing returns a config or a refusal, never
//! panics, and an accepted config is one the model can be built from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_runtime::models::deepseek_v4::config::DeepSeekV4Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = DeepSeekV4Config::parse(text) {
        assert_eq!(c.attention.len(), c.num_hidden_layers);
        assert!(c.num_experts_per_tok <= c.n_routed_experts);
        assert!(c.qk_rope_head_dim <= c.head_dim && c.qk_rope_head_dim <= c.index_head_dim);
        assert!(c.num_attention_heads % c.o_groups == 0);
        assert!(c.hash_layers <= c.num_hidden_layers);
        let _ = c.cache_bytes(usize::MAX);
    }
});
