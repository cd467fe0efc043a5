//! The `.ngram` sidecar: an `--engram-ram` run's host memory on disk, beside its checkpoint.
//!
//! ```text
//! [0..8)    magic "DMNGRAM\0" (dmexp::identify::ENGRAM_SIDECAR_MAGIC)
//! [8..12)   version u32 (1)            [12..16)  dim u32 (engram_dim)
//! [16..24)  slots u64 (rows per order) [24..32)  step u64 (training steps applied)
//! [32..36)  order count K u32 (1..=8)  [36..68)  orders, 8 x u32 (unused ones 0)
//! [68..72)  CRC-32 of the payload      [72..76)  CRC-32 of bytes [0..72)
//! [76..80)  reserved, 0
//! [80..)    payload: table, first moment, second moment; each K x slots x dim f32 LE,
//!           order-major (order, slot, component)
//! ```
//!
//! Specified in `docs/formats/checkpoint.md`, with the save order that keeps a `.bin` from
//! ever being paired with a sidecar of another step: the sidecar is written under a pending
//! name ([`write_pending`]), the checkpoint that records its step and CRC is renamed into
//! place, and only then is the sidecar ([`commit`]).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use atomic_file::AtomicWriteError;

use super::MAX_ORDERS;
use super::memory::{HostMemory, MemoryError, MemoryShape};

/// The eight bytes a sidecar starts with.
pub const MAGIC: &[u8; 8] = dmexp::identify::ENGRAM_SIDECAR_MAGIC;
/// The sidecar version this build reads and writes.
pub const VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 80;

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the sidecar payload is written as the in-memory f32s, which must be little-endian"
);

/// Why a sidecar could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {advice}", path.display())]
    NotASidecar { path: PathBuf, advice: String },
    #[error("{}: Engram sidecar version {found}; this build reads version {VERSION}", path.display())]
    UnknownVersion { path: PathBuf, found: u32 },
    #[error("{}: damaged sidecar header: {reason}", path.display())]
    BadHeader { path: PathBuf, reason: String },
    #[error(
        "{}: the sidecar has {field} {found}, the run's config {expected}; it belongs to another run",
        path.display()
    )]
    Shape {
        path: PathBuf,
        field: &'static str,
        found: String,
        expected: String,
    },
    #[error(
        "{}: the sidecar holds step {found}, the checkpoint step {expected}; they are not one run state",
        path.display()
    )]
    WrongStep {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{}: the sidecar payload fails its CRC (the file is damaged)", path.display())]
    Checksum { path: PathBuf },
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl From<AtomicWriteError> for SidecarError {
    fn from(e: AtomicWriteError) -> Self {
        SidecarError::Io {
            path: e.path,
            error: e.source,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SidecarError + '_ {
    move |error| SidecarError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What a checkpoint records of the sidecar saved with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SidecarStamp {
    /// Training steps applied when it was saved (the checkpoint's own step).
    pub step: u64,
    /// CRC-32 of its payload.
    pub crc: u32,
}

/// What a sidecar's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarHeader {
    pub shape: MemoryShape,
    pub step: u64,
    pub payload_crc: u32,
}

/// The header of a sidecar of `shape` holding the memory after `step` steps.
fn encode_header(shape: &MemoryShape, step: u64, payload_crc: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(shape.dim as u32).to_le_bytes());
    h[16..24].copy_from_slice(&(shape.slots as u64).to_le_bytes());
    h[24..32].copy_from_slice(&step.to_le_bytes());
    h[32..36].copy_from_slice(&(shape.orders.len() as u32).to_le_bytes());
    for (i, &n) in shape.orders.iter().enumerate() {
        h[36 + 4 * i..40 + 4 * i].copy_from_slice(&(n as u32).to_le_bytes());
    }
    h[68..72].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&h[..72]);
    h[72..76].copy_from_slice(&header_crc.to_le_bytes());
    h
}

/// Writes `memory` at `step` to `pending` (complete and fsynced, or not there at all; not yet
/// under its final name); [`commit`] moves it into place once the checkpoint that records the
/// returned stamp is saved.
pub fn write_pending(
    memory: &HostMemory,
    pending: &Path,
    step: u64,
) -> Result<SidecarStamp, SidecarError> {
    let crc = crc32fast::hash(memory.payload());
    let header = encode_header(memory.shape(), step, crc);
    atomic_file::write_with(pending, atomic_file::Options::default(), |file| {
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&header)
            .and_then(|()| out.write_all(memory.payload()))
            .and_then(|()| out.flush())
            .map_err(io_error(pending))
    })?;
    Ok(SidecarStamp { step, crc })
}

