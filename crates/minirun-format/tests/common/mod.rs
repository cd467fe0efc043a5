//! What the tile container's tests share: a geometry of each mode, and a container spec of it.

use minirun_format::tile::{ContainerSpec, ContentKind, Geometry, QuantMode, ScaleDtype};

pub fn geometry(mode: QuantMode, rows: u32, cols: u32, tiles: u32) -> Geometry {
    let (group_size, bits, scale_dtype, scale_block_rows) = match mode {
        QuantMode::Mxfp4 => (32, 4, ScaleDtype::E8m0, 1),
        QuantMode::Affine => (64, 4, ScaleDtype::Bf16, 1),
        QuantMode::Fp8E4m3Block => (128, 8, ScaleDtype::E8m0, 128),
    };
    Geometry {
        mode,
        rows,
        cols,
        group_size,
        bits,
        scale_dtype,
        scale_block_rows,
        tile_count: tiles,
    }
}

pub fn spec(g: Geometry, kind: ContentKind, digests: bool) -> ContainerSpec {
    ContainerSpec {
        geometry: g,
        content_kind: kind,
        seed: 0,
        digests: digests.then(|| (0..g.tile_count).map(|i| [i as u8; 32]).collect()),
    }
}
