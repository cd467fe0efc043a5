//! Any bytes as a unit's manifest.json (an artifact folder is untrusted input): the parser must
//! never panic, and every manifest it accepts names its unit and lists distinct plain file names.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use minirun_format::artifact::{is_member_file_name, parse_manifest};

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = parse_manifest("layer00", data) {
        assert_eq!(manifest.unit, "layer00");
        let mut names = BTreeSet::new();
        for file in &manifest.files {
            assert!(is_member_file_name(file.name()));
            assert!(names.insert(file.name()));
        }
    }
});
