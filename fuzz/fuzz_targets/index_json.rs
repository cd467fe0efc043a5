//! Any bytes as an `index.json`: the reader must always return an index (never panic), and
//! what it returns must describe itself without panicking either.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::index_json(data));
