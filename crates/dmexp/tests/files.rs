//! Exports on disk: atomic writes, lazy reads of one tensor, `info`, and refusals that
//! read no more of a wrong file than its first bytes.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::golden_fixture;
use dmexp::{DmexpFile, Dtype, Error, ExportMeta, FileKind, TensorRef};

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn write_fixture(path: &Path) -> dmexp::Written {
    let fixture = golden_fixture();
    dmexp::encode_to_path(path, &fixture.meta, &fixture.refs(), Dtype::Bf16).unwrap()
}

/// An export built in memory and written with `write_atomic` is the same file byte for byte.
#[test]
fn an_encoded_export_is_written_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latest.f32.dmexp");
    let fixture = golden_fixture();
    let encoded = dmexp::encode(&fixture.meta, &fixture.refs(), Dtype::F32).unwrap();
    dmexp::write_atomic(&path, &encoded).unwrap();
    assert_eq!(fs::read(&path).unwrap(), encoded.to_bytes());
    assert_eq!(names_in(dir.path()), ["latest.f32.dmexp"]);
}

/// A payload of several 1 MiB reads, the last one short, is checked and read lazily whole.
#[test]
fn a_payload_larger_than_one_read_opens_lazily() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.f32.dmexp");
    let values: Vec<f32> = (0..700_001).map(|i| (i % 977) as f32 * 0.25).collect();
    let dims = [values.len() as u64];
    let meta = ExportMeta {
        source: "large.bin@step1".into(),
        step: 1,
        config: toml::Table::new(),
    };
    let tensors = [TensorRef {
        name: "w",
        dims: &dims,
        values: &values,
    }];
    dmexp::encode_to_path(&path, &meta, &tensors, Dtype::F32).unwrap();
    let lazy = DmexpFile::open(&path).unwrap();
    let (_, read) = lazy.read_tensor("w").unwrap();
    assert!(
        read.iter()
            .zip(&values)
            .all(|(r, v)| r.to_bits() == v.to_bits())
    );
}

#[test]
fn written_file_reads_back_whole_and_lazily() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latest.bf16.dmexp");
    let encoded = write_fixture(&path);
    assert_eq!(
        names_in(dir.path()),
        ["latest.bf16.dmexp"],
        "no temporary file is left"
    );
    let fixture = golden_fixture();
    let in_memory = dmexp::encode(&fixture.meta, &fixture.refs(), Dtype::Bf16).unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        in_memory.to_bytes(),
        "streamed and in-memory encodes agree"
    );
    assert_eq!(encoded.header, *in_memory.header());
    assert_eq!(encoded.prefix, in_memory.prefix());

    let whole = dmexp::read(&path).unwrap();
    let lazy = DmexpFile::open(&path).unwrap();
    assert_eq!(lazy.header(), &whole.header);
    for (entry, values) in whole.tensors() {
        let (lazy_entry, lazy_values) = lazy.read_tensor(&entry.name).unwrap();
        assert_eq!(lazy_entry, entry);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&lazy_values), bits(values));
    }
    assert!(matches!(
        lazy.read_tensor("nope"),
        Err(Error::NoSuchTensor { .. })
    ));
}

#[test]
fn a_lazy_read_touches_only_the_requested_tensors_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.dmexp");
    write_fixture(&path);
    let lazy = DmexpFile::open(&path).unwrap();
    let (_, before) = lazy.read_tensor("norm.weight").unwrap();
    // Overwrite every other tensor's bytes after the checksum was verified: a reader
    // that touched them would now see garbage or fail; one that did not is unaffected.
    let payload_start = 24 + u64::from(lazy.prefix().header_len);
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    for entry in lazy
        .header()
        .tensors
        .iter()
        .filter(|t| t.name != "norm.weight")
    {
        let junk = vec![0xFFu8; entry.byte_len as usize];
        file.write_all_at(&junk, payload_start + entry.offset)
            .unwrap();
    }
    let (_, after) = lazy.read_tensor("norm.weight").unwrap();
    assert_eq!(before, after);
    assert_eq!(after, vec![1.0; 8]);
    assert!(matches!(
        DmexpFile::open(&path),
        Err(Error::ChecksumMismatch { .. })
    ));
}

#[test]
fn lazy_open_holds_the_file_to_the_statistics_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.dmexp");
    write_fixture(&path);
    let mut bytes = fs::read(&path).unwrap();
    let prefix = dmexp::Prefix::read(&bytes).unwrap();
    let payload_start = 24 + prefix.header_len as usize;
    // A bf16 infinity in the first value, with the CRC recomputed to match.
    bytes[payload_start..payload_start + 2].copy_from_slice(&0x7F80u16.to_le_bytes());
    let fixed = dmexp::Prefix {
        payload_crc32: crc32fast::hash(&bytes[payload_start..]),
        ..prefix
    };
    bytes[..24].copy_from_slice(&fixed.to_bytes());
    fs::write(&path, &bytes).unwrap();
    for err in [
        DmexpFile::open(&path).unwrap_err(),
        dmexp::info(&path).unwrap_err(),
    ] {
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
}

