//! Every broken promise gets its own typed error, and no input panics the decoder.

mod common;

use common::golden_fixture;
use dmexp::{Dtype, Error, FileKind, Prefix};
use proptest::prelude::*;

fn valid() -> Vec<u8> {
    let fixture = golden_fixture();
    dmexp::encode(&fixture.meta, &fixture.refs(), Dtype::Bf16)
        .unwrap()
        .to_bytes()
}

fn split(bytes: &[u8]) -> (Prefix, String, Vec<u8>) {
    let prefix = Prefix::read(bytes).unwrap();
    let header_end = 24 + prefix.header_len as usize;
    let header = String::from_utf8(bytes[24..header_end].to_vec()).unwrap();
    (prefix, header, bytes[header_end..].to_vec())
}

/// A file with the given header bytes and payload and a correct prefix and CRC, so that
/// only the header's content is wrong.
fn assemble(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let prefix = Prefix {
        version: 1,
        header_len: header.len() as u32,
        payload_len: payload.len() as u64,
        payload_crc32: crc32fast::hash(payload),
    };
    [&prefix.to_bytes()[..], header, payload].concat()
}

/// The valid file with one edit applied to its header text.
fn with_header_edit(from: &str, to: &str) -> Vec<u8> {
    let (_, header, payload) = split(&valid());
    assert!(header.contains(from), "fixture header lacks {from:?}");
    assemble(header.replacen(from, to, 1).as_bytes(), &payload)
}

fn with_prefix(edit: impl FnOnce(&mut Prefix)) -> Vec<u8> {
    let mut bytes = valid();
    let mut prefix = Prefix::read(&bytes).unwrap();
    edit(&mut prefix);
    bytes[..24].copy_from_slice(&prefix.to_bytes());
    bytes
}

fn decode_err(bytes: &[u8]) -> Error {
    dmexp::decode(bytes).expect_err("decode must refuse")
}

#[test]
fn the_valid_fixture_decodes() {
    dmexp::decode(&valid()).unwrap();
}

