//! Any bytes as a unit's manifest.json (an artifact folder is untrusted input): the parser must
//! never panic, and every manifest it accepts names its unit and lists distinct plain file names.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::unit_manifest(data));
