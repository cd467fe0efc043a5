//! Streaming payload reads: one read of a tile (or a member) into one 16 KiB-aligned buffer,
//! from a file opened beneath the artifact root without following links, its identity
//! rechecked (one `fstat` of the held descriptor) before every read. Reads bypass the page
//! cache with `O_DIRECT` where the filesystem allows it and the read is block aligned (tiles
//! are: every tile and sub-region starts on a 16 KiB boundary); otherwise they go through the
//! page cache and the range is dropped from it afterwards (`posix_fadvise(DONTNEED)`), so a
//! streamed run neither pins the cache nor is flattered by it.

use std::collections::HashMap;
use std::fs::File;
use std::num::NonZeroU64;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use crate::artifact_files::{ArtifactFiles, LayoutError};
use crate::held::StoreError;
use crate::identity::FileIdentity;

/// The alignment of every streaming buffer: the tile container's own alignment.
pub const SLOT_ALIGN: usize = 16384;

/// `O_DIRECT` needs the file offset and length to be multiples of the device's logical block;
/// 4 KiB covers the devices this runs on (512-byte and 4 KiB sectors).
const DIRECT_BLOCK: u64 = 4096;

/// A direct read longer than this is split into reads of this many bytes, up to
/// [`CHUNKS_IN_FLIGHT`] of them at once: one long read keeps a device at queue depth one
/// (`minirun bench storage` with 64 MiB reads, on a 2-vCPU AMD EPYC family 25 VM otherwise idle:
/// 1.99 GB/s at depth 1, 3.34 GB/s at depth 8). A multiple of [`DIRECT_BLOCK`], so that every
/// piece of an aligned read is aligned too.
const READ_CHUNK_BYTES: usize = 16 << 20;
const CHUNKS_IN_FLIGHT: usize = 4;

/// `buf` from `file` at `offset`, in reads of at most `chunk` bytes, up to
/// [`CHUNKS_IN_FLIGHT`] at once; the number of reads.
fn read_in_chunks(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    chunk: usize,
) -> std::io::Result<usize> {
    let pieces = buf.len().div_ceil(chunk.max(1));
    if pieces <= 1 {
        file.read_exact_at(buf, offset)?;
        return Ok(1);
    }
    let next = Mutex::new(buf.chunks_mut(chunk).enumerate());
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..CHUNKS_IN_FLIGHT.min(pieces))
            .map(|_| {
                scope.spawn(|| {
                    loop {
                        let taken = next.lock().map(|mut n| n.next());
                        let Ok(Some((i, piece))) = taken else {
                            return Ok::<(), std::io::Error>(());
                        };
                        file.read_exact_at(piece, offset + (i * chunk) as u64)?;
                    }
                })
            })
            .collect();
        for reader in readers {
            reader
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a read thread panicked")))?;
        }
        Ok(pieces)
    })
}

/// What [`AlignedBuf::touched`] writes: not zero, so that no compiler can leave out the writes
/// to memory it knows is zeroed.
const TOUCHED: u8 = 0xA5;

/// A heap buffer whose bytes start on a [`SLOT_ALIGN`] boundary: zeroed when new, or handed
/// back by a [`BufferPool`] with the bytes of its last read (which the next read overwrites
/// whole). Safe code only (it over-allocates and starts at the first aligned byte).
#[derive(Debug)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
    /// Where the buffer goes back when dropped.
    pool: Option<Arc<Mutex<FreeList>>>,
}

impl AlignedBuf {
    /// A buffer of `len` usable bytes.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::within(vec![0u8; len + SLOT_ALIGN], len)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this buffer holds in memory, alignment slack included.
    pub fn allocated(&self) -> usize {
        self.raw.len()
    }

    /// A buffer of `len` usable bytes whose every page is written now: the kernel has found
    /// its memory before any read needs it (a zeroed buffer's pages are found on first write,
    /// one fault per 4 KiB, which inside a virtual machine can cost as much as the read).
    pub fn touched(len: usize) -> AlignedBuf {
        AlignedBuf::within(vec![TOUCHED; len + SLOT_ALIGN], len)
    }

