//! Any bytes as a published DeepSeek V4 unit manifest: parsing returns a manifest or a refusal,
//! never panics, and an accepted manifest obeys the layout's rules.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::v4_unit_manifest(data));
