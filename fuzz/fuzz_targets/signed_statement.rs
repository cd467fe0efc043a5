//! Any bytes as a signed artifact's statement: parsing returns a statement or a refusal, never
//! panics, and what it accepts is canonical.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::signed_statement(data));
