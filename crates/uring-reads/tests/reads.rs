//! Reads through the ring land in the slot they were queued for with the file's bytes, a read
//! at the end of a file is short, a failed read names its slot, and misuse is refused before
//! the kernel sees it.

use std::fs::File;
use std::io::Write;

use uring_reads::{Completed, FixedReads, RingError};

const LEN: usize = 16384;

/// A file of `blocks` 16 KiB blocks, byte `i` being `i % 251`.
fn patterned(dir: &tempfile::TempDir, blocks: usize) -> (File, Vec<u8>) {
    let bytes: Vec<u8> = (0..blocks * LEN).map(|i| (i % 251) as u8).collect();
    let path = dir.path().join("w.tile");
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    (File::open(&path).unwrap(), bytes)
}

/// The ring, or `None` (said on stderr) where this kernel or its seccomp policy refuses
/// io_uring: the engine is then unavailable, which `minirun bench storage` reports the same way.
fn ring<'f>(depth: usize, len: usize) -> Option<FixedReads<'f>> {
    match FixedReads::new(depth, len) {
        Ok(reads) => Some(reads),
        Err(RingError::Unavailable(e)) => {
            eprintln!("io_uring unavailable here ({e}): nothing to test");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn reads_land_in_their_slots_with_the_files_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (file, bytes) = patterned(&dir, 16);
    let Some(mut reads) = ring(3, LEN) else {
        return;
    };
    assert_eq!(
        (reads.depth(), reads.len(), reads.is_empty()),
        (3, LEN, false)
    );
    let offsets = [5 * LEN, 0, 11 * LEN];
    for (slot, &offset) in offsets.iter().enumerate() {
        reads.submit(slot, &file, offset as u64).unwrap();
        assert_eq!(reads.buffer(slot), None, "a buffer in flight is not lent");
    }
    assert_eq!(reads.in_flight(), 3);
    let mut done: Vec<Completed> = (0..3).map(|_| reads.complete().unwrap()).collect();
    done.sort_by_key(|c| c.slot);
    assert_eq!(
        done,
        (0..3)
            .map(|slot| Completed { slot, bytes: LEN })
            .collect::<Vec<_>>()
    );
    for (slot, &offset) in offsets.iter().enumerate() {
        let buffer = reads.buffer(slot).unwrap();
        assert_eq!(buffer, &bytes[offset..offset + LEN], "slot {slot}");
        assert_eq!(buffer.as_ptr() as usize % uring_reads::ALIGN, 0);
    }

    // A slot is reused once its read is done; the others keep their bytes.
    reads.submit(1, &file, 7 * LEN as u64).unwrap();
    assert_eq!(
        reads.complete().unwrap(),
        Completed {
            slot: 1,
            bytes: LEN
        }
    );
    assert_eq!(reads.buffer(1).unwrap(), &bytes[7 * LEN..8 * LEN]);
    assert_eq!(reads.buffer(2).unwrap(), &bytes[11 * LEN..12 * LEN]);

    // Dropped with reads in flight: the drop waits for them.
    reads.submit(0, &file, 0).unwrap();
    reads.submit(2, &file, LEN as u64).unwrap();
    drop(reads);
}

#[test]
fn a_read_at_the_end_of_a_file_is_short() {
    let dir = tempfile::tempdir().unwrap();
    let (file, bytes) = patterned(&dir, 2);
    let Some(mut reads) = ring(1, LEN) else {
        return;
    };
    reads.submit(0, &file, (2 * LEN - 100) as u64).unwrap();
    assert_eq!(
        reads.complete().unwrap(),
        Completed {
            slot: 0,
            bytes: 100
        }
    );
    assert_eq!(&reads.buffer(0).unwrap()[..100], &bytes[2 * LEN - 100..]);
    reads.submit(0, &file, (4 * LEN) as u64).unwrap();
    assert_eq!(reads.complete().unwrap(), Completed { slot: 0, bytes: 0 });
}

#[test]
fn a_failed_read_names_its_slot_and_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out");
    let write_only = File::create(&path).unwrap();
    let Some(mut reads) = ring(2, LEN) else {
        return;
    };
    reads.submit(1, &write_only, 0).unwrap();
    match reads.complete() {
        Err(RingError::Read { slot: 1, source }) => {
            assert_eq!(source.raw_os_error(), Some(EBADF), "{source}");
        }
        other => panic!("a read of a write-only file gave {other:?}"),
    }
    assert_eq!(reads.in_flight(), 0);
    assert!(
        reads.buffer(1).is_some(),
        "the failed read's slot is free again"
    );
}

/// Reading a descriptor opened for writing only.
const EBADF: i32 = 9;

#[test]
fn misuse_is_refused_before_the_kernel_sees_it() {
    assert!(matches!(
        FixedReads::new(0, LEN),
        Err(RingError::Shape { depth: 0, .. })
    ));
    assert!(matches!(
        FixedReads::new(2, 0),
        Err(RingError::Shape { len: 0, .. })
    ));
    assert!(matches!(
        FixedReads::new(1025, LEN),
        Err(RingError::Shape { depth: 1025, .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = patterned(&dir, 2);
    let Some(mut reads) = ring(2, LEN) else {
        return;
    };
    assert!(matches!(reads.complete(), Err(RingError::Idle)));
    assert!(matches!(
        reads.submit(2, &file, 0),
        Err(RingError::NoSlot { slot: 2, depth: 2 })
    ));
    assert_eq!(reads.buffer(2), None);
    reads.submit(0, &file, 0).unwrap();
    assert!(matches!(
        reads.submit(0, &file, 0),
        Err(RingError::Busy { slot: 0 })
    ));
    assert_eq!(reads.in_flight(), 1, "the refused read was not queued");
    assert_eq!(
        reads.complete().unwrap(),
        Completed {
            slot: 0,
            bytes: LEN
        }
    );
}