#[test]
fn an_export_is_readable_by_others_like_a_copied_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.dmexp");
    write_fixture(&path);
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode & 0o044,
        0o044,
        "group and others can read it: {mode:o}"
    );
}

#[test]
fn a_failed_encode_creates_nothing_and_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latest.f16.dmexp");
    let meta = ExportMeta {
        source: "s".into(),
        step: 1,
        config: toml::Table::new(),
    };
    let too_big = [1.0f32, 70000.0];
    let tensors = [TensorRef {
        name: "w",
        dims: &[2],
        values: &too_big,
    }];
    let err = dmexp::encode_to_path(&path, &meta, &tensors, Dtype::F16).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }));
    assert!(
        names_in(dir.path()).is_empty(),
        "{:?}",
        names_in(dir.path())
    );

    fs::write(&path, b"the previous export").unwrap();
    dmexp::encode_to_path(&path, &meta, &tensors, Dtype::F16).unwrap_err();
    assert_eq!(fs::read(&path).unwrap(), b"the previous export");
    assert_eq!(names_in(dir.path()), ["latest.f16.dmexp"]);

    // A successful write replaces it whole.
    dmexp::encode_to_path(&path, &meta, &tensors, Dtype::Bf16).unwrap();
    assert_eq!(dmexp::read(&path).unwrap().header.dtype, Dtype::Bf16);
}

#[test]
fn writing_into_a_missing_directory_fails_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/x.dmexp");
    let fixture = golden_fixture();
    let err =
        dmexp::encode_to_path(&path, &fixture.meta, &fixture.refs(), Dtype::Bf16).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    assert!(names_in(dir.path()).is_empty());
}

/// A sparse file of `len` bytes starting with `magic`; reading it whole would take
/// minutes and gigabytes, so a test that finishes proves it was not read.
fn sparse_file(path: &Path, magic: &[u8], len: u64) {
    let file = File::create(path).unwrap();
    file.write_all_at(magic, 0).unwrap();
    file.set_len(len).unwrap();
}

#[test]
fn a_training_checkpoint_is_refused_with_the_command_that_converts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latest.bin");
    sparse_file(&path, b"DMTRAIN\0\x01", 64 << 30);
    for err in [
        dmexp::read(&path).unwrap_err(),
        DmexpFile::open(&path).unwrap_err(),
        dmexp::info(&path).unwrap_err(),
    ] {
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
        let expected = format!(
            "dormouse export run --ckpt-dir {} --ckpt-name latest --dtype bf16",
            dir.path().display()
        );
        assert!(err.to_string().contains(&expected), "{err}");
    }
}

#[test]
fn a_huge_file_with_a_wrong_length_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.dmexp");
    let prefix = dmexp::Prefix {
        version: 1,
        header_len: 100,
        payload_len: 1 << 20,
        payload_crc32: 0,
    };
    sparse_file(&path, &prefix.to_bytes(), 64 << 30);
    let err = dmexp::read(&path).unwrap_err();
    assert!(matches!(err, Error::TrailingBytes { .. }), "{err:?}");
    assert!(matches!(
        DmexpFile::open(&path).unwrap_err(),
        Error::TrailingBytes { .. }
    ));
}

#[test]
fn info_describes_everything_in_the_header_as_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("golden.bf16.dmexp");
    let encoded = write_fixture(&path);
    let info = dmexp::info(&path).unwrap();
    let text = info.render_text();
    for needle in [
        "format      DMEXPRT v1",
        "dtype       bf16 (2 bytes per value; loads as f32)",
        "source      checkpoints/golden.bin@step7",
        "step        7",
        "params      48 in 3 tensors",
        "checksum    ok (CRC-32 0x",
        "max |w|     1.677722e7",
        "min |w|>0   9.968062e-10",
        "flushed     1 non-zero weights",
        "would overflow f16",
        "engram_hash = \"mulxor-v1\"",
        "blocks.0.edges",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(
        text.contains(&format!("({} bytes)", encoded.file_len())),
        "{text}"
    );

    let json: serde_json::Value = serde_json::from_str(&info.to_json()).unwrap();
    assert_eq!(json["dtype"], "bf16");
    assert_eq!(json["num_params"], 48);
    assert_eq!(json["checksum_verified"], true);
    assert_eq!(json["file_bytes"], encoded.file_len());
    assert_eq!(json["config"]["engram_orders"], serde_json::json!([2, 3]));
    assert_eq!(json["tensors"][1]["name"], "blocks.0.edges");
    assert_eq!(json["tensors"][1]["dims"], serde_json::json!([2, 4]));
    assert_eq!(json["tensors"][1]["payload_offset"], 64);

    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        dmexp::info(&path),
        Err(Error::ChecksumMismatch { .. })
    ));
}
