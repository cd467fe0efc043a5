//! Positioned reads of whole buffers from files, up to a queue depth of them in flight from one
//! thread, through an io_uring ring whose buffers are registered with the kernel once
//! (`IORING_OP_READ_FIXED`): the kernel's asynchronous interface, measured beside positioned
//! reads on threads by `minirun bench storage --engine both`.
//!
//! The kernel writes into a buffer after the call that queued the read has returned, so the
//! io-uring crate makes registering buffers and queueing reads `unsafe`. [`FixedReads`] makes
//! them safe by owning the buffers (a buffer in flight cannot be borrowed, freed or queued
//! again), by borrowing every file it reads for its own lifetime (a file cannot be closed, and
//! its descriptor reused, under a read), and by waiting for every read in flight before its
//! memory goes (`Drop`).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = std::fs::File::open("weights.tile")?;
//! let mut reads = uring_reads::FixedReads::new(2, 16384)?;
//! reads.submit(0, &file, 0)?;
//! reads.submit(1, &file, 16384)?;
//! for _ in 0..2 {
//!     let done = reads.complete()?;
//!     assert_eq!(done.bytes, 16384);
//!     let _bytes = reads.buffer(done.slot);
//! }
//! # Ok(())
//! # }
//! ```

#![cfg(target_os = "linux")]

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;

use io_uring::{IoUring, opcode, types};

/// Where every buffer starts: a multiple of any device's logical block, as `O_DIRECT` needs
/// (and the alignment of minirun's tiles).
pub const ALIGN: usize = 16384;

/// What a written byte of a fresh buffer holds: not zero, so that the writes that make the
/// kernel find the memory before the first read cannot be left out by the compiler.
const TOUCHED: u8 = 0x5A;

/// What went wrong, and with which read.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(
        "io_uring is not available here ({0}); the kernel or a seccomp policy refuses it: read with threads instead"
    )]
    Unavailable(#[source] io::Error),
    #[error("cannot register {count} buffers of {len} bytes with the ring: {source}")]
    Register {
        count: usize,
        len: usize,
        #[source]
        source: io::Error,
    },
    #[error(
        "a ring needs a depth of 1 to {max} and buffers of 1 byte to 4 GiB; asked {depth} x {len}"
    )]
    Shape {
        depth: usize,
        len: usize,
        max: usize,
    },
    #[error("slot {slot} does not exist: the ring has {depth}")]
    NoSlot { slot: usize, depth: usize },
    #[error("slot {slot} already has a read in flight")]
    Busy { slot: usize },
    #[error("no read is in flight to wait for")]
    Idle,
    #[error("cannot hand the ring its reads: {0}")]
    Submit(#[source] io::Error),
    #[error("the read into slot {slot} failed: {source}")]
    Read {
        slot: usize,
        #[source]
        source: io::Error,
    },
    #[error("the kernel completed a read minirun did not queue (user data {0})")]
    Unknown(u64),
}

/// One read that finished: its slot and the bytes it read (fewer than the buffer at the end of
/// a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    pub slot: usize,
    pub bytes: usize,
}

/// A buffer of the ring: its memory (over-allocated so that it can start aligned) and whether
/// the kernel may be writing into it.
struct Slot {
    raw: Vec<u8>,
    start: usize,
    in_flight: bool,
}

/// `depth` buffers of `len` bytes registered with one io_uring ring, each read into by at most
/// one read at a time, from files borrowed for `'files`.
pub struct FixedReads<'files> {
    /// Declared first, so dropped first: closing the ring unregisters the buffers before their
    /// memory is freed.
    ring: IoUring,
    slots: Vec<Slot>,
    len: usize,
    in_flight: usize,
    files: PhantomData<&'files File>,
}

/// The most buffers a ring registers: the limit of the kernels that take the fewest (their
/// `UIO_MAXIOV`; newer ones take 16,384).
pub const MAX_BUFFERS: usize = 1024;

