//! Building an export in two passes over the weights: the first checks every value and
//! gathers the statistics the header records (two threads, each over half the values); the
//! second narrows and streams the payload (checksummed on the way) to memory or to a file, so a
//! large model is never held twice, a second thread narrowing ahead of the write.

use std::collections::HashSet;
use std::io::{self, Write};
use std::sync::mpsc;

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
        let stats = scan_all(tensors, dtype)?.finish();
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

    /// Pass two: narrows every tensor in order into `out` in 1 MiB pieces and returns the
    /// payload's CRC-32. A second thread narrows and checksums the next pieces while this one
    /// writes the last, so the narrowing hides behind the write.
    pub(crate) fn write_payload(&self, out: &mut impl Write) -> io::Result<u32> {
        let dtype = self.header.dtype;
        let width = dtype.size() as usize;
        let (filled_tx, filled) = mpsc::sync_channel::<(Vec<u8>, usize)>(PIECES_IN_FLIGHT);
        let largest = self.tensors.iter().map(|t| t.values.len()).max();
        let piece_values = STREAM_VALUES.min(largest.unwrap_or(0));
        let buffers: Vec<Vec<u8>> = (0..=PIECES_IN_FLIGHT)
            .map(|_| vec![0u8; piece_values * width])
            .collect();
        // The pool's channel is sized by the buffers it holds, so handing them in never waits.
        let (spare_tx, spare) = mpsc::sync_channel::<Vec<u8>>(buffers.len());
        for buffer in buffers {
            let _ = spare_tx.send(buffer);
        }
        std::thread::scope(|scope| {
            let narrower = scope.spawn(move || {
                let mut crc = crc32fast::Hasher::new();
                let pieces = self
                    .tensors
                    .iter()
                    .flat_map(|t| t.values.chunks(STREAM_VALUES));
                for values in pieces {
                    // Either channel closes only when the writer stopped on an error.
                    let Ok(mut buf) = spare.recv() else { break };
                    let used = values.len() * width;
                    narrow::narrow_to(dtype, values, &mut buf[..used]);
                    crc.update(&buf[..used]);
                    if filled_tx.send((buf, used)).is_err() {
                        break;
                    }
                }
                crc.finalize()
            });
            let written = write_pieces(out, filled, spare_tx);
            let crc = narrower
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            written.map(|()| crc)
        })
    }
}

/// Writes the narrowed pieces as they come and hands each buffer back. Returns (dropping both
/// channel ends, which stops the narrowing thread) at the end or at the first failed write.
fn write_pieces(
    out: &mut impl Write,
    filled: mpsc::Receiver<(Vec<u8>, usize)>,
    spare: mpsc::SyncSender<Vec<u8>>,
) -> io::Result<()> {
    for (buf, used) in filled.iter() {
        out.write_all(&buf[..used])?;
        // The narrower may have finished and dropped its end; nothing is lost then.
        let _ = spare.send(buf);
    }
    Ok(())
}

/// Pieces narrowed ahead of the write.
const PIECES_IN_FLIGHT: usize = 3;

/// Pass one over every value: the statistics, or the first value (in payload order) that
/// cannot be stored. A large export is scanned as two halves on two threads.
fn scan_all(tensors: &[TensorRef<'_>], dtype: Dtype) -> Result<StatsAcc, Error> {
    // Values from which the scan is split across two threads.
    let parallel_from: usize = 1 << 20;
    let total: usize = tensors.iter().map(|t| t.values.len()).sum();
    if total < parallel_from {
        return scan_pieces(&pieces(tensors, 0, total), dtype);
    }
    let (front, back) = (
        pieces(tensors, 0, total / 2),
        pieces(tensors, total / 2, total),
    );
    let (front, back) = std::thread::scope(|scope| {
        let back = scope.spawn(|| scan_pieces(&back, dtype));
        (scan_pieces(&front, dtype), back.join())
    });
    // The front's problem comes first in payload order.
    let mut stats = front?;
    let back = back.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    stats.absorb(&back);
    Ok(stats)
}

/// A run of one tensor's values: `offset` values into the tensor.
struct Piece<'a> {
    tensor: &'a str,
    offset: usize,
    values: &'a [f32],
}

/// The values from `start` to `end` of the concatenation of every tensor, as pieces.
fn pieces<'a>(tensors: &[TensorRef<'a>], start: usize, end: usize) -> Vec<Piece<'a>> {
    let mut at = 0;
    let mut out = Vec::new();
    for t in tensors {
        let (from, to) = (start.max(at), end.min(at + t.values.len()));
        if from < to {
            out.push(Piece {
                tensor: t.name,
                offset: from - at,
                values: &t.values[from - at..to - at],
            });
        }
        at += t.values.len();
    }
    out
}

