//! Every way encoding, decoding or reading an export can fail, one variant per broken
//! promise, so that callers can match on the cause and people read one clear sentence.

use std::path::PathBuf;

use crate::dtype::Dtype;
use crate::identify::FileKind;
use crate::layout::{MAX_HEADER_LEN, PREFIX_LEN};

/// An error from this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- decode, in the order the checks run (see docs/formats/dmexp.md) ----
    /// Fewer than the 24 bytes of the fixed prefix.
    #[error(
        "{len} bytes is too short for a .dmexp export: the fixed prefix alone is {PREFIX_LEN} bytes"
    )]
    TooShort { len: u64 },

    /// The first seven bytes are not `DMEXPRT`; `advice` names what the file is instead.
    #[error("not a .dmexp export: {advice}")]
    NotAnExport { kind: FileKind, advice: String },

    /// The version byte is not one this crate reads.
    #[error(
        "unknown .dmexp format version {found}; this build reads version(s) {known:?} (a newer dormouse may read it)"
    )]
    UnknownVersion { found: u8, known: &'static [u8] },

    /// The header length field exceeds [`MAX_HEADER_LEN`]; nothing was allocated for it.
    #[error(
        "header length {len} exceeds the {MAX_HEADER_LEN}-byte limit: the file is damaged or not an export"
    )]
    HeaderTooLarge { len: u32 },

    /// `24 + H + P` does not fit in a u64.
    #[error(
        "header length {header_len} plus payload length {payload_len} overflows: the length fields are damaged"
    )]
    LengthOverflow { header_len: u32, payload_len: u64 },

    /// The header would end past the end of the file.
    #[error(
        "the header ({header_len} bytes from offset 24) runs past the end of the {file_len}-byte file: truncated or damaged"
    )]
    HeaderPastEnd { header_len: u32, file_len: u64 },

    /// The file is shorter than `24 + H + P`.
    #[error(
        "truncated: the prefix promises {expected} bytes (24 + header + payload) but the file has {actual}"
    )]
    Truncated { expected: u64, actual: u64 },

    /// The file is longer than `24 + H + P`.
    #[error(
        "{extra} unexpected bytes after the payload: the prefix promises {expected} bytes but the file has {actual}"
    )]
    TrailingBytes {
        expected: u64,
        actual: u64,
        extra: u64,
    },

    /// The CRC-32 of the payload differs from the one in the prefix.
    #[error(
        "payload checksum mismatch: the prefix records CRC-32 {stored:#010x}, the payload hashes to {computed:#010x}; the file is corrupt"
    )]
    ChecksumMismatch { stored: u32, computed: u32 },

    /// The header bytes are not UTF-8.
    #[error("the header is not UTF-8 (first bad byte at header offset {valid_up_to})")]
    HeaderNotUtf8 { valid_up_to: usize },

    /// The header is not TOML of the documented shape (a missing, extra or mistyped key).
    #[error("the header is not a valid .dmexp TOML header: {message}")]
    HeaderToml { message: String },

    /// The header's `format` key disagrees with the version byte.
    #[error("the header says format {header} but the version byte says {version_byte}")]
    FormatMismatch { header: i64, version_byte: u8 },

    /// The header's `dtype` is not `f32`, `f16` or `bf16`.
    #[error("the header's dtype {found:?} is not one of f32, f16, bf16")]
    UnknownDtype { found: String },

    /// `num_tensors` disagrees with the number of `[[tensors]]` entries.
    #[error("the header says num_tensors = {declared} but lists {listed} tensors")]
    TensorCountMismatch { declared: u64, listed: u64 },

    /// The export holds no tensors at all.
    #[error("the export holds no tensors: there is no model to load")]
    NoTensors,

    /// A tensor entry has an empty name.
    #[error("tensor #{index} has an empty name")]
    EmptyTensorName { index: usize },

    /// Two tensor entries share a name.
    #[error("tensor {name:?} is listed twice")]
    DuplicateTensor { name: String },

    /// A tensor has no dims or a zero dim.
    #[error(
        "tensor {name:?} has dims {dims:?}: every tensor needs at least one dim and no dim may be 0"
    )]
    InvalidDims { name: String, dims: Vec<u64> },

    /// The product of a tensor's dims (times the value size) overflows a u64, or adding the
    /// tensor to the running value count or byte offset does (the tensor's own dims may then be
    /// fine: the message says both).
    #[error(
        "tensor {name:?} (dims {dims:?}): its size, or the running total of values or bytes up to and including it, overflows a u64: the header is damaged"
    )]
    DimsOverflow { name: String, dims: Vec<u64> },

    /// A tensor entry records overflowed values; an encoder never writes such a file.
    #[error("tensor {name:?} records {count} overflowed values; a valid export always has 0")]
    OverflowedTensor { name: String, count: u64 },

    /// `num_params` disagrees with the sum of the tensors' element counts.
    #[error("the header says num_params = {declared} but its tensors hold {counted} values")]
    ParamCountMismatch { declared: u64, counted: u64 },

    /// The tensors' total size disagrees with the payload length.
    #[error(
        "the tensors listed need {needed} payload bytes but the payload is {payload_len} bytes: the header does not describe the payload"
    )]
    PayloadSizeMismatch { needed: u64, payload_len: u64 },

    /// The header's statistics fields are impossible on their own.
    #[error("the header's statistics are inconsistent: {reason}")]
    ImpossibleStatistics { reason: String },

    /// A statistic recorded in the header disagrees with the payload (full decode only).
    #[error(
        "the header records {field} = {recorded:e} but the payload's is {actual:e}: the header was altered"
    )]
    StatisticMismatch {
        field: &'static str,
        recorded: f32,
        actual: f32,
    },

    // ---- encode ----
    /// A tensor's values are not `product(dims)` long, or the set is malformed.
    #[error("tensor {name:?}: dims {dims:?} need {expected} values but {actual} were given")]
    ValueCountMismatch {
        name: String,
        dims: Vec<u64>,
        expected: u64,
        actual: u64,
    },

    /// An input weight is NaN or infinite: the model itself is broken, not the format.
    #[error(
        "tensor {tensor:?} value #{index} is {value}: the model holds a non-finite weight, which no dtype can export (the training run diverged or the checkpoint is damaged)"
    )]
    NonFiniteInput {
        tensor: String,
        index: u64,
        value: f32,
    },

    /// A finite weight becomes infinite in the requested dtype.
    #[error(
        "tensor {tensor:?} value #{index} = {value:e} overflows {dtype} (largest finite {max:e}); export with --dtype {suggest} instead"
    )]
    Overflow {
        tensor: String,
        index: u64,
        value: f32,
        dtype: Dtype,
        max: f32,
        suggest: Dtype,
    },

    // ---- files ----
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A caller-provided output does not have the tensor's length.
    #[error("output for {name:?} holds {actual} values but the tensor has {expected}")]
    OutputMismatch {
        name: String,
        expected: u64,
        actual: u64,
    },

    /// A lazy read asked for a tensor the export does not hold.
    #[error("the export holds no tensor named {name:?}")]
    NoSuchTensor { name: String },
}

impl From<atomic_file::AtomicWriteError> for Error {
    fn from(e: atomic_file::AtomicWriteError) -> Self {
        Error::io(e.path, e.source)
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
