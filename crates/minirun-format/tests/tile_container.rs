//! The tile container against the reference: golden synthetic vectors, every published
//! geometry, the writer's version choice, and one typed refusal per geometry rule. The reader's
//! byte-level refusals, tile payloads and checks: `tests/tile_reader.rs`.

mod common;

use common::{geometry, spec};
use std::io::Cursor;

use minirun_format::synthetic;
use minirun_format::tile::{
    ContainerSpec, ContainerWriter, ContentKind, Geometry, GeometryError, QuantMode, ScaleDtype,
    TileContainer, TileError, WriteError, hex,
};
use sha2::{Digest, Sha256};

#[test]
fn splitmix_golden_vectors_match_the_reference() {
    assert_eq!(synthetic::value(0, 0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(synthetic::value(0, 1), 0x6e78_9e6a_a1b9_65f4);
    assert_eq!(synthetic::value(42, 0), 0xbdd7_3226_2feb_6e95);
    assert_eq!(synthetic::derive(42, 0), 0xda95_f8cd_c55f_04e5);
    let stream: Vec<u64> = synthetic::SplitMix64::new(0).take(2).collect();
    assert_eq!(stream, [synthetic::value(0, 0), synthetic::value(0, 1)]);

    let mut content = [0u8; 16];
    synthetic::fill_content(42, 0, &mut content);
    assert_eq!(hex(&content), "956eeb2f2632d7bd03f166b233e3ef28");
    let mut content = [0u8; 19];
    synthetic::fill_content(5, 3, &mut content);
    assert_eq!(hex(&content), "a30c3b0363f83697934d3197c047c16b10f0d3");
}

#[test]
fn synthetic_v1_container_matches_the_reference_byte_for_byte() {
    let (out, container) =
        synthetic::write_mxfp4_container(Cursor::new(Vec::new()), 512, 1024, 2, 99, false, |_| {})
            .unwrap();
    let bytes = out.into_inner();
    assert_eq!(bytes.len(), 573_440);
    assert_eq!(
        hex(&Sha256::digest(&bytes)),
        "fd93682afd3c0521311ab2830d6eda86da9201297e25d390122bfa51afe0eb06"
    );
    assert_eq!(container.version, 1);
    let tile0 = container.tile_range(0).unwrap();
    let tile0 = &bytes[tile0.start as usize..tile0.end as usize];
    assert_eq!(
        hex(&Sha256::digest(tile0)),
        "c3182f127dd8577c63812ceef9a4cebe559ffb7a1e6499c564e7cc8491f85411"
    );
    let at = |r: std::ops::Range<u64>| hex(&bytes[r.start as usize..r.start as usize + 8]);
    assert_eq!(at(container.packed_range(0).unwrap()), "fc90b4ee875ee3fb");
    assert_eq!(at(container.scale_range(0).unwrap()), "6a797f8a887d6b6e");
    assert_eq!(at(container.packed_range(1).unwrap()), "9682be411cab2a1f");
    assert_eq!(
        TileContainer::parse(&bytes, bytes.len() as u64).unwrap(),
        container
    );
}

/// Every published geometry of the reference's section 1.7: our writer chooses the same
/// version and flags, derives the same stride and size, and our reader accepts it.
#[test]
fn every_published_geometry_is_written_and_read_as_published() {
    let fp8 = Geometry {
        mode: QuantMode::Fp8E4m3Block,
        ..geometry(QuantMode::Fp8E4m3Block, 512, 4096, 1)
    };
    let cases: Vec<(&str, ContainerSpec, u32, u32, u64, u64)> = vec![
        (
            "K3 w1/w3",
            spec(
                geometry(QuantMode::Mxfp4, 1024, 3584, 2688),
                ContentKind::SyntheticDeterministic,
                false,
            ),
            1,
            0,
            1_949_696,
            5_240_799_232,
        ),
        (
            "K3 w2",
            spec(
                geometry(QuantMode::Mxfp4, 512, 3072, 6272),
                ContentKind::SyntheticDeterministic,
                false,
            ),
            1,
            0,
            835_584,
            5_240_799_232,
        ),
        (
            "V4 w1/w3",
            spec(
                geometry(QuantMode::Mxfp4, 2048, 4096, 256),
                ContentKind::CheckpointDerived,
                true,
            ),
            2,
            0x2,
            4_456_448,
            1_140_867_072,
        ),
        (
            "V4 w2",
            spec(
                geometry(QuantMode::Mxfp4, 4096, 2048, 256),
                ContentKind::CheckpointDerived,
                true,
            ),
            2,
            0x2,
            4_456_448,
            1_140_867_072,
        ),
        (
            "V4 wkv fp8",
            spec(fp8, ContentKind::CheckpointDerived, true),
            3,
            0xE,
            2_113_536,
            2_129_920,
        ),
        (
            "Qwen3 affine",
            spec(
                geometry(QuantMode::Affine, 768, 2048, 128),
                ContentKind::CheckpointDerived,
                false,
            ),
            2,
            0x1,
            884_736,
            16_384 + 128 * 884_736,
        ),
        (
            "Qwen3 affine + digests",
            spec(
                geometry(QuantMode::Affine, 768, 2048, 128),
                ContentKind::CheckpointDerived,
                true,
            ),
            2,
            0x3,
            884_736,
            16_384 + 128 * 884_736,
        ),
    ];
    for (name, spec, version, flags, stride, total) in cases {
        let (header, written) = spec.encode_header().unwrap();
        assert_eq!(header.len(), 16_384, "{name}");
        assert_eq!(
            (written.version, written.flags.0),
            (version, flags),
            "{name}"
        );
        assert_eq!(
            (written.layout.tile_stride, written.layout.total_bytes),
            (stride, total),
            "{name}"
        );
        let read = TileContainer::parse(&header, total).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(read, written, "{name}");
        assert!(
            matches!(
                TileContainer::parse(&header, total - 1),
                Err(TileError::FileTooShort { .. })
            ),
            "{name}"
        );
    }
}

#[test]
fn a_version_1_container_reads_as_implied_synthetic_and_says_so() {
    let (header, _) = spec(
        geometry(QuantMode::Mxfp4, 1024, 3584, 3),
        ContentKind::SyntheticDeterministic,
        false,
    )
    .encode_header()
    .unwrap();
    let c = TileContainer::parse(&header, 1 << 30).unwrap();
    assert_eq!(
        (c.version, c.content_kind, c.content_kind_declared),
        (1, ContentKind::SyntheticDeterministic, false)
    );
}

#[test]
fn the_writer_refuses_geometry_it_cannot_align_and_digest_tables_that_do_not_fit() {
    let unaligned = geometry(QuantMode::Mxfp4, 100, 1024, 1);
    let err = ContainerWriter::new(
        Cursor::new(Vec::new()),
        unaligned,
        ContentKind::CheckpointDerived,
        0,
        false,
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            WriteError::Tile(TileError::Geometry(GeometryError::Unaligned {
                region: "packed",
                ..
            }))
        ),
        "{err}"
    );

    let v2 = |tiles| {
        spec(
            geometry(QuantMode::Mxfp4, 512, 1024, tiles),
            ContentKind::CheckpointDerived,
            true,
        )
    };
    assert!(v2(508).encode_header().is_ok());
    assert!(matches!(
        v2(509).encode_header(),
        Err(TileError::DigestTableTooLarge {
            tiles: 509,
            capacity: 508
        })
    ));
    let v3 = |tiles| {
        spec(
            geometry(QuantMode::Fp8E4m3Block, 128, 128, tiles),
            ContentKind::CheckpointDerived,
            true,
        )
    };
    assert!(v3(507).encode_header().is_ok());
    assert!(matches!(
        v3(508).encode_header(),
        Err(TileError::DigestTableTooLarge {
            tiles: 508,
            capacity: 507
        })
    ));
}

#[test]
fn geometry_rules_each_have_their_own_error() {
    let base = geometry(QuantMode::Affine, 512, 2048, 1);
    let cases: Vec<(Geometry, IsGeometryError)> = vec![
        (Geometry { rows: 0, ..base }, |e| {
            matches!(e, GeometryError::Empty { .. })
        }),
        (
            Geometry {
                tile_count: 0,
                ..base
            },
            |e| matches!(e, GeometryError::NoTiles),
        ),
        (Geometry { bits: 3, ..base }, |e| {
            matches!(e, GeometryError::Bits { bits: 3 })
        }),
        (
            Geometry {
                group_size: 48,
                ..base
            },
            |e| matches!(e, GeometryError::Group { group: 48 }),
        ),
        (
            Geometry {
                scale_dtype: ScaleDtype::E8m0,
                ..base
            },
            |e| matches!(e, GeometryError::Mode { .. }),
        ),
        (
            Geometry {
                group_size: 64,
                ..geometry(QuantMode::Mxfp4, 512, 1024, 1)
            },
            |e| matches!(e, GeometryError::Mode { .. }),
        ),
        (
            Geometry {
                scale_block_rows: 1,
                ..geometry(QuantMode::Fp8E4m3Block, 512, 512, 1)
            },
            |e| matches!(e, GeometryError::Mode { .. }),
        ),
        (
            Geometry {
                scale_block_rows: 2,
                ..base
            },
            |e| matches!(e, GeometryError::Mode { .. }),
        ),
        (
            Geometry {
                rows: 200,
                ..geometry(QuantMode::Fp8E4m3Block, 512, 512, 1)
            },
            |e| matches!(e, GeometryError::BlockRows { .. }),
        ),
        (Geometry { cols: 2000, ..base }, |e| {
            matches!(e, GeometryError::ColsGroup { .. })
        }),
        (
            Geometry {
                cols: 130,
                group_size: 2,
                ..geometry(QuantMode::Fp8E4m3Block, 128, 128, 1)
            },
            |e| matches!(e, GeometryError::ColsPacking { .. }),
        ),
        (Geometry { rows: 128, ..base }, |e| {
            matches!(
                e,
                GeometryError::Unaligned {
                    region: "scale",
                    ..
                }
            )
        }),
        (
            Geometry {
                rows: 1 << 31,
                cols: 1 << 31,
                tile_count: u32::MAX,
                ..geometry(QuantMode::Fp8E4m3Block, 128, 128, 1)
            },
            |e| matches!(e, GeometryError::Overflow),
        ),
    ];
    for (g, expected) in cases {
        let err = g.layout().unwrap_err();
        assert!(expected(&err), "{g:?}: {err:?}");
    }
}

/// Each mode's requirement is named by the rule the geometry breaks, not by a later one.
#[test]
fn each_mode_requirement_is_named_when_it_alone_is_broken() {
    let mxfp4 = geometry(QuantMode::Mxfp4, 512, 1024, 1);
    let fp8 = geometry(QuantMode::Fp8E4m3Block, 512, 512, 1);
    let cases = [
        (
            Geometry {
                group_size: 64,
                ..mxfp4
            },
            "group size 32 (fixed by OCP MX)",
        ),
        (Geometry { bits: 8, ..mxfp4 }, "4-bit elements"),
        (
            Geometry {
                scale_dtype: ScaleDtype::F16,
                ..mxfp4
            },
            "uint8-e8m0 scales",
        ),
        (Geometry { bits: 4, ..fp8 }, "8-bit elements"),
        (
            Geometry {
                scale_dtype: ScaleDtype::Bf16,
                ..fp8
            },
            "uint8-e8m0 block scales",
        ),
        (
            Geometry {
                scale_block_rows: 1,
                ..fp8
            },
            "a 2-D scale grid: more than one row per scale",
        ),
    ];
    for (g, expected) in cases {
        match g.layout() {
            Err(GeometryError::Mode { mode, requirement }) => {
                assert_eq!((mode, requirement), (g.mode, expected));
            }
            other => panic!("{g:?}: {other:?}"),
        }
    }
}

/// Whether an error is the one a case expects.
type IsGeometryError = fn(&GeometryError) -> bool;
