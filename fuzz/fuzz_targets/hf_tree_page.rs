//! Any bytes as a Hugging Face tree page (the network hands them to us): the page parser must
//! never panic, and every file it accepts has a safe path and a digest of its algorithm's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::tree::{TreeBuilder, check_repo_path};

fuzz_target!(|data: &[u8]| {
    let mut builder = TreeBuilder::default();
    if builder.add_page(data).is_ok() {
        let tree = builder.finish("o/r", "0123456789abcdef0123456789abcdef01234567");
        for (path, file) in &tree.files {
            assert!(check_repo_path(path).is_ok());
            assert_eq!(path, &file.path);
            let expected = if file.digest.algorithm() == "sha256" { 32 } else { 20 };
            assert_eq!(file.digest.bytes().len(), expected);
        }
    }
});
