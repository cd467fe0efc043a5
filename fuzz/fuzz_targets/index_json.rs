//! Any bytes as an `index.json`: the reader must always return an index (never panic), and
//! what it returns must describe itself without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::index::{ArtifactIndex, IndexShape};

fuzz_target!(|data: &[u8]| {
    let index = ArtifactIndex::parse(data);
    let _ = index.describe();
    // A claim is one pair: files and bytes are stated together or not at all.
    assert_eq!(index.files.is_some(), index.bytes.is_some());
    if index.parse_problem.is_some() {
        assert_eq!(index.shape, IndexShape::Unrecognized);
    }
});
