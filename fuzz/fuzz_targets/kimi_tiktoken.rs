//! Any bytes as Kimi K3's `tiktoken.model`: parsing returns a vocabulary or a refusal, never
//! panics, and an accepted vocabulary encodes text and decodes it back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_text::tiktoken::KimiText;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = KimiText::parse(data) {
        let sample = "The clockmaker's 12 clocks, 钟表匠\n  done. ";
        let ids = text.encode(sample).expect("every byte is a token");
        assert_eq!(text.decode(&ids).unwrap(), sample);
    }
});