#[test]
fn layout_failures_each_have_their_own_error() {
    let bytes = valid();
    assert!(matches!(
        decode_err(&bytes[..23]),
        Error::TooShort { len: 23 }
    ));
    assert!(matches!(decode_err(b""), Error::TooShort { len: 0 }));

    let mut future = bytes.clone();
    future[7] = 2;
    let err = decode_err(&future);
    assert!(
        matches!(err, Error::UnknownVersion { found: 2, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("[1]"),
        "names the known versions: {err}"
    );

    let huge = with_prefix(|p| p.header_len = 4 * 1024 * 1024 + 1);
    assert!(matches!(decode_err(&huge), Error::HeaderTooLarge { .. }));

    let overflow = with_prefix(|p| p.payload_len = u64::MAX - 10);
    assert!(matches!(
        decode_err(&overflow),
        Error::LengthOverflow { .. }
    ));

    let past_end = with_prefix(|p| p.header_len = bytes.len() as u32);
    assert!(matches!(decode_err(&past_end), Error::HeaderPastEnd { .. }));

    let err = decode_err(&bytes[..bytes.len() - 1]);
    assert!(
        matches!(err, Error::Truncated { expected, actual } if expected == actual + 1),
        "{err:?}"
    );

    let mut padded = bytes.clone();
    padded.extend_from_slice(&[0, 0, 0]);
    assert!(matches!(
        decode_err(&padded),
        Error::TrailingBytes { extra: 3, .. }
    ));
}

#[test]
fn any_flipped_payload_bit_is_a_checksum_error() {
    let bytes = valid();
    let (prefix, _, _) = split(&bytes);
    let payload_start = 24 + prefix.header_len as usize;
    for byte in payload_start..bytes.len() {
        for bit in 0..8 {
            let mut corrupt = bytes.clone();
            corrupt[byte] ^= 1 << bit;
            let err = decode_err(&corrupt);
            assert!(
                matches!(err, Error::ChecksumMismatch { .. }),
                "{byte}/{bit}: {err:?}"
            );
        }
    }
    let mut corrupt = bytes;
    corrupt[20] ^= 0x80;
    assert!(decode_err(&corrupt).to_string().contains("checksum"));
}

/// The limits are exact: a file of exactly the prefix's 24 bytes is long enough to read its
/// prefix (what is wrong with it comes after), and a header of exactly the largest length
/// allowed is not too large.
#[test]
fn the_layout_limits_are_exact_at_their_boundaries() {
    let bytes = valid();
    let prefix_only = &bytes[..24];
    let err = decode_err(prefix_only);
    assert!(
        matches!(err, Error::HeaderPastEnd { file_len: 24, .. }),
        "{err:?}"
    );
    let at_limit = with_prefix(|p| p.header_len = dmexp::layout::MAX_HEADER_LEN);
    let err = decode_err(&at_limit);
    assert!(matches!(err, Error::HeaderPastEnd { .. }), "{err:?}");
}

#[test]
fn wrong_magic_names_the_file_kind_and_what_to_run() {
    let mut checkpoint = b"DMTRAIN\0".to_vec();
    checkpoint.resize(64, 0);
    let err = decode_err(&checkpoint);
    assert!(
        matches!(
            &err,
            Error::NotAnExport {
                kind: FileKind::TrainingCheckpoint,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("TRAINING CHECKPOINT"), "{err}");
    assert!(
        err.to_string().contains("dormouse export run --ckpt-dir"),
        "{err}"
    );

    let mut tile = b"MNRNTIL1".to_vec();
    tile.resize(16384, 0);
    let err = decode_err(&tile);
    assert!(matches!(
        &err,
        Error::NotAnExport {
            kind: FileKind::TileContainer,
            ..
        }
    ));
    assert!(err.to_string().contains("minirun info"), "{err}");

    let mut safetensors = 40u64.to_le_bytes().to_vec();
    safetensors.extend_from_slice(br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
    let err = decode_err(&safetensors);
    assert!(matches!(
        &err,
        Error::NotAnExport {
            kind: FileKind::Safetensors,
            ..
        }
    ));
    assert!(err.to_string().contains("minirun pack"), "{err}");

    let mut gguf = b"GGUF\x03\0\0\0".to_vec();
    gguf.resize(32, 0);
    assert!(matches!(
        decode_err(&gguf),
        Error::NotAnExport {
            kind: FileKind::Gguf,
            ..
        }
    ));

    let random = [0x5Au8; 40];
    let err = decode_err(&random);
    assert!(matches!(
        &err,
        Error::NotAnExport {
            kind: FileKind::Unknown { .. },
            ..
        }
    ));
    assert!(
        err.to_string().contains("ZZZZZZZZ"),
        "shows the bytes found: {err}"
    );
}

#[test]
fn header_failures_each_have_their_own_error() {
    let (_, header, payload) = split(&valid());
    let not_utf8 = [header.as_bytes(), b"\xFF\xFE"].concat();
    assert!(matches!(
        decode_err(&assemble(&not_utf8, &payload)),
        Error::HeaderNotUtf8 { .. }
    ));
    assert!(matches!(
        decode_err(&assemble(b"format = [", &payload)),
        Error::HeaderToml { .. }
    ));
    let unknown_key = with_header_edit("step = 7\n", "step = 7\nquantized = true\n");
    assert!(matches!(decode_err(&unknown_key), Error::HeaderToml { .. }));
    let missing_key = with_header_edit("step = 7\n", "");
    assert!(matches!(decode_err(&missing_key), Error::HeaderToml { .. }));
    let negative = with_header_edit("step = 7\n", "step = -7\n");
    assert!(matches!(decode_err(&negative), Error::HeaderToml { .. }));

    let cases: Vec<(Vec<u8>, IsExpected)> = vec![
        (with_header_edit("format = 1", "format = 2"), |e| {
            matches!(
                e,
                Error::FormatMismatch {
                    header: 2,
                    version_byte: 1
                }
            )
        }),
        (
            with_header_edit("dtype = \"bf16\"", "dtype = \"bfloat16\""),
            |e| matches!(e, Error::UnknownDtype { .. }),
        ),
        (
            with_header_edit("num_tensors = 3", "num_tensors = 4"),
            |e| {
                matches!(
                    e,
                    Error::TensorCountMismatch {
                        declared: 4,
                        listed: 3
                    }
                )
            },
        ),
        (
            with_header_edit("name = \"norm.weight\"", "name = \"\""),
            |e| matches!(e, Error::EmptyTensorName { index: 2 }),
        ),
        (
            with_header_edit("name = \"norm.weight\"", "name = \"embed.weight\""),
            |e| matches!(e, Error::DuplicateTensor { .. }),
        ),
        (with_header_edit("dims = [8]", "dims = []"), |e| {
            matches!(e, Error::InvalidDims { .. })
        }),
        (with_header_edit("dims = [8]", "dims = [8, 0]"), |e| {
            matches!(e, Error::InvalidDims { .. })
        }),
        (
            with_header_edit("dims = [8]", "dims = [4294967296, 4294967296]"),
            |e| matches!(e, Error::DimsOverflow { .. }),
        ),
        // 2^63 - 1 values fit a u64; their bytes (x 2) do not.
        (
            with_header_edit("dims = [8]", "dims = [9223372036854775807]"),
            |e| matches!(e, Error::DimsOverflow { .. }),
        ),
        (with_header_edit("overflowed = 0", "overflowed = 3"), |e| {
            matches!(e, Error::OverflowedTensor { count: 3, .. })
        }),
        (
            with_header_edit("num_params = 48", "num_params = 47"),
            |e| {
                matches!(
                    e,
                    Error::ParamCountMismatch {
                        declared: 47,
                        counted: 48
                    }
                )
            },
        ),
        (
            with_header_edit("num_params = 48\n", "num_params = 56\n")
                .replace_dims("dims = [8]", "dims = [16]"),
            |e| {
                matches!(
                    e,
                    Error::PayloadSizeMismatch {
                        needed: 112,
                        payload_len: 96
                    }
                )
            },
        ),
        (with_header_edit("flushed = 1", "flushed = 49"), |e| {
            matches!(e, Error::ImpossibleStatistics { .. })
        }),
        (
            with_header_edit("max_abs = 16777216.0", "max_abs = -1.0"),
            |e| matches!(e, Error::ImpossibleStatistics { .. }),
        ),
        (
            with_header_edit("max_abs = 16777216.0", "max_abs = 0.1"),
            |e| matches!(e, Error::ImpossibleStatistics { .. }),
        ),
        (
            with_header_edit("max_abs = 16777216.0", "max_abs = 1e-12"),
            |e| matches!(e, Error::ImpossibleStatistics { .. }),
        ),
        (
            with_header_edit("max_abs = 16777216.0", "max_abs = -0.0"),
            |e| matches!(e, Error::ImpossibleStatistics { .. }),
        ),
        (
            with_header_edit("max_abs = 16777216.0", "max_abs = 8.0"),
            |e| {
                matches!(
                    e,
                    Error::StatisticMismatch {
                        field: "max_abs",
                        ..
                    }
                )
            },
        ),
        (
            with_header_edit(
                "min_nonzero_abs = 0.0000000009968061931431293",
                "min_nonzero_abs = 0.0000152587890625",
            ),
            |e| {
                matches!(
                    e,
                    Error::StatisticMismatch {
                        field: "min_nonzero_abs",
                        ..
                    }
                )
            },
        ),
    ];
    for (bytes, expected) in cases {
        let err = decode_err(&bytes);
        assert!(expected(&err), "unexpected error: {err:?}");
    }
}

/// Whether an error is the one a case expects.
type IsExpected = fn(&Error) -> bool;

trait ReplaceDims {
    fn replace_dims(self, from: &str, to: &str) -> Vec<u8>;
}

impl ReplaceDims for Vec<u8> {
    /// A second header edit on an already edited file.
    fn replace_dims(self, from: &str, to: &str) -> Vec<u8> {
        let (_, header, payload) = split(&self);
        assemble(header.replacen(from, to, 1).as_bytes(), &payload)
    }
}

#[test]
fn an_f32_export_cannot_claim_flushed_values() {
    let fixture = golden_fixture();
    let bytes = dmexp::encode(&fixture.meta, &fixture.refs(), Dtype::F32)
        .unwrap()
        .to_bytes();
    let (_, header, payload) = split(&bytes);
    let edited = header.replacen("flushed = 0", "flushed = 1", 1);
    let err = decode_err(&assemble(edited.as_bytes(), &payload));
    assert!(matches!(err, Error::ImpossibleStatistics { .. }), "{err:?}");
}

#[test]
fn a_non_finite_value_smuggled_into_the_payload_is_refused_even_with_the_crc_fixed() {
    let (_, header, mut payload) = split(&valid());
    payload[0..2].copy_from_slice(&0x7FC0u16.to_le_bytes()); // a bf16 NaN
    let err = decode_err(&assemble(header.as_bytes(), &payload));
    assert!(
        matches!(
            err,
            Error::StatisticMismatch {
                field: "max_abs",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn an_export_with_no_tensors_is_refused() {
    let header = "format = 1\ndtype = \"f32\"\nsource = \"x\"\nstep = 0\nnum_params = 0\nnum_tensors = 0\n\
                  flushed = 0\nmax_abs = 0.0\nmin_nonzero_abs = 0.0\ntensors = []\n\n[config]\n";
    assert!(matches!(
        decode_err(&assemble(header.as_bytes(), &[])),
        Error::NoTensors
    ));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = dmexp::decode(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_magic_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        header_len in 0u32..600,
        payload_len in any::<u64>(),
    ) {
        let prefix = Prefix { version: 1, header_len, payload_len, payload_crc32: 0 };
        let bytes = [&prefix.to_bytes()[..], &tail].concat();
        let _ = dmexp::decode(&bytes);
    }

    #[test]
    fn mutated_valid_files_never_panic_and_are_refused_or_decoded(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        fix_crc in any::<bool>(),
    ) {
        let mut bytes = valid();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if fix_crc && let Some(prefix) = Prefix::read(&bytes) {
            let start = (24 + prefix.header_len as usize).min(bytes.len());
            let fixed = Prefix { payload_crc32: crc32fast::hash(&bytes[start..]), ..prefix };
            bytes[..24].copy_from_slice(&fixed.to_bytes());
        }
        let _ = dmexp::decode(&bytes);
    }
}
