//! Any bytes as the value of an index's `tokenizer` and `configuration` keys: the identity
//! parsers must never panic, and an identity they accept must obey every field rule.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::identity::{
    is_canonical_repo_id, is_canonical_root_file_name, is_pinned_revision,
};
use minirun_format::index::ArtifactIndex;

fuzz_target!(|data: &[u8]| {
    // Splicing the input in as both values reaches the identity parsers through the public
    // reader without giving this crate its own JSON dependency.
    let mut document = b"{\"tokenizer\":".to_vec();
    document.extend_from_slice(data);
    document.extend_from_slice(b",\"configuration\":");
    document.extend_from_slice(data);
    document.push(b'}');
    let index = ArtifactIndex::parse(&document);
    if let Some(Ok(tokenizer)) = &index.tokenizer {
        assert!(is_canonical_root_file_name(&tokenizer.file));
        assert!(is_canonical_root_file_name(&tokenizer.license));
        assert!(tokenizer.bytes > 0);
        assert!(is_canonical_repo_id(&tokenizer.source_repo));
        assert!(is_pinned_revision(&tokenizer.source_revision));
        assert!(
            tokenizer.sha256.len() == 64
                && !tokenizer.sha256.bytes().any(|b| b.is_ascii_uppercase())
        );
    }
    if let Some(Ok(configuration)) = &index.configuration {
        assert!(is_canonical_root_file_name(&configuration.file));
        assert!(configuration.bytes > 0);
        assert!(is_canonical_repo_id(&configuration.source_repo));
        assert!(is_pinned_revision(&configuration.source_revision));
    }
});
