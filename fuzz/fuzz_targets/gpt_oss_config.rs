//! Any bytes as a gpt-oss `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::gpt_oss_config(data));
