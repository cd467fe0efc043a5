//! Synthetic-deterministic content: bytes that anyone can recompute from a seed, used by
//! storage benchmarks and tests. Byte-compatible with the reference generator.
//!
//! - SplitMix64: `state += 0x9E3779B97F4A7C15`, output `mix(state)`;
//! - `value(seed, i) = mix(seed + (i + 1) * gamma)`, the i-th output of a generator seeded with `seed`;
//! - `derive(seed, label) = mix(seed ^ mix(label + 0xD1B54A32D192ED03))`;
//! - content byte at offset `o` = byte `o % 8` of the little-endian `value(seed, o / 8)`;
//! - tile `t` of a container with seed `s` uses `base = s + t * 0x9E3779B9`: its packed bytes
//!   are the content of `derive(base, "PACK")` from offset 0, and scale byte `j` is
//!   `100 + value(derive(base, "SCAL"), j) % 41`, an e8m0 exponent in [100, 140].

use std::io::{Seek, Write};

use crate::tile::{
    ContainerWriter, ContentKind, Geometry, QuantMode, ScaleDtype, TileContainer, WriteError,
};

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Label of the packed stream of a synthetic tile (ASCII "PACK").
pub const PACKED_LABEL: u64 = 0x5041_434B;
/// Label of the scale stream of a synthetic tile (ASCII "SCAL").
pub const SCALE_LABEL: u64 = 0x5343_414C;
const DERIVE_OFFSET: u64 = 0xD1B5_4A32_D192_ED03;
const TILE_SEED_STEP: u64 = 0x9E37_79B9;

/// SplitMix64's output function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
}

impl Iterator for SplitMix64 {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        self.state = self.state.wrapping_add(GAMMA);
        Some(mix(self.state))
    }
}

/// The `index`-th output of a generator seeded with `seed`, in O(1).
pub fn value(seed: u64, index: u64) -> u64 {
    mix(seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A seed derived from `seed` for the stream named `label`.
pub fn derive(seed: u64, label: u64) -> u64 {
    mix(seed ^ mix(label.wrapping_add(DERIVE_OFFSET)))
}

/// Fills `out` with the content of `seed` starting at byte `offset`: the bytes up to the next
/// word boundary, then whole words. Every loop is bounded by `out`'s length, so no arithmetic
/// slip can make it spin in place.
pub fn fill_content(seed: u64, offset: u64, out: &mut [u8]) {
    let skip = (offset % 8) as usize;
    let head = ((8 - skip) % 8).min(out.len());
    let (first, rest) = out.split_at_mut(head);
    first.copy_from_slice(&value(seed, offset / 8).to_le_bytes()[skip..skip + head]);
    let next_word = (offset + head as u64) / 8;
    for (word, chunk) in (next_word..).zip(rest.chunks_mut(8)) {
        chunk.copy_from_slice(&value(seed, word).to_le_bytes()[..chunk.len()]);
    }
}

fn tile_base(seed: u64, tile: u64) -> u64 {
    seed.wrapping_add(tile.wrapping_mul(TILE_SEED_STEP))
}

/// The packed and scale payloads of synthetic tile `tile`.
pub fn tile_payloads(
    seed: u64,
    tile: u64,
    packed_bytes: u64,
    scale_bytes: u64,
) -> (Vec<u8>, Vec<u8>) {
    let base = tile_base(seed, tile);
    let mut packed = vec![0u8; packed_bytes as usize];
    fill_content(derive(base, PACKED_LABEL), 0, &mut packed);
    let scale_seed = derive(base, SCALE_LABEL);
    let scales = (0..scale_bytes)
        .map(|j| 100 + (value(scale_seed, j) % 41) as u8)
        .collect();
    (packed, scales)
}

/// Writes a synthetic mxfp4 container (the only synthetic mode) of `tile_count` tiles of
/// `rows` x `cols`; version 1 without digests, version 2 with.
pub fn write_mxfp4_container<W: Write + Seek>(
    out: W,
    rows: u32,
    cols: u32,
    tile_count: u32,
    seed: u64,
    with_digests: bool,
    mut on_tile: impl FnMut(u32),
) -> Result<(W, TileContainer), WriteError> {
    let geometry = Geometry {
        mode: QuantMode::Mxfp4,
        rows,
        cols,
        group_size: 32,
        bits: 4,
        scale_dtype: ScaleDtype::E8m0,
        scale_block_rows: 1,
        tile_count,
    };
    let mut writer = ContainerWriter::new(
        out,
        geometry,
        ContentKind::SyntheticDeterministic,
        seed,
        with_digests,
    )?;
    let layout = geometry.layout().map_err(crate::tile::TileError::from)?;
    for tile in 0..tile_count {
        let (packed, scales) = tile_payloads(
            seed,
            u64::from(tile),
            layout.packed_bytes,
            layout.scale_bytes,
        );
        writer.push_tile(&packed, &scales, &[])?;
        on_tile(tile);
    }
    writer.finish()
}

/// Why a regeneration check did not confirm a tile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegenerationError {
    #[error(
        "this container is checkpoint-derived: its bytes cannot be recomputed, only checked against a digest"
    )]
    CheckpointDerived,
    #[error("only synthetic mxfp4 containers can be regenerated; this one is {0}")]
    NotMxfp4(QuantMode),
    #[error(transparent)]
    Tile(#[from] crate::tile::TileError),
    #[error("tile {tile} is {actual} bytes; a tile is {expected}")]
    Length {
        tile: u64,
        expected: u64,
        actual: u64,
    },
    #[error(
        "tile {tile} differs from the synthetic content of seed {seed} at tile byte {offset}{v1_note}"
    )]
    Mismatch {
        tile: u64,
        seed: u64,
        offset: u64,
        v1_note: &'static str,
    },
}

