//! Any bytes as a published Kimi K3 `layerNN/manifest.json`: parsing returns a manifest or a
//! refusal, never panics, and an accepted manifest's tensors cover their rows band by band
//! inside the blob.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::k3_layer_manifest(data));
