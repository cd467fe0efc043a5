//! Any bytes as the value of an index's `tokenizer` and `configuration` keys: the identity
//! parsers must never panic, and an identity they accept must obey every field rule.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::identity(data));