fn scan_pieces(pieces: &[Piece<'_>], dtype: Dtype) -> Result<StatsAcc, Error> {
    let mut stats = StatsAcc::new(dtype);
    for piece in pieces {
        narrow::scan(dtype, piece.values, &mut stats).map_err(|problem| {
            value_error(piece.tensor, dtype, problem.after(piece.offset as u64))
        })?;
    }
    Ok(stats)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes `room` bytes and then fails, like a full disk.
    struct FillsUp {
        room: usize,
    }

    impl Write for FillsUp {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A write that fails part-way returns its error (the narrowing thread stops instead of
    /// waiting for buffers that never come back), and one that does not gives the CRC of the
    /// bytes written.
    #[test]
    fn a_failed_write_stops_the_pipeline_and_a_whole_one_has_the_payload_crc() {
        let values: Vec<f32> = (0..3 * STREAM_VALUES + 5)
            .map(|i| i as f32 * 1e-4)
            .collect();
        let dims = [values.len() as u64];
        let tensors = [TensorRef {
            name: "w",
            dims: &dims,
            values: &values,
        }];
        let meta = ExportMeta {
            source: "test.bin@step0".into(),
            step: 0,
            config: toml::Table::new(),
        };
        let plan = Plan::new(&meta, &tensors, Dtype::Bf16).unwrap();
        for room in [0, 10, STREAM_VALUES * 2 + 1, 5 * STREAM_VALUES] {
            let error = plan.write_payload(&mut FillsUp { room }).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::StorageFull, "room {room}");
        }
        let mut payload = Vec::new();
        let crc = plan.write_payload(&mut payload).unwrap();
        assert_eq!(payload.len(), values.len() * 2);
        assert_eq!(crc, crc32fast::hash(&payload));
    }

    /// A large export's scan runs as two halves on two threads: together they count every
    /// value once (the values narrowed to zero on both sides of the split, the extremes), as
    /// the one-thread scan of a small export does.
    #[test]
    fn a_large_export_is_scanned_in_halves_that_count_each_value_once() {
        // Above the size (2^20 values) from which the scan runs as two halves.
        let n = (1 << 20) + 1001;
        let mut first = vec![0.5f32; n / 3];
        let mut second = vec![0.25f32; n - n / 3];
        // 1e-30 is below f16's smallest subnormal: narrowed to zero, counted as flushed.
        for i in [0, 7, n / 3 - 1] {
            first[i] = 1e-30;
        }
        let half = n / 2 - n / 3;
        for i in [half - 1, half, half + 1, second.len() - 1] {
            second[i] = -1e-30;
        }
        second[half + 5] = -3.0;
        let (d1, d2) = ([first.len() as u64], [second.len() as u64]);
        let tensors = [
            TensorRef {
                name: "a",
                dims: &d1,
                values: &first,
            },
            TensorRef {
                name: "b",
                dims: &d2,
                values: &second,
            },
        ];
        let halves = scan_all(&tensors, Dtype::F16).unwrap().finish();
        assert_eq!(halves.flushed, 7);
        assert_eq!(halves.max_abs, 3.0);
        let whole = scan_pieces(&pieces(&tensors, 0, n), Dtype::F16)
            .unwrap()
            .finish();
        assert_eq!(
            (
                halves.flushed,
                halves.max_abs.to_bits(),
                halves.min_nonzero_abs.to_bits()
            ),
            (
                whole.flushed,
                whole.max_abs.to_bits(),
                whole.min_nonzero_abs.to_bits()
            )
        );
    }

    /// `pieces` cuts the concatenation of the tensors at `start` and `end`, each piece named
    /// by its tensor and placed by its offset in it.
    #[test]
    fn pieces_cut_the_concatenated_values_where_asked() {
        let values: Vec<f32> = (0..13).map(|i| i as f32).collect();
        let (a, b, c) = (&values[..4], &values[4..10], &values[10..]);
        let dims = [[4u64], [6], [3]];
        let tensors = [
            TensorRef {
                name: "a",
                dims: &dims[0],
                values: a,
            },
            TensorRef {
                name: "b",
                dims: &dims[1],
                values: b,
            },
            TensorRef {
                name: "c",
                dims: &dims[2],
                values: c,
            },
        ];
        let cut: Vec<(&str, usize, Vec<f32>)> = pieces(&tensors, 5, 12)
            .iter()
            .map(|p| (p.tensor, p.offset, p.values.to_vec()))
            .collect();
        assert_eq!(
            cut,
            [
                ("b", 1, vec![5.0, 6.0, 7.0, 8.0, 9.0]),
                ("c", 0, vec![10.0, 11.0])
            ]
        );
    }
}
