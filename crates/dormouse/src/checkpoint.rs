//! The training checkpoint container, `<name>.bin`: a run, not a model.
//!
//! ```text
//! [0..8)    magic "DMTRAIN\0" (dmexp::identify::TRAINING_CHECKPOINT_MAGIC)
//! [8..12)   container version, u32 LE (1)
//! [12..16)  section count N, u32 LE (1..=8)
//! [16..16+32N)  section table, one 32-byte entry per section:
//!           [0..8) kind, ASCII, zero padded   [8..16) offset u64   [16..24) length u64
//!           [24..28) CRC-32 (IEEE) of the section bytes   [28..32) reserved, 0
//! sections, each starting on an 8-byte boundary, in table order, no overlap, ending the file
//! ```
//!
//! Section kinds: `model` and `ema` (safetensors of the model's / the EMA teacher's tensors),
//! `optim` (safetensors of the AdamW moments), `trainer` (TOML: step, RNG state, data cursor,
//! schedule position). Each section is read and CRC-checked on its own, so `export` reads
//! the model section and never the optimizer. Specified in `docs/formats/checkpoint.md`.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The eight bytes a training checkpoint starts with.
pub const MAGIC: &[u8; 8] = dmexp::identify::TRAINING_CHECKPOINT_MAGIC;
/// The container version this build reads and writes.
pub const VERSION: u32 = 1;
/// At most this many sections (the table is read before anything is trusted).
pub const MAX_SECTIONS: u32 = 8;
const TABLE_START: u64 = 16;
const ENTRY_LEN: u64 = 32;

/// What a section holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SectionKind {
    Model,
    Optimizer,
    Ema,
    Trainer,
}

impl SectionKind {
    pub const ALL: [SectionKind; 4] = [
        SectionKind::Model,
        SectionKind::Optimizer,
        SectionKind::Ema,
        SectionKind::Trainer,
    ];

    fn tag(self) -> [u8; 8] {
        let name: &[u8] = match self {
            SectionKind::Model => b"model",
            SectionKind::Optimizer => b"optim",
            SectionKind::Ema => b"ema",
            SectionKind::Trainer => b"trainer",
        };
        let mut tag = [0u8; 8];
        tag[..name.len()].copy_from_slice(name);
        tag
    }

    fn from_tag(tag: [u8; 8]) -> Option<SectionKind> {
        SectionKind::ALL.into_iter().find(|k| k.tag() == tag)
    }
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {advice}", path.display())]
    NotACheckpoint { path: PathBuf, advice: String },
    #[error("{}: training checkpoint version {found}; this build reads version {VERSION}", path.display())]
    UnknownVersion { path: PathBuf, found: u32 },
    #[error("{}: damaged section table: {reason}", path.display())]
    BadTable { path: PathBuf, reason: String },
    #[error("{}: the {kind:?} section fails its CRC-32 check: the file is corrupt", path.display())]
    Checksum { path: PathBuf, kind: SectionKind },
    #[error("{}: the checkpoint has no {kind:?} section", path.display())]
    Missing { path: PathBuf, kind: SectionKind },
}

impl From<atomic_file::AtomicWriteError> for CheckpointError {
    fn from(e: atomic_file::AtomicWriteError) -> Self {
        CheckpointError::Io {
            path: e.path,
            error: e.source,
        }
    }
}

fn io(path: &Path, error: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// One table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionEntry {
    pub kind: SectionKind,
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

/// Writes `sections` (each kind at most once) to `path` through [`atomic_file`]: a kill or a
/// failure at any point leaves the old checkpoint (or none), never half of a new one.
pub fn write(path: &Path, sections: &[(SectionKind, &[u8])]) -> Result<(), CheckpointError> {
    let mut offset = TABLE_START + ENTRY_LEN * sections.len() as u64;
    let mut table = Vec::new();
    for (kind, bytes) in sections {
        offset = offset.next_multiple_of(8);
        table.push(SectionEntry {
            kind: *kind,
            offset,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        });
        offset += bytes.len() as u64;
    }
    let write_all = |out: &mut BufWriter<&File>| -> std::io::Result<()> {
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&(sections.len() as u32).to_le_bytes())?;
        for e in &table {
            out.write_all(&e.kind.tag())?;
            out.write_all(&e.offset.to_le_bytes())?;
            out.write_all(&e.len.to_le_bytes())?;
            out.write_all(&e.crc32.to_le_bytes())?;
            out.write_all(&0u32.to_le_bytes())?;
        }
        let mut position = TABLE_START + ENTRY_LEN * sections.len() as u64;
        for (e, (_, bytes)) in table.iter().zip(sections) {
            out.write_all(&vec![0u8; (e.offset - position) as usize])?;
            out.write_all(bytes)?;
            position = e.offset + e.len;
        }
        out.flush()
    };
    atomic_file::write_with(path, atomic_file::Options::default(), |file| {
        write_all(&mut BufWriter::new(file)).map_err(|e| io(path, e))
    })
}

