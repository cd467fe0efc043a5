//! Any bytes as a tile container header, with any claimed file length: the reader must
//! return a container or a typed error, and tile addressing must stay in range.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::tile_header(data));
