//! Any bytes as the start of a `.ngram` sidecar: the header parser must never panic, and a
//! header it accepts must obey the documented rules.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::ngram_header(data));
