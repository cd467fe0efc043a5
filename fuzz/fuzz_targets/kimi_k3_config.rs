//! Any bytes as a Kimi K3 `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_runtime::models::kimi_k3::config::KimiK3Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = KimiK3Config::parse(text) {
        assert!(c.num_experts % c.num_expert_group == 0);
        assert!(c.topk_group <= c.num_expert_group);
        assert!(c.num_experts_per_token <= c.num_experts);
        assert!(c.kda.short_conv_kernel_size >= 1 && c.kda.head_dim >= 1);
        assert!(c.kda.layers.windows(2).all(|w| w[0] < w[1]));
        assert!(c.kda.layers.iter().all(|&l| l < c.num_hidden_layers));
    }
});
