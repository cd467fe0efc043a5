//! Any bytes as a published Kimi K3 `layerNN/manifest.json`: parsing returns a manifest or a
//! refusal, never panics, and an accepted manifest's tensors cover their rows band by band
//! inside the blob.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::artifact::k3_published::K3LayerManifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = K3LayerManifest::parse(data, "layer01/manifest.json", 1) {
        let tensors = m.tensors("layer01/manifest.json").expect("checked at parse");
        for t in tensors.values() {
            assert!(t.rows > 0 && t.cols > 0 && !t.bands.is_empty());
            for &(offset, len) in &t.bands {
                assert!(offset + len <= m.nonexpert.bytes);
            }
        }
    }
});
