//! Any bytes as Kimi K3's `tiktoken.model`: parsing returns a vocabulary or a refusal, never
//! panics, and an accepted vocabulary encodes text and decodes it back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::kimi_tiktoken(data));