/// Reads the sidecar at `path`, refusing one whose shape, step or CRC is not `expected`.
pub fn load(
    path: &Path,
    shape: &MemoryShape,
    expected: SidecarStamp,
) -> Result<HostMemory, SidecarError> {
    let mut file = regular_file::open(path).map_err(io_error(path))?;
    let header = read_header(&mut file, path)?;
    check_shape(&header, shape, path)?;
    if header.step != expected.step {
        return Err(SidecarError::WrongStep {
            path: path.to_path_buf(),
            found: header.step,
            expected: expected.step,
        });
    }
    let mut memory = HostMemory::zeroed(shape.clone())?;
    let payload_len = memory.payload().len();
    let file_len = file.metadata().map_err(io_error(path))?.len();
    if file_len != (HEADER_LEN + payload_len) as u64 {
        return Err(SidecarError::BadHeader {
            path: path.to_path_buf(),
            reason: format!(
                "the file is {file_len} bytes; its header says {}",
                HEADER_LEN + payload_len
            ),
        });
    }
    file.read_exact(memory.payload_mut())
        .map_err(io_error(path))?;
    let crc = crc32fast::hash(memory.payload());
    if crc != header.payload_crc || crc != expected.crc {
        return Err(SidecarError::Checksum {
            path: path.to_path_buf(),
        });
    }
    Ok(memory)
}

fn read_header(file: &mut File, path: &Path) -> Result<SidecarHeader, SidecarError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match file.read(&mut h[got..]).map_err(io_error(path))? {
            0 => break,
            n => got += n,
        }
    }
    parse_header(&h[..got], path)
}

