//! Any bytes as an allowed-signers file: its lines or a refusal naming a line, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::allowed_signers(data));
