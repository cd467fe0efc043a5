//! The tile container's reader and tiles: one typed refusal per broken header rule, payload
//! ranges inside their tile, FP8 and affine tiles as written, bounded tile checks, synthetic
//! tiles regenerated, and properties over every valid geometry.

mod common;

use common::{geometry, spec};
use std::io::Cursor;

use minirun_format::synthetic::{self, RegenerationError};
use minirun_format::tile::{
    CHECK_CHUNK, ContainerWriter, ContentKind, Flags, Geometry, GeometryError, QuantMode,
    ScaleDtype, TileCheck, TileCheckError, TileContainer, TileError, WriteError, digest_capacity,
};

/// Whether an error is the one a case expects.
type IsTileError = fn(&TileError) -> bool;
/// One change to a header's bytes.
type Edit = Box<dyn Fn(&mut Vec<u8>)>;

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A valid header of each version to break one rule at a time.
fn headers() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let v1 = spec(
        geometry(QuantMode::Mxfp4, 512, 1024, 2),
        ContentKind::SyntheticDeterministic,
        false,
    );
    let v2 = spec(
        geometry(QuantMode::Affine, 768, 2048, 4),
        ContentKind::CheckpointDerived,
        true,
    );
    let v3 = spec(
        geometry(QuantMode::Fp8E4m3Block, 512, 4096, 1),
        ContentKind::CheckpointDerived,
        true,
    );
    (
        v1.encode_header().unwrap().0,
        v2.encode_header().unwrap().0,
        v3.encode_header().unwrap().0,
    )
}

/// A file holding the whole header but no tiles is short of its tiles, not truncated.
#[test]
fn a_header_alone_is_a_file_too_short_for_its_tiles() {
    let (_, v2, _) = headers();
    let err = TileContainer::parse(&v2, 16_384).unwrap_err();
    assert!(
        matches!(err, TileError::FileTooShort { len: 16_384, .. }),
        "{err:?}"
    );
}

#[test]
fn a_digest_table_may_fill_the_header_exactly() {
    for (mode, version) in [(QuantMode::Affine, 2), (QuantMode::Fp8E4m3Block, 3)] {
        let capacity = digest_capacity(version);
        let g = geometry(mode, 512, 4096, capacity as u32);
        let (header, container) = spec(g, ContentKind::CheckpointDerived, true)
            .encode_header()
            .unwrap();
        assert_eq!(container.version, version);
        let read = TileContainer::parse(&header, container.layout.total_bytes).unwrap();
        assert_eq!(read.digests.map(|d| d.len() as u64), Some(capacity));
    }
}

/// Each payload range sits at its offset inside its own tile, and only affine tiles have biases.
#[test]
fn payload_ranges_sit_inside_their_tile() {
    let (v1, v2, _) = headers();
    for (header, biases) in [(v2, true), (v1, false)] {
        let c = TileContainer::parse(&header, 1 << 40).unwrap();
        let l = c.layout;
        let tile = c.tile_range(1).unwrap();
        assert_eq!(tile.start, 16_384 + l.tile_stride);
        assert_eq!(
            c.packed_range(1).unwrap(),
            tile.start..tile.start + l.packed_bytes
        );
        let scales = tile.start + l.scale_offset;
        assert_eq!(c.scale_range(1).unwrap(), scales..scales + l.scale_bytes);
        let bias = tile.start + l.bias_offset;
        let expected = biases.then(|| bias..bias + l.bias_bytes);
        assert_eq!(c.bias_range(1).unwrap(), expected);
    }
}