/// An opened checkpoint: the table is validated; sections are read on request.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    file: File,
    entries: Vec<SectionEntry>,
}

impl Checkpoint {
    /// Opens `path` and validates the header and the section table (no section is read).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let file = regular_file::open(path).map_err(|e| io(path, e))?;
        let file_len = file.metadata().map_err(|e| io(path, e))?.len();
        let mut head = Vec::with_capacity(TABLE_START as usize);
        (&file)
            .take(TABLE_START)
            .read_to_end(&mut head)
            .map_err(|e| io(path, e))?;
        if !head.starts_with(MAGIC) {
            let advice = dmexp::identify(&head).advice(Some(path));
            return Err(CheckpointError::NotACheckpoint {
                path: path.to_path_buf(),
                advice,
            });
        }
        let word = |at: usize| {
            head.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let (Some(version), Some(count)) = (word(8), word(12)) else {
            return Err(bad_table(path, "the file ends inside the header"));
        };
        if version != VERSION {
            return Err(CheckpointError::UnknownVersion {
                path: path.to_path_buf(),
                found: version,
            });
        }
        if count == 0 || count > MAX_SECTIONS {
            return Err(bad_table(
                path,
                &format!("{count} sections (1 to {MAX_SECTIONS} allowed)"),
            ));
        }
        let mut table = vec![0u8; (ENTRY_LEN * u64::from(count)) as usize];
        file.read_exact_at(&mut table, TABLE_START)
            .map_err(|_| bad_table(path, "the file ends inside the section table"))?;
        let entries = parse_table(path, &table, u64::from(count), file_len)?;
        Ok(Checkpoint {
            path: path.to_path_buf(),
            file,
            entries,
        })
    }

    /// The validated section table.
    pub fn entries(&self) -> &[SectionEntry] {
        &self.entries
    }

    /// Reads one section and checks its CRC; nothing else of the file is read.
    pub fn read(&self, kind: SectionKind) -> Result<Vec<u8>, CheckpointError> {
        let entry = self
            .entries
            .iter()
            .find(|e| e.kind == kind)
            .ok_or_else(|| CheckpointError::Missing {
                path: self.path.clone(),
                kind,
            })?;
        let mut bytes = vec![0u8; entry.len as usize];
        self.file
            .read_exact_at(&mut bytes, entry.offset)
            .map_err(|e| io(&self.path, e))?;
        if crc32fast::hash(&bytes) != entry.crc32 {
            return Err(CheckpointError::Checksum {
                path: self.path.clone(),
                kind,
            });
        }
        Ok(bytes)
    }
}

fn bad_table(path: &Path, reason: &str) -> CheckpointError {
    CheckpointError::BadTable {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Entries must have known, distinct kinds, zero reserved words, 8-byte aligned offsets,
/// and lie in order after the table without overlap, the last ending the file.
fn parse_table(
    path: &Path,
    table: &[u8],
    count: u64,
    file_len: u64,
) -> Result<Vec<SectionEntry>, CheckpointError> {
    let mut entries: Vec<SectionEntry> = Vec::new();
    let mut end = TABLE_START + ENTRY_LEN * count;
    for raw in table.chunks_exact(ENTRY_LEN as usize) {
        let field = |a: usize, b: usize| raw.get(a..b).unwrap_or(&[]);
        let u64_at = |a: usize| {
            field(a, a + 8)
                .try_into()
                .map(u64::from_le_bytes)
                .unwrap_or(u64::MAX)
        };
        let u32_at = |a: usize| {
            field(a, a + 4)
                .try_into()
                .map(u32::from_le_bytes)
                .unwrap_or(u32::MAX)
        };
        let tag: [u8; 8] = field(0, 8).try_into().unwrap_or([0xFF; 8]);
        let kind = SectionKind::from_tag(tag).ok_or_else(|| {
            bad_table(
                path,
                &format!("unknown section kind {:?}", String::from_utf8_lossy(&tag)),
            )
        })?;
        if entries.iter().any(|e| e.kind == kind) {
            return Err(bad_table(
                path,
                &format!("the {kind:?} section appears twice"),
            ));
        }
        let (offset, len, crc32) = (u64_at(8), u64_at(16), u32_at(24));
        if u32_at(28) != 0 {
            return Err(bad_table(path, "a reserved word is not 0"));
        }
        if !offset.is_multiple_of(8) || offset < end || offset - end >= 8 {
            return Err(bad_table(
                path,
                &format!(
                    "the {kind:?} section starts at {offset}, not at the next 8-byte boundary after {end}"
                ),
            ));
        }
        end = offset
            .checked_add(len)
            .ok_or_else(|| bad_table(path, "a section length overflows"))?;
        entries.push(SectionEntry {
            kind,
            offset,
            len,
            crc32,
        });
    }
    if end != file_len {
        return Err(bad_table(
            path,
            &format!("the sections end at byte {end} but the file has {file_len}"),
        ));
    }
    Ok(entries)
}
