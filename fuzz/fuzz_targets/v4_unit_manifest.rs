//! Any bytes as a published DeepSeek V4 unit manifest: parsing returns a manifest or a refusal,
//! never panics, and an accepted manifest obeys the layout's rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::artifact::v4_published::{V4File, V4UnitManifest};

fuzz_target!(|data: &[u8]| {
    for unit in ["layers02", "global00", "mtp00"] {
        let Ok(m) = V4UnitManifest::parse(data, unit) else { continue };
        assert_eq!(m.unit, unit);
        let _ = m.total_bytes();
        for f in &m.files {
            if let V4File::Blob { bytes, tensors, .. } = f {
                let mut at = 0;
                for t in tensors {
                    assert_eq!(t.offset, at);
                    at += t.bytes;
                }
                assert_eq!(at, *bytes);
            }
        }
        if let Some(order) = &m.expert_order {
            let mut seen = order.clone();
            seen.sort_unstable();
            assert!(seen.iter().enumerate().all(|(i, &e)| i as u32 == e));
        }
    }
});