#[test]
fn the_reader_refuses_each_broken_rule_with_its_own_error() {
    let (v1, v2, v3) = headers();
    let big = 1u64 << 40;
    let check = |bytes: &[u8], expected: fn(&TileError) -> bool| {
        let err = TileContainer::parse(bytes, big).unwrap_err();
        assert!(expected(&err), "{err:?}");
    };
    check(&v2[..16383], |e| matches!(e, TileError::Truncated { .. }));
    let edits: Vec<(&Vec<u8>, Edit, IsTileError)> = vec![
        (&v1, Box::new(|b| b[0] = b'X'), |e| {
            matches!(e, TileError::BadMagic { .. })
        }),
        (&v1, Box::new(|b| put_u32(b, 8, 4)), |e| {
            matches!(e, TileError::UnsupportedVersion { found: 4 })
        }),
        (&v1, Box::new(|b| put_u32(b, 8, 0)), |e| {
            matches!(e, TileError::UnsupportedVersion { found: 0 })
        }),
        (&v1, Box::new(|b| put_u32(b, 12, 4096)), |e| {
            matches!(e, TileError::HeaderSize { found: 4096 })
        }),
        (&v2, Box::new(|b| put_u32(b, 80, 3)), |e| {
            matches!(e, TileError::UnknownMode { code: 3 })
        }),
        (&v2, Box::new(|b| put_u32(b, 88, 2)), |e| {
            matches!(e, TileError::UnknownContentKind { code: 2 })
        }),
        (&v2, Box::new(|b| put_u32(b, 92, 0x13)), |e| {
            matches!(e, TileError::UnknownFlags { unknown: 0x10, .. })
        }),
        (&v2, Box::new(|b| put_u32(b, 120, 9)), |e| {
            matches!(e, TileError::UnknownScaleDtype { code: 9 })
        }),
        (&v2, Box::new(|b| put_u32(b, 124, 1)), |e| {
            matches!(e, TileError::ReservedNonZero { offset: 124, .. })
        }),
        (&v2, Box::new(|b| put_u32(b, 92, 0x2)), |e| {
            matches!(e, TileError::BiasFlag { flag: false, .. })
        }),
        (&v3, Box::new(|b| put_u32(b, 148, 1)), |e| {
            matches!(e, TileError::ReservedNonZero { offset: 148, .. })
        }),
        (&v3, Box::new(|b| put_u64(b, 152, 1)), |e| {
            matches!(e, TileError::ReservedNonZero { offset: 152, .. })
        }),
        (&v2, Box::new(|b| put_u32(b, 92, 0x7)), |e| {
            matches!(e, TileError::FlagsNeedV3 { .. })
        }),
        (&v2, Box::new(|b| put_u64(b, 112, 0)), |e| {
            matches!(
                e,
                TileError::DigestTableOffset {
                    found: 0,
                    expected: 128
                }
            )
        }),
        (&v3, Box::new(|b| put_u64(b, 112, 128)), |e| {
            matches!(
                e,
                TileError::DigestTableOffset {
                    found: 128,
                    expected: 160
                }
            )
        }),
        (
            &v2,
            Box::new(|b| {
                put_u32(b, 92, 0x1);
            }),
            |e| {
                matches!(
                    e,
                    TileError::DigestTableOffset {
                        found: 128,
                        expected: 0
                    }
                )
            },
        ),
        (&v2, Box::new(|b| put_u32(b, 16, 600)), |e| {
            matches!(e, TileError::DigestTableTooLarge { tiles: 600, .. })
        }),
        (&v2, Box::new(|b| put_u32(b, 24, 2000)), |e| {
            matches!(e, TileError::Geometry(GeometryError::ColsGroup { .. }))
        }),
        (&v1, Box::new(|b| put_u64(b, 56, 278_529)), |e| {
            matches!(
                e,
                TileError::DerivedField {
                    field: "tile_stride",
                    ..
                }
            )
        }),
        (&v2, Box::new(|b| put_u64(b, 104, 0)), |e| {
            matches!(
                e,
                TileError::DerivedField {
                    field: "bias_offset",
                    ..
                }
            )
        }),
        (&v3, Box::new(|b| put_u64(b, 140, 0)), |e| {
            matches!(
                e,
                TileError::DerivedField {
                    field: "scale_region",
                    ..
                }
            )
        }),
        (&v3, Box::new(|b| put_u32(b, 92, 0x6)), |e| {
            matches!(
                e,
                TileError::FlagsMismatch {
                    declared: 0x6,
                    derived: 0xE
                }
            )
        }),
    ];
    for (base, edit, expected) in edits {
        let mut bytes = base.clone();
        edit(&mut bytes);
        check(&bytes, expected);
    }
    // A v1-expressible container declared as version 2 is refused: writers emit the lowest.
    let mut as_v2 = v1.clone();
    put_u32(&mut as_v2, 8, 2);
    put_u32(&mut as_v2, 84, 4);
    check(&as_v2, |e| {
        matches!(
            e,
            TileError::VersionTooHigh {
                declared: 2,
                needed: 1
            }
        )
    });
}

