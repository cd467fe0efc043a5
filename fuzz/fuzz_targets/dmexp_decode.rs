//! Any bytes handed to the decoder: it must return Ok or a typed error, never panic,
//! never allocate from an unchecked length.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::dmexp_decode(data));