    /// `len` bytes of `raw` (`len` + [`SLOT_ALIGN`] long), from its first aligned byte.
    fn within(raw: Vec<u8>, len: usize) -> AlignedBuf {
        let start = (SLOT_ALIGN - raw.as_ptr() as usize % SLOT_ALIGN) % SLOT_ALIGN;
        AlignedBuf {
            raw,
            start,
            len,
            pool: None,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take()
            && let Ok(mut free) = pool.lock()
        {
            let raw = std::mem::take(&mut self.raw);
            free.lent = free.lent.saturating_sub(raw.len() as u64);
            let _kept_or_freed = free.keep(self.len, raw, self.start);
        }
    }
}

/// Buffers kept for the next read of the same length, and the bytes of the pool's buffers in
/// use: kept and lent together stay within the limit, so that keeping buffers never adds to
/// the memory the reads in flight take.
#[derive(Debug, Default)]
struct FreeList {
    by_len: HashMap<usize, Vec<(Vec<u8>, usize)>>,
    /// Bytes kept.
    bytes: u64,
    /// Bytes of the buffers handed out and not yet dropped.
    lent: u64,
    limit: u64,
}

impl FreeList {
    /// Keeps the buffer if it fits beside what is kept and lent; whether it was kept.
    fn keep(&mut self, len: usize, raw: Vec<u8>, start: usize) -> bool {
        let size = raw.len() as u64;
        let fits = self.fits(size);
        if fits {
            self.bytes += size;
            self.by_len.entry(len).or_default().push((raw, start));
        }
        fits
    }

    fn fits(&self, size: u64) -> bool {
        self.bytes + self.lent + size <= self.limit
    }

    fn take(&mut self, len: usize) -> Option<(Vec<u8>, usize)> {
        let (raw, start) = self.by_len.get_mut(&len)?.pop()?;
        self.bytes -= raw.len() as u64;
        Some((raw, start))
    }

    /// Kept buffers (of other lengths) given up until `size` more bytes lent fit the limit
    /// beside what is kept, or nothing is kept; returned to be freed outside the lock.
    fn make_room(&mut self, size: u64) -> Vec<Vec<u8>> {
        self.keep_at_most(self.limit.saturating_sub(self.lent + size))
    }

    /// Kept buffers given up until at most `target` bytes are kept; returned to be freed.
    fn keep_at_most(&mut self, target: u64) -> Vec<Vec<u8>> {
        let mut freed = Vec::new();
        while self.bytes > target {
            let Some(&len) = self.by_len.keys().next() else {
                break;
            };
            match self.take(len) {
                Some((raw, _)) => freed.push(raw),
                None => {
                    self.by_len.remove(&len);
                }
            }
        }
        freed
    }
}

/// Aligned buffers that go back to the pool when dropped and are handed out again for a read
/// of the same length, up to `limit` bytes kept: a streamed run reads the same tile sizes over
/// and over, and a fresh buffer per read costs zeroing it and, once the allocator has returned
/// the memory to the system, a page fault per 4 KiB. The kept buffers are memory the run used
/// for reads a moment ago, so the limit is what its plan set aside for reads in flight.
#[derive(Debug, Clone, Default)]
pub struct BufferPool(Arc<Mutex<FreeList>>);

impl BufferPool {
    /// A pool that keeps nothing until [`BufferPool::set_limit`].
    pub fn new() -> BufferPool {
        BufferPool::default()
    }

    /// Keeps at most `limit` bytes of free buffers (dropping what is over it now).
    pub fn set_limit(&self, limit: u64) {
        if let Ok(mut free) = self.0.lock() {
            free.limit = limit;
            free.keep_at_most(limit);
        }
    }