#[test]
fn fp8_tiles_are_padded_hashed_and_checked() {
    let g = geometry(QuantMode::Fp8E4m3Block, 256, 1024, 3);
    let layout = g.layout().unwrap();
    assert_eq!((layout.scale_bytes, layout.scale_region), (2 * 8, 16_384));
    let mut writer = ContainerWriter::new(
        Cursor::new(Vec::new()),
        g,
        ContentKind::CheckpointDerived,
        0,
        true,
    )
    .unwrap();
    for tile in 0..3u8 {
        let packed = vec![tile + 1; layout.packed_bytes as usize];
        let scales = vec![127 + tile; layout.scale_bytes as usize];
        writer.push_tile(&packed, &scales, &[]).unwrap();
    }
    let (out, container) = writer.finish().unwrap();
    let bytes = out.into_inner();
    assert_eq!(bytes.len() as u64, container.layout.total_bytes);
    let read = TileContainer::parse(&bytes, bytes.len() as u64).unwrap();
    assert_eq!(read, container);
    for i in 0..3 {
        let r = read.tile_range(i).unwrap();
        let tile = &bytes[r.start as usize..r.end as usize];
        read.verify_tile(i, tile).unwrap();
        let s = read.scale_range(i).unwrap();
        assert!(
            bytes[s.start as usize..s.end as usize]
                .iter()
                .all(|&b| b == 127 + i as u8)
        );
        assert!(
            bytes[s.end as usize..r.end as usize]
                .iter()
                .all(|&b| b == 0),
            "zero padding"
        );
        let mut corrupt = tile.to_vec();
        corrupt[100] ^= 1;
        assert!(matches!(
            read.verify_tile(i, &corrupt),
            Err(TileError::DigestMismatch { .. })
        ));
    }
    assert!(matches!(
        read.tile_range(3),
        Err(TileError::NoSuchTile { index: 3, count: 3 })
    ));
    assert!(matches!(
        synthetic::regenerate_check(&read, 0, &bytes[16384..16384 + layout.tile_stride as usize]),
        Err(RegenerationError::CheckpointDerived)
    ));
}

#[test]
fn affine_tiles_place_biases_after_scales_and_the_writer_checks_payload_sizes() {
    let g = geometry(QuantMode::Affine, 768, 2048, 1);
    let l = g.layout().unwrap();
    let mut writer = ContainerWriter::new(
        Cursor::new(Vec::new()),
        g,
        ContentKind::CheckpointDerived,
        0,
        false,
    )
    .unwrap();
    let packed = vec![1u8; l.packed_bytes as usize];
    let scales = vec![2u8; l.scale_bytes as usize];
    let err = writer.push_tile(&packed, &scales, &[]).unwrap_err();
    assert!(
        matches!(err, WriteError::SubRegion { region: "bias", .. }),
        "{err}"
    );
    writer
        .push_tile(&packed, &scales, &vec![3u8; l.bias_bytes as usize])
        .unwrap();
    let (out, c) = writer.finish().unwrap();
    let bytes = out.into_inner();
    let b = c.bias_range(0).unwrap().unwrap();
    assert_eq!(b.start, 16_384 + 786_432 + 49_152);
    assert!(
        bytes[b.start as usize..b.end as usize]
            .iter()
            .all(|&x| x == 3)
    );
    assert!(matches!(
        c.verify_tile(0, &bytes[16384..]),
        Err(TileError::NoDigests)
    ));
}

