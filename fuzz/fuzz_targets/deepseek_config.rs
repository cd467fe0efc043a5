//! Any bytes as a DeepSeek-V3 `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from (groups divide experts, and so on).
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_runtime::models::deepseek_v3::DeepSeekV3Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = DeepSeekV3Config::parse(text) {
        assert!(c.n_routed_experts % c.n_group == 0);
        assert!(c.topk_group <= c.n_group);
        assert!(c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group));
        assert!(c.qk_rope_head_dim % 2 == 0);
    }
});
