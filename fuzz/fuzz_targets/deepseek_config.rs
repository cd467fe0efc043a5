//! Any bytes as a DeepSeek-V3 `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from (groups divide experts, and so on).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::deepseek_config(data));
