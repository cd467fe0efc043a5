//! Any bytes as Kimi K3's `tiktoken.model`: parsing returns a vocabulary or a refusal, never
//! panics, and an accepted vocabulary encodes text and decodes it back.
#![no_main]

static DEFAULT_PANIC_HOOK: std::sync::Once = std::sync::Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The byte-pair encoder's constructor panics on a vocabulary it cannot hold, and the
    // parser catches that and refuses the file. libFuzzer's hook aborts at the panic, before
    // any catch; with the default hook a caught panic is a refusal, and one that escapes the
    // parser still aborts the run when it reaches libFuzzer's own catch.
    DEFAULT_PANIC_HOOK.call_once(|| drop(std::panic::take_hook()));
    fuzz_properties::kimi_tiktoken(data)
});
