//! Exports on disk: atomic writes, whole-file reads, and lazy reads that stream the
//! checksum and fetch one tensor without materialising the rest.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::decode::{Export, check_crc, check_prefix, check_statistics, decode_with_path};
use crate::dtype::Dtype;
use crate::encode::{Encoded, ExportMeta, Plan, TensorRef};
use crate::error::Error;
use crate::header::{Header, TensorEntry};
use crate::layout::{PREFIX_LEN, Prefix};
use crate::narrow::{self, UntypedStats};

/// Payload bytes hashed per read while streaming the checksum.
const STREAM_CHUNK: usize = 1 << 20;

/// Writes `encoded` to `path` atomically: see [`encode_to_path`].
pub fn write_atomic(path: &Path, encoded: &Encoded) -> Result<(), Error> {
    replace_atomically(path, |file| {
        encoded.write_to(BufWriter::with_capacity(1 << 20, file))
    })
}

/// What a streamed write produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The header written.
    pub header: Header,
    /// The prefix written.
    pub prefix: Prefix,
}

impl Written {
    /// Total file length: `24 + H + P`.
    pub fn file_len(&self) -> u64 {
        self.prefix.file_len().unwrap_or(u64::MAX)
    }
}

/// Encodes `tensors` and writes the export to `path` atomically, streaming the payload
/// (1 MiB at a time) instead of building it in memory.
///
/// Every value is checked before any file is created, so a non-finite weight or an
/// overflow leaves nothing behind. The file is written to a temporary name in the same
/// directory, fsynced and renamed over `path`, and the directory is fsynced. A failure
/// before the rename removes the temporary file and leaves `path` as it was (old content
/// or absent); only a failure of the final directory fsync is reported with the new,
/// complete file already in place.
pub fn encode_to_path(
    path: &Path,
    meta: &ExportMeta,
    tensors: &[TensorRef<'_>],
    dtype: Dtype,
) -> Result<Written, Error> {
    let plan = Plan::new(meta, tensors, dtype)?;
    let mut payload_crc32 = 0;
    replace_atomically(path, |mut file| {
        // The CRC is known only after the payload; its four bytes are patched last.
        file.write_all(&plan.prefix(0).to_bytes())?;
        file.write_all(plan.header_toml.as_bytes())?;
        payload_crc32 = plan.write_payload(&mut file)?;
        file.write_all_at(&plan.prefix(payload_crc32).to_bytes(), 0)
    })?;
    Ok(Written {
        prefix: plan.prefix(payload_crc32),
        header: plan.header,
    })
}

/// Lets `fill` write the new file through [`atomic_file`]: a temporary sibling, fsynced,
/// renamed over `path`, the directory fsynced; the temporary file is removed on any failure.
fn replace_atomically(
    path: &Path,
    fill: impl FnOnce(&File) -> std::io::Result<()>,
) -> Result<(), Error> {
    // An export is made to be handed on: readable by others like any file `cp` makes (the
    // process umask still applies), which is atomic_file's default mode.
    atomic_file::write_with(path, atomic_file::Options::default(), |file| {
        fill(file).map_err(|e| Error::io(path, e))
    })
}

/// Reads and fully decodes the export at `path`. The prefix is checked from the first
/// 24 bytes and the file's length before the rest is read, so a training checkpoint or
/// a multi-gigabyte sidecar is refused after reading 24 bytes.
pub fn read(path: &Path) -> Result<Export, Error> {
    let (file, file_len, first) = open_prefix(path)?;
    check_prefix(&first, file_len, Some(path))?;
    // check_prefix proved the length is exactly 24 + H + P of a real file.
    let mut bytes = vec![0u8; file_len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| Error::io(path, e))?;
    decode_with_path(&bytes, Some(path))
}

/// Opens `path` and reads up to the first 24 bytes (fewer if the file is shorter).
fn open_prefix(path: &Path) -> Result<(File, u64, Vec<u8>), Error> {
    let file = regular_file::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut first = Vec::with_capacity(PREFIX_LEN);
    (&file)
        .take(PREFIX_LEN as u64)
        .read_to_end(&mut first)
        .map_err(|e| Error::io(path, e))?;
    Ok((file, file_len, first))
}

/// An export opened lazily: prefix and header validated, payload checksum verified by
/// streaming, tensors read one at a time on request.
#[derive(Debug)]
pub struct DmexpFile {
    path: PathBuf,
    file: File,
    file_len: u64,
    prefix: Prefix,
    header: Header,
}

impl DmexpFile {
    /// Opens and validates `path` in the documented order, streaming the payload once
    /// (1 MiB reads) for the CRC and the statistics check, so a lazily opened file is
    /// held to every rule a full decode enforces. Memory use is the header plus one chunk.
    pub fn open(path: &Path) -> Result<DmexpFile, Error> {
        let (file, file_len, first) = open_prefix(path)?;
        let prefix = check_prefix(&first, file_len, Some(path))?;
        let mut header_bytes = vec![0u8; prefix.header_len as usize];
        file.read_exact_at(&mut header_bytes, PREFIX_LEN as u64)
            .map_err(|e| Error::io(path, e))?;
        let payload_start = PREFIX_LEN as u64 + u64::from(prefix.header_len);
        let (computed, stats) = stream_payload(&file, payload_start, prefix.payload_len)
            .map_err(|e| Error::io(path, e))?;
        check_crc(&prefix, computed)?;
        let header = Header::parse(&header_bytes, prefix.version, prefix.payload_len)?;
        check_statistics(&header, &stats.for_dtype(header.dtype))?;
        Ok(DmexpFile {
            path: path.to_path_buf(),
            file,
            file_len,
            prefix,
            header,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The fixed prefix.
    pub fn prefix(&self) -> Prefix {
        self.prefix
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads one tensor and widens it to f32, reading only that tensor's bytes.
    pub fn read_tensor(&self, name: &str) -> Result<(&TensorEntry, Vec<f32>), Error> {
        let entry = self.header.require(name)?;
        let mut bytes = vec![0u8; entry.byte_len as usize];
        let at = PREFIX_LEN as u64 + u64::from(self.prefix.header_len) + entry.offset;
        self.file
            .read_exact_at(&mut bytes, at)
            .map_err(|e| Error::io(&self.path, e))?;
        Ok((entry, narrow::widen(self.header.dtype, &bytes)))
    }
}

/// Reads the payload once, in 1 MiB pieces, for its CRC and its statistics.
fn stream_payload(file: &File, start: u64, len: u64) -> std::io::Result<(u32, UntypedStats)> {
    let mut hasher = crc32fast::Hasher::new();
    let mut stats = UntypedStats::new();
    let mut buf = vec![0u8; STREAM_CHUNK.min(len as usize)];
    // Offsets by a fixed step: every read advances (a zero step panics at once rather than
    // looping without reading).
    for offset in (0..len).step_by(STREAM_CHUNK) {
        let n = (len - offset).min(buf.len() as u64) as usize;
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, start + offset)?;
        hasher.update(chunk);
        stats.observe(chunk);
    }
    Ok((hasher.finalize(), stats))
}
