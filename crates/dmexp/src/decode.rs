//! Decoding a whole export from bytes, validating in the documented order:
//! length, magic, version, header bound, exact file length, CRC, header, statistics.

use std::path::Path;

use crate::error::Error;
use crate::header::{Header, TensorEntry};
use crate::identify::{FileKind, identify};
use crate::layout::{KNOWN_VERSIONS, MAX_HEADER_LEN, PREFIX_LEN, Prefix};
use crate::narrow::{self, StatsAcc};

/// A decoded export: the header and every tensor widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The validated header.
    pub header: Header,
    values: Vec<Vec<f32>>,
}

impl Export {
    /// The tensor named `name` and its values.
    pub fn tensor(&self, name: &str) -> Option<(&TensorEntry, &[f32])> {
        self.tensors().find(|(entry, _)| entry.name == name)
    }

    /// Every tensor in payload order.
    pub fn tensors(&self) -> impl Iterator<Item = (&TensorEntry, &[f32])> {
        self.header
            .tensors
            .iter()
            .zip(self.values.iter().map(Vec::as_slice))
    }

    /// Consumes the export, yielding each tensor's entry and values.
    pub fn into_tensors(self) -> impl Iterator<Item = (TensorEntry, Vec<f32>)> {
        self.header.tensors.into_iter().zip(self.values)
    }
}

/// Checks steps 1-5 (length, magic, version, header bound, exact total length) from the
/// first bytes of a file and its full length. `path` only improves the messages.
pub(crate) fn check_prefix(
    first: &[u8],
    file_len: u64,
    path: Option<&Path>,
) -> Result<Prefix, Error> {
    if file_len < PREFIX_LEN as u64 {
        return Err(Error::TooShort { len: file_len });
    }
    let kind = identify(first);
    if !matches!(kind, FileKind::Export { .. }) {
        return Err(Error::NotAnExport {
            advice: kind.advice(path),
            kind,
        });
    }
    let prefix = Prefix::read(first).ok_or(Error::TooShort {
        len: first.len() as u64,
    })?;
    if !KNOWN_VERSIONS.contains(&prefix.version) {
        return Err(Error::UnknownVersion {
            found: prefix.version,
            known: KNOWN_VERSIONS,
        });
    }
    if prefix.header_len > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            len: prefix.header_len,
        });
    }
    check_file_len(&prefix, file_len)?;
    Ok(prefix)
}

fn check_file_len(prefix: &Prefix, actual: u64) -> Result<(), Error> {
    let expected = prefix.file_len().ok_or(Error::LengthOverflow {
        header_len: prefix.header_len,
        payload_len: prefix.payload_len,
    })?;
    let header_end = PREFIX_LEN as u64 + u64::from(prefix.header_len);
    if header_end > actual {
        return Err(Error::HeaderPastEnd {
            header_len: prefix.header_len,
            file_len: actual,
        });
    }
    match actual.cmp(&expected) {
        std::cmp::Ordering::Less => Err(Error::Truncated { expected, actual }),
        std::cmp::Ordering::Greater => Err(Error::TrailingBytes {
            expected,
            actual,
            extra: actual - expected,
        }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

pub(crate) fn check_crc(prefix: &Prefix, computed: u32) -> Result<(), Error> {
    if computed != prefix.payload_crc32 {
        return Err(Error::ChecksumMismatch {
            stored: prefix.payload_crc32,
            computed,
        });
    }
    Ok(())
}

/// Decodes a whole export held in memory, widening every tensor to f32.
///
/// ```
/// let meta = dmexp::ExportMeta { source: "run.bin@step1".into(), step: 1, config: toml::Table::new() };
/// let tensor = dmexp::TensorRef { name: "w", dims: &[2], values: &[1.0, -0.5] };
/// let bytes = dmexp::encode(&meta, &[tensor], dmexp::Dtype::Bf16)?.to_bytes();
/// let export = dmexp::decode(&bytes)?;
/// assert_eq!(export.tensor("w").map(|(_, v)| v), Some(&[1.0f32, -0.5][..]));
/// # Ok::<(), dmexp::Error>(())
/// ```
pub fn decode(bytes: &[u8]) -> Result<Export, Error> {
    decode_with_path(bytes, None)
}

pub(crate) fn decode_with_path(bytes: &[u8], path: Option<&Path>) -> Result<Export, Error> {
    let view = view_with_path(bytes, path)?;
    let mut values: Vec<Vec<f32>> = view
        .header
        .tensors
        .iter()
        .map(|t| vec![0.0; t.num_values as usize])
        .collect();
    let mut outputs: Vec<&mut [f32]> = values.iter_mut().map(Vec::as_mut_slice).collect();
    view.widen_all_into(&mut outputs)?;
    Ok(Export {
        header: view.header,
        values,
    })
}

/// A validated export borrowed from memory, not yet widened: for loaders that fill
/// tensors they have already allocated.
#[derive(Debug, Clone)]
pub struct ExportView<'a> {
    /// The validated header.
    pub header: Header,
    payload: &'a [u8],
}

/// Validates `bytes` as an export (every check of [`decode`] but the statistics, which
/// need the values) without widening anything.
pub fn view(bytes: &[u8]) -> Result<ExportView<'_>, Error> {
    view_with_path(bytes, None)
}

fn view_with_path<'a>(bytes: &'a [u8], path: Option<&Path>) -> Result<ExportView<'a>, Error> {
    let prefix = check_prefix(bytes, bytes.len() as u64, path)?;
    // check_prefix proved 24 + H + P == bytes.len(), so these slices are in bounds.
    let (header_bytes, payload) = bytes[PREFIX_LEN..].split_at(prefix.header_len as usize);
    check_crc(&prefix, crc32fast::hash(payload))?;
    let header = Header::parse(header_bytes, prefix.version, prefix.payload_len)?;
    Ok(ExportView { header, payload })
}