impl<'files> FixedReads<'files> {
    /// A ring of `depth` buffers of `len` bytes, every page written before it is registered.
    pub fn new(depth: usize, len: usize) -> Result<FixedReads<'files>, RingError> {
        if !(1..=MAX_BUFFERS).contains(&depth) || len == 0 || u32::try_from(len).is_err() {
            return Err(RingError::Shape {
                depth,
                len,
                max: MAX_BUFFERS,
            });
        }
        let entries = depth.next_power_of_two() as u32;
        let ring = IoUring::new(entries).map_err(RingError::Unavailable)?;
        let mut slots: Vec<Slot> = (0..depth)
            .map(|_| {
                let raw = vec![TOUCHED; len + ALIGN];
                let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
                Slot {
                    raw,
                    start,
                    in_flight: false,
                }
            })
            .collect();
        // Mutable pointers, as `submit`'s are: the kernel writes through them.
        let iovecs: Vec<libc::iovec> = slots
            .iter_mut()
            .map(|s| libc::iovec {
                iov_base: s.raw[s.start..].as_mut_ptr().cast::<libc::c_void>(),
                iov_len: len,
            })
            .collect();
        // SAFETY: each iovec covers `len` bytes inside its slot's `raw`, which is never resized
        // (so never moved) and is freed only after `ring`, whose closing unregisters it.
        #[allow(unsafe_code)]
        unsafe { ring.submitter().register_buffers(&iovecs) }.map_err(|source| {
            RingError::Register {
                count: depth,
                len,
                source,
            }
        })?;
        Ok(FixedReads {
            ring,
            slots,
            len,
            in_flight: 0,
            files: PhantomData,
        })
    }

    /// Buffers, and so reads at once.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Bytes each read asks for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a ring's buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queues a read of `len` bytes of `file` at `offset` into `slot`'s buffer and hands it to
    /// the kernel now. With `O_DIRECT`, `offset` must be block aligned (the read fails
    /// otherwise, reported by [`FixedReads::complete`]).
    pub fn submit(
        &mut self,
        slot: usize,
        file: &'files File,
        offset: u64,
    ) -> Result<(), RingError> {
        let depth = self.slots.len();
        let s = self
            .slots
            .get_mut(slot)
            .ok_or(RingError::NoSlot { slot, depth })?;
        if s.in_flight {
            return Err(RingError::Busy { slot });
        }
        let buf = s.raw[s.start..].as_mut_ptr();
        let entry = opcode::ReadFixed::new(
            types::Fd(file.as_raw_fd()),
            buf,
            self.len as u32,
            slot as u16,
        )
        .offset(offset)
        .build()
        .user_data(slot as u64);
        // SAFETY: the buffer is slot `slot`'s registered one, owned by `self` and not in flight
        // (checked above), and stays allocated until this read completes (`Drop` waits for it);
        // `file` is borrowed for as long as the ring exists, so its descriptor stays open.
        // The queue has room: it holds at least `depth` entries and every one is handed to the
        // kernel before this returns.
        #[allow(unsafe_code)]
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            return Err(RingError::Submit(io::Error::other(
                "the submission queue is full",
            )));
        }
        s.in_flight = true;
        self.in_flight += 1;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Queued but not handed over: the next submit or wait hands it over, and the slot
                // stays in flight until it completes.
                Err(e) => return Err(RingError::Submit(e)),
            }
        }
    }

    /// Waits for the next read to finish and frees its slot; its slot and bytes, or why it
    /// failed.
    pub fn complete(&mut self) -> Result<Completed, RingError> {
        if self.in_flight == 0 {
            return Err(RingError::Idle);
        }
        loop {
            let next = self.ring.completion().next();
            if let Some((user_data, result)) = next.map(|c| (c.user_data(), c.result())) {
                return self.finish(user_data, result);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RingError::Submit(e)),
            }
        }
    }

    fn finish(&mut self, user_data: u64, result: i32) -> Result<Completed, RingError> {
        let slot = usize::try_from(user_data).map_err(|_| RingError::Unknown(user_data))?;
        let s = match self.slots.get_mut(slot) {
            Some(s) if s.in_flight => s,
            _ => return Err(RingError::Unknown(user_data)),
        };
        s.in_flight = false;
        self.in_flight -= 1;
        match usize::try_from(result) {
            Ok(bytes) => Ok(Completed { slot, bytes }),
            Err(_) => Err(RingError::Read {
                slot,
                source: io::Error::from_raw_os_error(-result),
            }),
        }
    }

    /// `slot`'s buffer as its last read left it; `None` while a read is in flight into it.
    pub fn buffer(&self, slot: usize) -> Option<&[u8]> {
        let s = self.slots.get(slot)?;
        (!s.in_flight).then(|| &s.raw[s.start..s.start + self.len])
    }
}

impl Drop for FixedReads<'_> {
    /// Waits for every read in flight; where waiting fails, leaves the buffers allocated for
    /// the kernel instead of freeing memory it may still write.
    fn drop(&mut self) {
        while self.in_flight > 0 {
            match self.complete() {
                Ok(_) | Err(RingError::Read { .. }) => {}
                Err(_) => {
                    std::mem::forget(std::mem::take(&mut self.slots));
                    return;
                }
            }
        }
    }
}