#[test]
fn the_writer_places_the_header_where_the_container_starts() {
    let mut out = Cursor::new(b"prefix".to_vec());
    out.set_position(6);
    let (out, c) = synthetic::write_mxfp4_container(out, 512, 1024, 1, 3, true, |_| {}).unwrap();
    let bytes = out.into_inner();
    assert_eq!(&bytes[..6], b"prefix");
    assert_eq!(
        TileContainer::parse(&bytes[6..], bytes.len() as u64 - 6).unwrap(),
        c
    );
    let err = ContainerWriter::new(
        Cursor::new(Vec::new()),
        geometry(QuantMode::Mxfp4, 512, 1024, 2),
        ContentKind::SyntheticDeterministic,
        0,
        false,
    )
    .unwrap()
    .finish()
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            WriteError::TileCount {
                written: 0,
                declared: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn a_tile_past_the_declared_count_is_refused_and_counted() {
    let g = geometry(QuantMode::Mxfp4, 512, 1024, 1);
    let l = g.layout().unwrap();
    let mut writer = ContainerWriter::new(
        Cursor::new(Vec::new()),
        g,
        ContentKind::CheckpointDerived,
        0,
        false,
    )
    .unwrap();
    let (packed, scales) = (
        vec![0; l.packed_bytes as usize],
        vec![127; l.scale_bytes as usize],
    );
    writer.push_tile(&packed, &scales, &[]).unwrap();
    let err = writer.push_tile(&packed, &scales, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            WriteError::TileCount {
                written: 2,
                declared: 1
            }
        ),
        "{err}"
    );
}

/// A tile larger than the check's chunk is read in whole chunks, front to back, every byte
/// once, and a byte changed anywhere in it is found.
#[test]
fn a_large_tile_is_checked_in_bounded_chunks_covering_every_byte() {
    let g = geometry(QuantMode::Fp8E4m3Block, 1152, 4096, 2);
    let layout = g.layout().unwrap();
    let mut writer = ContainerWriter::new(
        Cursor::new(Vec::new()),
        g,
        ContentKind::CheckpointDerived,
        0,
        true,
    )
    .unwrap();
    for tile in 0..2u8 {
        let packed: Vec<u8> = (0..layout.packed_bytes)
            .map(|i| (i % 251) as u8 ^ tile)
            .collect();
        writer
            .push_tile(&packed, &vec![127; layout.scale_bytes as usize], &[])
            .unwrap();
    }
    let (out, container) = writer.finish().unwrap();
    let mut bytes = out.into_inner();
    let range = container.tile_range(1).unwrap();
    assert!(
        range.end - range.start > CHECK_CHUNK,
        "the tile spans chunks"
    );
    assert_eq!(
        TileCheck::method(&container).unwrap(),
        "SHA-256 against the header's digests"
    );

    let mut reads = Vec::new();
    let mut reported = 0;
    let checked = container.check_tile_from(
        1,
        |at, buf| {
            reads.push((at, buf.len() as u64));
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        },
        |n| reported += n,
    );
    assert_eq!(checked.unwrap(), TileCheck::Digest);
    assert_eq!(reads[0], (range.start, CHECK_CHUNK));
    let mut next = range.start;
    for &(at, len) in &reads {
        assert_eq!(at, next, "reads are contiguous");
        assert!(len <= CHECK_CHUNK && len > 0);
        next = at + len;
    }
    assert_eq!((next, reported), (range.end, range.end - range.start));

    bytes[(range.start + CHECK_CHUNK + 5) as usize] ^= 1;
    let read_at = |at: u64, buf: &mut [u8]| {
        buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
        Ok(())
    };
    assert!(matches!(
        container.check_tile_from(1, read_at, |_| {}),
        Err(TileCheckError::Tile(TileError::DigestMismatch { .. }))
    ));
}

#[test]
fn the_check_method_follows_the_digests_and_the_content_kind() {
    let g = geometry(QuantMode::Mxfp4, 512, 1024, 1);
    let layout = g.layout().unwrap();
    let method = |kind, digests| {
        let mut w = ContainerWriter::new(Cursor::new(Vec::new()), g, kind, 3, digests).unwrap();
        let packed = vec![0; layout.packed_bytes as usize];
        w.push_tile(&packed, &vec![127; layout.scale_bytes as usize], &[])
            .unwrap();
        TileCheck::method(&w.finish().unwrap().1)
    };
    assert_eq!(
        method(ContentKind::SyntheticDeterministic, false).unwrap(),
        "regenerating the synthetic content"
    );
    assert_eq!(
        method(ContentKind::CheckpointDerived, true).unwrap(),
        "SHA-256 against the header's digests"
    );
    assert!(matches!(
        method(ContentKind::CheckpointDerived, false),
        Err(RegenerationError::CheckpointDerived)
    ));
}

#[test]
fn synthetic_tiles_regenerate_and_a_changed_byte_is_found() {
    let (out, c) =
        synthetic::write_mxfp4_container(Cursor::new(Vec::new()), 512, 1024, 3, 7, true, |_| {})
            .unwrap();
    let bytes = out.into_inner();
    assert_eq!((c.version, c.flags.0), (2, Flags::TILE_DIGESTS));
    for i in 0..3 {
        let r = c.tile_range(i).unwrap();
        let tile = &bytes[r.start as usize..r.end as usize];
        synthetic::regenerate_check(&c, i, tile).unwrap();
        c.verify_tile(i, tile).unwrap();
        let mut changed = tile.to_vec();
        changed[200_000] ^= 0x40;
        let err = synthetic::regenerate_check(&c, i, &changed).unwrap_err();
        assert!(
            matches!(
                err,
                RegenerationError::Mismatch {
                    offset: 200_000,
                    ..
                }
            ),
            "{err}"
        );
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn valid_geometry() -> impl Strategy<Value = Geometry> {
        let mxfp4 = (1u32..5, 1u32..5, 1u32..40)
            .prop_map(|(r, c, t)| geometry(QuantMode::Mxfp4, 512 * r, 1024 * c, t));
        let affine = (
            prop::sample::select(vec![4u32, 8]),
            prop::sample::select(vec![32u32, 64, 128]),
            prop::sample::select(vec![ScaleDtype::F16, ScaleDtype::Bf16, ScaleDtype::F32]),
            1u32..4,
            1u32..4,
            1u32..40,
        )
            .prop_map(|(bits, group, dtype, r, c, t)| Geometry {
                mode: QuantMode::Affine,
                rows: 512 * r,
                cols: group * 32 * c,
                group_size: group,
                bits,
                scale_dtype: dtype,
                scale_block_rows: 1,
                tile_count: t,
            });
        let fp8 = (
            prop::sample::select(vec![32u32, 64, 128]),
            1u32..8,
            1u32..5,
            1u32..9,
            1u32..40,
        )
            .prop_map(|(group, block_log, r, c, t)| Geometry {
                mode: QuantMode::Fp8E4m3Block,
                rows: (1 << block_log) * r,
                cols: group * c,
                group_size: group,
                bits: 8,
                scale_dtype: ScaleDtype::E8m0,
                scale_block_rows: 1 << block_log,
                tile_count: t,
            });
        prop_oneof![mxfp4, affine, fp8]
    }

    proptest! {
        #[test]
        fn writer_and_reader_round_trip_every_mode(g in valid_geometry(), digests: bool, checkpoint: bool) {
            let kind = if checkpoint { ContentKind::CheckpointDerived } else { ContentKind::SyntheticDeterministic };
            let (header, written) = spec(g, kind, digests).encode_header().unwrap();
            prop_assert_eq!(TileContainer::parse(&header, written.layout.total_bytes).unwrap(), written.clone());
            prop_assert_eq!(written.version, g.lowest_version(kind, digests));
            let l = written.layout;
            prop_assert_eq!(l.packed_region % 16384, 0);
            prop_assert_eq!(l.scale_offset % 16384, 0);
            prop_assert_eq!(l.bias_offset % 16384, 0);
            prop_assert_eq!(l.tile_stride % 16384, 0);
        }

        #[test]
        fn mutated_headers_never_panic(
            which in 0usize..3,
            edits in proptest::collection::vec((0usize..400, any::<u8>()), 1..10),
            len in prop::sample::select(vec![16384u64, 1 << 20, u64::MAX]),
        ) {
            let (v1, v2, v3) = headers();
            let mut bytes = [v1, v2, v3][which].clone();
            for (at, value) in edits {
                bytes[at] = value;
            }
            if let Ok(c) = TileContainer::parse(&bytes, len) {
                for i in 0..c.geometry.tile_count.min(4) {
                    let _ = c.tile_range(u64::from(i));
                    let _ = c.bias_range(u64::from(i));
                    let _ = c.verify_tile(u64::from(i), &[]);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..20000), len: u64) {
            let _ = TileContainer::parse(&bytes, len);
        }
    }
}