impl ExportView<'_> {
    /// Widens every tensor, in header order, into `outputs` (one slice per tensor, each
    /// exactly the tensor's length), then checks the header's statistics against the
    /// values.
    pub fn widen_all_into(&self, outputs: &mut [&mut [f32]]) -> Result<(), Error> {
        if outputs.len() != self.header.tensors.len() {
            return Err(Error::OutputMismatch {
                name: format!("<{} outputs>", outputs.len()),
                expected: self.header.tensors.len() as u64,
                actual: outputs.len() as u64,
            });
        }
        let mut stats = StatsAcc::new(self.header.dtype);
        for (entry, out) in self.header.tensors.iter().zip(outputs.iter_mut()) {
            self.widen_entry(entry, out, &mut stats)?;
        }
        check_statistics(&self.header, &stats)
    }

    /// Widens the tensor named `name` into `out` (exactly its length).
    pub fn widen_into(&self, name: &str, out: &mut [f32]) -> Result<(), Error> {
        let entry = self.header.require(name)?;
        self.widen_entry(entry, out, &mut StatsAcc::new(self.header.dtype))
    }

    fn widen_entry(
        &self,
        entry: &TensorEntry,
        out: &mut [f32],
        stats: &mut StatsAcc,
    ) -> Result<(), Error> {
        if out.len() as u64 != entry.num_values {
            return Err(Error::OutputMismatch {
                name: entry.name.clone(),
                expected: entry.num_values,
                actual: out.len() as u64,
            });
        }
        // Header::parse proved every tensor lies inside the payload.
        let start = entry.offset as usize;
        let bytes = &self.payload[start..start + entry.byte_len as usize];
        narrow::widen_to(self.header.dtype, bytes, out, stats);
        Ok(())
    }
}

/// The recorded max |w| and min non-zero |w| must be those of the payload; `flushed`
/// cannot be checked (it describes the values before narrowing).
pub(crate) fn check_statistics(header: &Header, stats: &StatsAcc) -> Result<(), Error> {
    let actual = stats.finish();
    let pairs = [
        ("max_abs", header.max_abs, actual.max_abs),
        (
            "min_nonzero_abs",
            header.min_nonzero_abs,
            actual.min_nonzero_abs,
        ),
    ];
    for (field, recorded, actual) in pairs {
        if recorded.to_bits() != actual.to_bits() {
            return Err(Error::StatisticMismatch {
                field,
                recorded,
                actual,
            });
        }
    }
    Ok(())
}