/// Parses and checks the first bytes of a sidecar (80 are enough; `path` names it in errors).
pub fn parse_header(h: &[u8], path: &Path) -> Result<SidecarHeader, SidecarError> {
    let got = h.len();
    if !h.starts_with(MAGIC) {
        return Err(SidecarError::NotASidecar {
            path: path.to_path_buf(),
            advice: dmexp::identify::identify(h).advice(Some(path)),
        });
    }
    let bad = |reason: &str| SidecarError::BadHeader {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if got < HEADER_LEN {
        return Err(bad("the file ends inside the 80-byte header"));
    }
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let u64_at = |at: usize| u64::from(u32_at(at)) | (u64::from(u32_at(at + 4)) << 32);
    let version = u32_at(8);
    if version != VERSION {
        return Err(SidecarError::UnknownVersion {
            path: path.to_path_buf(),
            found: version,
        });
    }
    if crc32fast::hash(&h[..72]) != u32_at(72) {
        return Err(bad("the header fails its CRC"));
    }
    if u32_at(76) != 0 {
        return Err(bad("the reserved word is not zero"));
    }
    let count = u32_at(32) as usize;
    if !(1..=MAX_ORDERS).contains(&count) {
        return Err(bad("the order count is not in 1..=8"));
    }
    let orders: Vec<usize> = (0..count).map(|i| u32_at(36 + 4 * i) as usize).collect();
    if (count..MAX_ORDERS).any(|i| u32_at(36 + 4 * i) != 0) {
        return Err(bad("an unused order slot is not zero"));
    }
    let slots = usize::try_from(u64_at(16)).map_err(|_| bad("slots overflows usize"))?;
    Ok(SidecarHeader {
        shape: MemoryShape {
            orders,
            slots,
            dim: u32_at(12) as usize,
        },
        step: u64_at(24),
        payload_crc: u32_at(68),
    })
}

/// Reads only the header of the sidecar at `path`.
pub fn peek(path: &Path) -> Result<SidecarHeader, SidecarError> {
    let mut file = regular_file::open(path).map_err(io_error(path))?;
    read_header(&mut file, path)
}

fn check_shape(
    header: &SidecarHeader,
    shape: &MemoryShape,
    path: &Path,
) -> Result<(), SidecarError> {
    let mismatch = |field, found: String, expected: String| SidecarError::Shape {
        path: path.to_path_buf(),
        field,
        found,
        expected,
    };
    let h = &header.shape;
    if h.orders != shape.orders {
        return Err(mismatch(
            "engram_orders",
            format!("{:?}", h.orders),
            format!("{:?}", shape.orders),
        ));
    }
    if h.slots != shape.slots {
        return Err(mismatch(
            "engram_slots",
            h.slots.to_string(),
            shape.slots.to_string(),
        ));
    }
    if h.dim != shape.dim {
        return Err(mismatch(
            "engram_dim",
            h.dim.to_string(),
            shape.dim.to_string(),
        ));
    }
    Ok(())
}

/// `<dir>/<name>.ngram` beside the checkpoint `<dir>/<name>.bin`.
pub fn sidecar_path(bin: &Path) -> PathBuf {
    bin.with_extension("ngram")
}

/// Where a sidecar waits until the checkpoint that records it is in place.
pub fn pending_path(bin: &Path) -> PathBuf {
    bin.with_extension("ngram.tmp")
}

/// Moves the pending sidecar to its final name and makes the rename durable.
pub fn commit(bin: &Path) -> Result<(), SidecarError> {
    Ok(atomic_file::place(&pending_path(bin), &sidecar_path(bin))?)
}

/// The sidecar that belongs with the checkpoint `bin` whose trainer section holds `stamp`.
/// A save killed after its checkpoint was renamed into place but before its sidecar was
/// leaves the right sidecar pending: it is moved into place here (the save rolled forward).
pub fn open_for(
    bin: &Path,
    shape: &MemoryShape,
    stamp: SidecarStamp,
) -> Result<HostMemory, SidecarError> {
    let (target, pending) = (sidecar_path(bin), pending_path(bin));
    let in_place = peek(&target).map(|h| h.step == stamp.step);
    if !matches!(in_place, Ok(true)) {
        let pending_matches = peek(&pending)
            .map(|h| h.step == stamp.step && h.payload_crc == stamp.crc)
            .unwrap_or(false);
        if pending_matches {
            commit(bin)?;
        } else {
            in_place?;
        }
    }
    load(&target, shape, stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> MemoryShape {
        MemoryShape {
            orders: vec![2, 3],
            slots: 64,
            dim: 4,
        }
    }

    #[test]
    fn a_written_header_parses_back_and_any_bytes_never_panic() {
        let header = encode_header(&shape(), 42, 0xDEAD_BEEF);
        let parsed = parse_header(&header, Path::new("x.ngram")).unwrap();
        assert_eq!(parsed.shape, shape());
        assert_eq!((parsed.step, parsed.payload_crc), (42, 0xDEAD_BEEF));
        for len in 0..HEADER_LEN {
            assert!(parse_header(&header[..len], Path::new("x")).is_err());
        }
        proptest::proptest!(|(bytes in proptest::collection::vec(0u8..=255, 0..120), flip in 0usize..80)| {
            let _ = parse_header(&bytes, Path::new("x"));
            let mut damaged = header;
            damaged[flip] ^= 0x10;
            proptest::prop_assert!(parse_header(&damaged, Path::new("x")).is_err());
        });
    }

    #[test]
    fn a_pending_sidecar_is_complete_or_absent_and_commit_moves_it_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("latest.bin");
        let memory = HostMemory::fresh(shape(), 3).unwrap();
        let stamp = write_pending(&memory, &pending_path(&bin), 5).unwrap();
        assert_eq!(stamp.step, 5);
        let names = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(), ["latest.ngram.tmp"], "no temporary file is left");
        commit(&bin).unwrap();
        assert_eq!(names(), ["latest.ngram"]);
        let loaded = load(&sidecar_path(&bin), &shape(), stamp).unwrap();
        assert!(loaded.payload() == memory.payload());
    }
}
