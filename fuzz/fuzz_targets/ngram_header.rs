//! Any bytes as the start of a `.ngram` sidecar: the header parser must never panic, and a
//! header it accepts must obey the documented rules.
#![no_main]

use std::path::Path;

use dormouse::engram::MAX_ORDERS;
use dormouse::engram::sidecar::{HEADER_LEN, parse_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = parse_header(data, Path::new("fuzz.ngram")) {
        assert!(data.len() >= HEADER_LEN);
        assert!((1..=MAX_ORDERS).contains(&header.shape.orders.len()));
    }
});