    /// Keeps up to `sets` sets of [`AlignedBuf::touched`] buffers, one of each length in
    /// `lengths` a set (the buffers one loaded expert holds), each set only where all of it fits
    /// the limit beside what is kept and lent. A streamed run that will hold read experts in a
    /// cache takes its buffers from here, already in memory, instead of waiting for the kernel
    /// at every first read. Returns the bytes added.
    pub fn prefill(&self, lengths: &[usize], sets: usize) -> u64 {
        if lengths.is_empty() {
            return 0;
        }
        let set_bytes: u64 = lengths.iter().map(|&len| (len + SLOT_ALIGN) as u64).sum();
        let mut added = 0;
        for _ in 0..sets {
            if !self.0.lock().is_ok_and(|free| free.fits(set_bytes)) {
                break;
            }
            // Written outside the lock: finding the memory is the slow part.
            let set: Vec<AlignedBuf> = lengths
                .iter()
                .map(|&len| AlignedBuf::touched(len))
                .collect();
            let Ok(mut free) = self.0.lock() else {
                break;
            };
            for mut buf in set {
                let raw = std::mem::take(&mut buf.raw);
                let size = raw.len() as u64;
                if free.keep(buf.len, raw, buf.start) {
                    added += size;
                }
            }
        }
        added
    }

    /// Bytes of free buffers kept now.
    pub fn kept_bytes(&self) -> u64 {
        self.0.lock().map_or(0, |free| free.bytes)
    }

    /// A buffer of `len` usable bytes: a kept one of that length if there is one.
    pub fn buffer(&self, len: usize) -> AlignedBuf {
        let (kept, freed) = match self.0.lock() {
            Ok(mut free) => {
                let kept = free.take(len);
                let size = kept.as_ref().map_or(len + SLOT_ALIGN, |(raw, _)| raw.len());
                let freed = match kept {
                    Some(_) => Vec::new(),
                    None => free.make_room(size as u64),
                };
                free.lent += size as u64;
                (kept, freed)
            }
            Err(_) => (None, Vec::new()),
        };
        drop(freed);
        let mut buf = match kept {
            Some((raw, start)) => AlignedBuf {
                raw,
                start,
                len,
                pool: None,
            },
            None => AlignedBuf::new(len),
        };
        buf.pool = Some(Arc::clone(&self.0));
        buf
    }
}

/// How a read reached the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPath {
    /// `O_DIRECT`: the page cache was bypassed.
    Direct,
    /// Through the page cache, the range dropped from it afterwards.
    BufferedDontNeed,
}

/// A payload file held open for streaming reads.
#[derive(Debug)]
pub struct PayloadFile {
    path: String,
    buffered: File,
    direct: Option<File>,
    identity: FileIdentity,
}

impl ArtifactFiles {
    /// Opens a payload file for streaming: through the evidence when held (only an evidenced
    /// file, its identity the recorded one), else beneath the root.
    pub fn open_streamed(&self, path: &str) -> Result<PayloadFile, LayoutError> {
        let buffered = self.open_payload(path)?;
        let identity = FileIdentity::of(&buffered.metadata().map_err(|error| LayoutError::Io {
            path: path.to_string(),
            error,
        })?);
        let direct = self
            .root()
            .open_direct(path)
            .filter(|(_, direct)| *direct == identity)
            .map(|(file, _)| file);
        Ok(PayloadFile {
            path: path.to_string(),
            buffered,
            direct,
            identity,
        })
    }
}

impl PayloadFile {
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether aligned reads of this file bypass the page cache.
    pub fn supports_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The file opened with `O_DIRECT` (its identity the recorded one when opened), for a
    /// reader that issues its own reads; `None` where the filesystem does not take it.
    pub fn direct_file(&self) -> Option<&File> {
        self.direct.as_ref()
    }

    /// The file's length when it was opened (its identity's size).
    pub fn len(&self) -> u64 {
        self.identity.size
    }

    pub fn is_empty(&self) -> bool {
        self.identity.size == 0
    }

