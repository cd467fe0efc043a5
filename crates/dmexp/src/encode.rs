//! Building an export in two passes over the weights: the first checks every value and
//! gathers the statistics the header records; the second narrows and streams the payload
//! (checksummed on the way) to memory or to a file, so a large model is never held twice.

use std::collections::HashSet;
use std::io::{self, Write};

use crate::dtype::Dtype;
use crate::error::Error;
use crate::header::{Header, TensorEntry, tensor_size};
use crate::layout::{FORMAT_VERSION, MAX_HEADER_LEN, PREFIX_LEN, Prefix};
use crate::narrow::{self, StatsAcc, ValueProblem};

/// Values narrowed per write while streaming the payload (1 MiB of bf16).
const STREAM_VALUES: usize = 1 << 19;

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
        prefix_for(
            &self.header_toml,
            self.payload.len() as u64,
            self.payload_crc32,
        )
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

fn prefix_for(header_toml: &str, payload_len: u64, payload_crc32: u32) -> Prefix {
    Prefix {
        version: FORMAT_VERSION,
        header_len: header_toml.len() as u32,
        payload_len,
        payload_crc32,
    }
}

/// Narrows `tensors` to `dtype` and builds the export in memory. Fails, naming the
/// tensor and the index, on a non-finite input or a value that overflows `dtype`.
pub fn encode(
    meta: &ExportMeta,
    tensors: &[TensorRef<'_>],
    dtype: Dtype,
) -> Result<Encoded, Error> {
    let plan = Plan::new(meta, tensors, dtype)?;
    let mut payload = Vec::with_capacity(plan.header.payload_len() as usize);
    let payload_crc32 = plan
        .write_payload(&mut payload)
        .map_err(|e| Error::io("<memory>", e))?;
    Ok(Encoded {
        header: plan.header,
        header_toml: plan.header_toml,
        payload,
        payload_crc32,
    })
}

/// An export whose every value has been checked and whose header is known; only the
/// payload remains to be produced.
pub(crate) struct Plan<'a> {
    pub(crate) header: Header,
    pub(crate) header_toml: String,
    tensors: &'a [TensorRef<'a>],
}

impl<'a> Plan<'a> {
    /// Pass one: validates the tensor set and every value, and writes the header.
    pub(crate) fn new(
        meta: &ExportMeta,
        tensors: &'a [TensorRef<'a>],
        dtype: Dtype,
    ) -> Result<Plan<'a>, Error> {
        let entries = lay_out(tensors, dtype)?;
        let mut stats = StatsAcc::new(dtype);
        for tensor in tensors {
            narrow::scan(dtype, tensor.values, &mut stats)
                .map_err(|problem| value_error(tensor.name, dtype, problem))?;
        }
        let stats = stats.finish();
        let header = Header {
            dtype,
            source: meta.source.clone(),
            step: meta.step,
            num_params: entries.iter().map(|e| e.num_values).sum(),
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
        Ok(Plan {
            header,
            header_toml,
            tensors,
        })
    }

    /// The prefix, given the payload's CRC.
    pub(crate) fn prefix(&self, payload_crc32: u32) -> Prefix {
        prefix_for(&self.header_toml, self.header.payload_len(), payload_crc32)
    }

    /// Pass two: narrows every tensor in order into `out` in 1 MiB pieces and returns
    /// the payload's CRC-32.
    pub(crate) fn write_payload(&self, out: &mut impl Write) -> io::Result<u32> {
        let dtype = self.header.dtype;
        let width = dtype.size() as usize;
        let mut buf = vec![0u8; STREAM_VALUES * width];
        let mut crc = crc32fast::Hasher::new();
        for tensor in self.tensors {
            for values in tensor.values.chunks(STREAM_VALUES) {
                let bytes = &mut buf[..values.len() * width];
                narrow::narrow_to(dtype, values, bytes);
                crc.update(bytes);
                out.write_all(bytes)?;
            }
        }
        Ok(crc.finalize())
    }
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