/// Recomputes synthetic tile `tile` and compares it with `bytes` (the tile's whole stride).
/// Refused for checkpoint-derived content, which can only be checked against a digest.
pub fn regenerate_check(
    container: &TileContainer,
    tile: u64,
    bytes: &[u8],
) -> Result<(), RegenerationError> {
    if container.content_kind == ContentKind::CheckpointDerived {
        return Err(RegenerationError::CheckpointDerived);
    }
    if container.geometry.mode != QuantMode::Mxfp4 {
        return Err(RegenerationError::NotMxfp4(container.geometry.mode));
    }
    let range = container.tile_range(tile)?;
    let l = container.layout;
    if bytes.len() as u64 != range.end - range.start {
        return Err(RegenerationError::Length {
            tile,
            expected: l.tile_stride,
            actual: bytes.len() as u64,
        });
    }
    let (packed, scales) = tile_payloads(container.seed, tile, l.packed_bytes, l.scale_bytes);
    let mut expected = packed;
    expected.resize(l.scale_offset as usize, 0);
    expected.extend_from_slice(&scales);
    expected.resize(l.tile_stride as usize, 0);
    match expected.iter().zip(bytes).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(offset) => Err(RegenerationError::Mismatch {
            tile,
            seed: container.seed,
            offset: offset as u64,
            v1_note: if container.content_kind_declared {
                ""
            } else {
                " (a version-1 container cannot declare checkpoint-derived content, so this may be a \
                 checkpoint's bytes, as in the published Kimi K3 experts: check it against a digest instead)"
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Content is one stream: any window of it, at any offset and length, is the same bytes
    /// as that window of the whole.
    #[test]
    fn any_window_of_the_content_is_that_window_of_the_whole() {
        let mut whole = [0u8; 48];
        fill_content(7, 0, &mut whole);
        for offset in 0..24 {
            for len in 0..=24 {
                let mut window = vec![0u8; len];
                fill_content(7, offset as u64, &mut window);
                assert_eq!(window, whole[offset..offset + len], "{offset}+{len}");
            }
        }
    }
}
