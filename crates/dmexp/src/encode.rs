//! Building an export in memory: validate the tensor set, narrow every value (checksum and
//! statistics gathered on the way), then write the header that describes it.

use std::collections::HashSet;
use std::io::{self, Write};

use crate::dtype::Dtype;
use crate::error::Error;
use crate::header::{Header, TensorEntry, tensor_size};
use crate::layout::{FORMAT_VERSION, MAX_HEADER_LEN, PREFIX_LEN, Prefix};
use crate::narrow::{self, Sink, StatsAcc, ValueProblem};

/// One f32 tensor to export.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// Module path, e.g. `blocks.0.attn.q_proj.weight`.
    pub name: &'a str,
    /// Row-major dims; their product must equal `values.len()`.
    pub dims: &'a [u64],
    /// The values, row-major.
    pub values: &'a [f32],
}

/// Where the weights came from and the config they need; copied into the header.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportMeta {
    /// The checkpoint this export was made from, with its step (e.g. `checkpoints/latest.bin@step20`).
    pub source: String,
    /// The training step of that checkpoint.
    pub step: u64,
    /// The model config, stored verbatim as the `[config]` table.
    pub config: toml::Table,
}

/// A complete export held in memory: prefix, header text and narrowed payload.
#[derive(Debug, Clone)]
pub struct Encoded {
    header: Header,
    header_toml: String,
    payload: Vec<u8>,
    payload_crc32: u32,
}

impl Encoded {
    /// The header that was written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The fixed prefix.
    pub fn prefix(&self) -> Prefix {
        Prefix {
            version: FORMAT_VERSION,
            header_len: self.header_toml.len() as u32,
            payload_len: self.payload.len() as u64,
            payload_crc32: self.payload_crc32,
        }
    }

    /// Total file length: `24 + H + P`.
    pub fn file_len(&self) -> u64 {
        (PREFIX_LEN + self.header_toml.len() + self.payload.len()) as u64
    }

    /// Writes the whole file to `out`.
    pub fn write_to(&self, mut out: impl Write) -> io::Result<()> {
        out.write_all(&self.prefix().to_bytes())?;
        out.write_all(self.header_toml.as_bytes())?;
        out.write_all(&self.payload)?;
        out.flush()
    }

    /// The whole file as one buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.file_len() as usize);
        bytes.extend_from_slice(&self.prefix().to_bytes());
        bytes.extend_from_slice(self.header_toml.as_bytes());
        bytes.extend_from_slice(&self.payload);
        bytes
    }
}

/// Narrows `tensors` to `dtype` and builds the export. Fails, naming the tensor and the
/// index, on a non-finite input or a value that overflows `dtype`; nothing is produced.
pub fn encode(meta: &ExportMeta, tensors: &[TensorRef<'_>], dtype: Dtype) -> Result<Encoded, Error> {
    let entries = lay_out(tensors, dtype)?;
    let payload_len: u64 = entries.iter().map(|e| e.byte_len).sum();
    let mut payload = Vec::with_capacity(usize::try_from(payload_len).unwrap_or(0));
    let mut sink = Sink {
        stats: StatsAcc::new(dtype),
        crc: crc32fast::Hasher::new(),
    };
    for tensor in tensors {
        narrow::narrow_into(dtype, tensor.values, &mut payload, &mut sink)
            .map_err(|problem| value_error(tensor.name, dtype, problem))?;
    }
    let stats = sink.stats.finish();
    let num_params = entries.iter().map(|e| e.num_values).sum();
    let header = Header {
        dtype,
        source: meta.source.clone(),
        step: meta.step,
        num_params,
        flushed: stats.flushed,
        max_abs: stats.max_abs,
        min_nonzero_abs: stats.min_nonzero_abs,
        config: meta.config.clone(),
        tensors: entries,
    };
    let header_toml = header.to_toml()?;
    let header_len = u32::try_from(header_toml.len()).unwrap_or(u32::MAX);
    if header_len > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge { len: header_len });
    }
    Ok(Encoded {
        header,
        header_toml,
        payload,
        payload_crc32: sink.crc.finalize(),
    })
}

/// Checks the tensor set (the same rules the decoder enforces) and assigns offsets.
fn lay_out(tensors: &[TensorRef<'_>], dtype: Dtype) -> Result<Vec<TensorEntry>, Error> {
    if tensors.is_empty() {
        return Err(Error::NoTensors);
    }
    let mut seen = HashSet::with_capacity(tensors.len());
    let mut offset = 0u64;
    let mut entries = Vec::with_capacity(tensors.len());
    for (index, t) in tensors.iter().enumerate() {
        if t.name.is_empty() {
            return Err(Error::EmptyTensorName { index });
        }
        if !seen.insert(t.name) {
            return Err(Error::DuplicateTensor {
                name: t.name.to_string(),
            });
        }
        let (num_values, byte_len) = tensor_size(t.name, t.dims, dtype)?;
        if num_values != t.values.len() as u64 {
            return Err(Error::ValueCountMismatch {
                name: t.name.to_string(),
                dims: t.dims.to_vec(),
                expected: num_values,
                actual: t.values.len() as u64,
            });
        }
        entries.push(TensorEntry {
            name: t.name.to_string(),
            dims: t.dims.to_vec(),
            offset,
            num_values,
            byte_len,
        });
        // Cannot overflow: every tensor is backed by a slice in memory.
        offset += byte_len;
    }
    Ok(entries)
}

fn value_error(tensor: &str, dtype: Dtype, problem: ValueProblem) -> Error {
    match problem {
        ValueProblem::NonFiniteInput { index, value } => Error::NonFiniteInput {
            tensor: tensor.to_string(),
            index,
            value,
        },
        ValueProblem::Overflow { index, value } => Error::Overflow {
            tensor: tensor.to_string(),
            index,
            value,
            dtype,
            max: largest_finite(dtype),
            suggest: dtype.wider().unwrap_or(Dtype::F32),
        },
    }
}

fn largest_finite(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F32 => f32::MAX,
        Dtype::F16 => 65504.0,
        Dtype::Bf16 => narrow::bf16_bits_to_f32(0x7F7F),
    }
}
