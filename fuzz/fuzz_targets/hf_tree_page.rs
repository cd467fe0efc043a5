//! Any bytes as a Hugging Face tree page (the network hands them to us): the page parser must
//! never panic, and every file it accepts has a safe path and a digest of its algorithm's size.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::hf_tree_page(data));