    /// Reads `buf.len()` bytes at `offset` in one positioned read (a short read is retried until
    /// the range is complete), after checking that the open file is still the one that was
    /// opened (and, when verified, evidenced): same inode, size and timestamps.
    pub fn read_into(&self, offset: u64, buf: &mut AlignedBuf) -> Result<ReadPath, LayoutError> {
        self.check_identity()?;
        let len = buf.len() as u64;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.identity.size);
        if end.is_none() {
            return Err(LayoutError::Io {
                path: self.path.clone(),
                error: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "{len} bytes at {offset} lie past the end of a {}-byte file",
                        self.identity.size
                    ),
                ),
            });
        }
        let io = |error| LayoutError::Io {
            path: self.path.clone(),
            error,
        };
        let aligned = offset.is_multiple_of(DIRECT_BLOCK) && len.is_multiple_of(DIRECT_BLOCK);
        if let (Some(direct), true) = (&self.direct, aligned) {
            read_in_chunks(direct, buf.as_mut_slice(), offset, READ_CHUNK_BYTES).map_err(io)?;
            return Ok(ReadPath::Direct);
        }
        self.buffered
            .read_exact_at(buf.as_mut_slice(), offset)
            .map_err(io)?;
        if let Some(len) = NonZeroU64::new(len) {
            // Advice only: a filesystem that ignores it costs page cache, not correctness.
            let _ = rustix::fs::fadvise(
                &self.buffered,
                offset,
                Some(len),
                rustix::fs::Advice::DontNeed,
            );
        }
        Ok(ReadPath::BufferedDontNeed)
    }

    fn check_identity(&self) -> Result<(), LayoutError> {
        let now = FileIdentity::of(&self.buffered.metadata().map_err(|error| LayoutError::Io {
            path: self.path.clone(),
            error,
        })?);
        let changed = now.changes_from(&self.identity);
        if changed.is_empty() {
            return Ok(());
        }
        Err(StoreError::Changed {
            path: self.path.clone(),
            what: changed.join(", "),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_the_slot_alignment() {
        for len in [0, 1, 16384, 100_000] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.as_slice().as_ptr() as usize % SLOT_ALIGN, 0);
            assert_eq!(b.len(), len);
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }

    #[test]
    fn a_pool_hands_back_a_dropped_buffer_of_the_same_length_within_its_limit() {
        let pool = BufferPool::new();
        drop(pool.buffer(40_000));
        assert_eq!(
            pool.kept_bytes(),
            0,
            "nothing is kept before a limit is set"
        );

        pool.set_limit(100_000);
        let buf = pool.buffer(40_000);
        let at = buf.as_slice().as_ptr();
        drop(buf);
        assert_eq!(pool.kept_bytes(), (40_000 + SLOT_ALIGN) as u64);
        let again = pool.buffer(40_000);
        assert_eq!(again.as_slice().as_ptr(), at, "the kept buffer is reused");
        assert_eq!(again.as_slice().as_ptr() as usize % SLOT_ALIGN, 0);
        assert_eq!(pool.kept_bytes(), 0);
        let other = pool.buffer(20_000);
        assert_eq!(
            other.len(),
            20_000,
            "another length gets a buffer of its own"
        );
        drop((again, other));
        assert_eq!(pool.kept_bytes(), (60_000 + 2 * SLOT_ALIGN) as u64);

        // A read of another length gets room first: kept buffers are freed until what is kept
        // and what is lent fit the limit together. Over the limit, a dropped buffer is freed.
        let big = pool.buffer(70_000);
        assert_eq!(
            pool.kept_bytes(),
            0,
            "86,384 lent leaves no room to keep 92,768"
        );
        drop(big);
        assert_eq!(pool.kept_bytes(), (70_000 + SLOT_ALIGN) as u64);
        let (a, b) = (pool.buffer(20_000), pool.buffer(20_000));
        assert_eq!(pool.kept_bytes(), 0);
        drop(a);
        assert_eq!(
            pool.kept_bytes(),
            (20_000 + SLOT_ALIGN) as u64,
            "kept beside the one still lent: 72,768 in all"
        );
        let c = pool.buffer(40_000);
        assert_eq!(
            pool.kept_bytes(),
            0,
            "the kept buffer gives way: beside 36,384 lent and 56,384 more it would pass the limit"
        );
        drop((b, c));
        assert_eq!(pool.kept_bytes(), (60_000 + 2 * SLOT_ALIGN) as u64);
        pool.set_limit(30_000);
        assert!(pool.kept_bytes() <= 30_000);
    }

    #[test]
    fn a_pool_keeps_what_fits_beside_what_it_lends_and_no_more() {
        // 4,000 and 8,000 usable bytes take 20,384 and 24,384 with the alignment slack.
        let (small, large) = ((4_000 + SLOT_ALIGN) as u64, (8_000 + SLOT_ALIGN) as u64);
        let pool = BufferPool::new();
        pool.set_limit(small + large);
        drop(pool.buffer(4_000));
        assert_eq!(pool.kept_bytes(), small);
        let exact = pool.buffer(8_000);
        assert_eq!(
            pool.kept_bytes(),
            small,
            "kept and lent fill the limit exactly: nothing is freed"
        );
        drop(exact);
        assert_eq!(pool.kept_bytes(), small + large);

        // Dropped while others are still lent: kept where kept + lent + it fit.
        let pool = BufferPool::new();
        pool.set_limit(4 * small);
        let (x, y, z) = (pool.buffer(4_000), pool.buffer(4_000), pool.buffer(4_000));
        drop(x);
        drop(y);
        assert_eq!(pool.kept_bytes(), 2 * small, "two kept beside the one lent");
        drop(z);
        assert_eq!(pool.kept_bytes(), 3 * small);
    }

    #[test]
    fn a_prefilled_pool_holds_whole_written_sets_within_its_limit() {
        // One set: 4,000 and 8,000 usable bytes, 44,768 with the alignment slack.
        let lengths = [4_000, 8_000];
        let set = (12_000 + 2 * SLOT_ALIGN) as u64;
        let pool = BufferPool::new();
        assert_eq!(pool.prefill(&lengths, 3), 0, "no limit, nothing kept");

        pool.set_limit(2 * set + set / 2);
        assert_eq!(pool.prefill(&lengths, 1), set, "one set asked, one kept");
        assert_eq!(
            pool.prefill(&lengths, 5),
            set,
            "then only one more fits whole"
        );
        assert_eq!(pool.kept_bytes(), 2 * set);

        let written = |b: &AlignedBuf| b.as_slice().iter().all(|&x| x == TOUCHED);
        let taken: Vec<AlignedBuf> = (0..2).map(|_| pool.buffer(8_000)).collect();
        assert!(
            taken.iter().all(written),
            "the prefilled buffers come back, written"
        );
        assert!(
            taken
                .iter()
                .all(|b| (b.as_slice().as_ptr() as usize).is_multiple_of(SLOT_ALIGN))
        );
        assert_eq!(pool.kept_bytes(), 2 * set - 2 * (8_000 + SLOT_ALIGN) as u64);
        let fresh = pool.buffer(8_000);
        assert!(
            fresh.as_slice().iter().all(|&x| x == 0),
            "a third is a new one"
        );

        // What is lent counts against the limit too.
        drop(fresh);
        let pool = BufferPool::new();
        pool.set_limit(2 * set);
        let lent = pool.buffer(20_000);
        assert_eq!(pool.prefill(&lengths, 2), set);
        drop(lent);
        assert_eq!(pool.prefill(&[], 4), 0, "an empty set adds nothing");
    }

    #[test]
    fn reads_are_exact_and_a_changed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("w.tile"), &content).unwrap();
        let files = ArtifactFiles::unverified(dir.path()).unwrap();
        let file = files.open_streamed("w.tile").unwrap();
        let mut buf = AlignedBuf::new(16384);
        file.read_into(16384, &mut buf).unwrap();
        assert_eq!(buf.as_slice(), &content[16384..32768]);
        let mut odd = AlignedBuf::new(100);
        assert_eq!(
            file.read_into(3, &mut odd).unwrap(),
            ReadPath::BufferedDontNeed
        );
        assert_eq!(odd.as_slice(), &content[3..103]);
        let mut past = AlignedBuf::new(16384);
        assert!(file.read_into(65536 - 100, &mut past).is_err());

        std::thread::sleep(std::time::Duration::from_millis(20));
        let handle = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("w.tile"))
            .unwrap();
        handle.write_all_at(&[1], 0).unwrap();
        assert!(matches!(
            file.read_into(16384, &mut buf),
            Err(LayoutError::Evidence(StoreError::Changed { .. }))
        ));
    }

    #[test]
    fn a_buffer_knows_its_length_and_what_it_holds_in_memory() {
        let empty = AlignedBuf::new(0);
        assert!(empty.is_empty());
        assert_eq!(empty.allocated(), SLOT_ALIGN);
        let five = AlignedBuf::new(5);
        assert!(!five.is_empty());
        assert_eq!((five.len(), five.allocated()), (5, 5 + SLOT_ALIGN));
    }

    #[test]
    fn a_pool_at_exactly_its_limit_keeps_what_it_holds() {
        let pool = BufferPool::new();
        let held = (40_000 + SLOT_ALIGN) as u64;
        pool.set_limit(held);
        drop(pool.buffer(40_000));
        assert_eq!(pool.kept_bytes(), held);
        pool.set_limit(held);
        assert_eq!(pool.kept_bytes(), held, "nothing is over the limit");
        pool.set_limit(held - 1);
        assert_eq!(pool.kept_bytes(), 0);
    }

    /// A file on a filesystem that refuses `O_DIRECT` (procfs) is streamed through the cache,
    /// and says so.
    #[test]
    fn a_file_the_filesystem_cannot_read_directly_does_not_claim_direct_reads() {
        let files = ArtifactFiles::unverified(std::path::Path::new("/proc")).unwrap();
        let file = files.open_streamed("version").unwrap();
        assert!(!takes_direct(std::path::Path::new("/proc/version")));
        assert!(!file.supports_direct());
        assert!(file.direct_file().is_none());
    }

    /// Whether this folder's filesystem takes `O_DIRECT` opens.
    fn takes_direct(path: &std::path::Path) -> bool {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECT,
            rustix::fs::Mode::empty(),
        )
        .is_ok()
    }

    /// A long read split into pieces read at once gives the bytes one read gives, the last
    /// piece shorter; a read of one piece or less is one read.
    #[test]
    fn a_long_read_in_pieces_has_the_bytes_of_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join("long.tile");
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        for (offset, len, chunk, reads) in [
            (0, 200_000, 4096, 49),
            (1000, 150_000, 40_000, 4),
            (7, 40_000, 40_000, 1),
            (0, 39_999, 40_000, 1),
            (0, 40_001, 40_000, 2),
        ] {
            let mut buf = vec![0u8; len];
            let got = read_in_chunks(&file, &mut buf, offset as u64, chunk).unwrap();
            assert_eq!(got, reads, "{len} at {offset} in {chunk}");
            assert!(
                buf == content[offset..offset + len],
                "{len} at {offset} in {chunk}"
            );
        }
        let mut past = vec![0u8; 50_000];
        assert!(read_in_chunks(&file, &mut past, 160_000, 4096).is_err());
    }

    /// Aligned reads bypass the page cache where the filesystem allows it; a read aligned at
    /// one end only goes through the cache (an `O_DIRECT` read of it would be refused).
    #[test]
    fn only_reads_aligned_at_both_ends_go_direct() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
        let path = dir.path().join("w.tile");
        std::fs::write(&path, &content).unwrap();
        std::fs::write(dir.path().join("empty.tile"), b"").unwrap();
        let files = ArtifactFiles::unverified(dir.path()).unwrap();
        let file = files.open_streamed("w.tile").unwrap();
        assert_eq!(
            (file.path(), file.len(), file.is_empty()),
            ("w.tile", 65536, false)
        );
        let direct = takes_direct(&path);
        assert_eq!(file.supports_direct(), direct);
        assert_eq!(file.direct_file().is_some(), direct);
        let block = DIRECT_BLOCK as usize;
        let expected = if direct {
            ReadPath::Direct
        } else {
            ReadPath::BufferedDontNeed
        };
        for (offset, len, path) in [
            (block, 2 * block, expected),
            (0, 100, ReadPath::BufferedDontNeed),
            (100, block, ReadPath::BufferedDontNeed),
        ] {
            let mut buf = AlignedBuf::new(len);
            assert_eq!(
                file.read_into(offset as u64, &mut buf).unwrap(),
                path,
                "{len} at {offset}"
            );
            assert_eq!(buf.as_slice(), &content[offset..offset + len]);
        }
        let empty = files.open_streamed("empty.tile").unwrap();
        assert_eq!((empty.len(), empty.is_empty()), (0, true));
    }
}
