//! Any bytes as a Llama or dense Qwen3 `config.json`: parsing returns a config or a refusal, never panics,
//! and an accepted config is one the model can be built from.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::dense_config(data));
