//! Any bytes as a tile container header, with any claimed file length: the reader must
//! return a container or a typed error, and tile addressing must stay in range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_format::tile::TileContainer;

fuzz_target!(|input: (u64, &[u8])| {
    let (file_len, header) = input;
    if let Ok(container) = TileContainer::parse(header, file_len) {
        let last = u64::from(container.geometry.tile_count) - 1;
        for index in [0, last, last + 1] {
            if let Ok(range) = container.tile_range(index) {
                assert!(range.end <= container.layout.total_bytes);
            }
            let _ = container.bias_range(index);
            let _ = container.verify_tile(index, &[]);
        }
    }
});
