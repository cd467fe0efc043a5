//! Any bytes as a DeepSeek V4 `config.json`: parsing returns a config or a refusal, never
//! panics, and an accepted config is one the model can be built from.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::deepseek_v4_config(data));
