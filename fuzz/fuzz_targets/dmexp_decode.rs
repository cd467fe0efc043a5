//! Any bytes handed to the decoder: it must return Ok or a typed error, never panic,
//! never allocate from an unchecked length.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dmexp::identify(data);
    if let Ok(view) = dmexp::view(data) {
        for entry in &view.header.tensors {
            let mut out = vec![0.0f32; entry.num_values as usize];
            let _ = view.widen_into(&entry.name, &mut out);
        }
    }
    let _ = dmexp::decode(data);
});
