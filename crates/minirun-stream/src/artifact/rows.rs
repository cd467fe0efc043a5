//! A matrix read by rows: the bytes of rows `a..b` of a one-matrix stack, read from storage
//! without the rest of it (an embedding's rows for a step's tokens, a head's rows a tile at a
//! time). Every encoding stores its rows one after another in each of its byte streams
//! ([`minirun_kernels::RowBytes`]), so rows `a..b` are one byte range of each stream: one
//! positioned read each (a banded part's range may cross bands: one read per band it touches).

use std::ops::Range;

use minirun_kernels::{Activations, QMatrix, RowBytes};
use minirun_store::{AlignedBuf, ReadPath};

use super::part_layout::{MatrixPart, PartLayout};
use super::{Artifact, ArtifactError};

/// Reads at least this long are widened to whole 4 KiB blocks, so that they can bypass the page
/// cache; shorter ones (an embedding row) are read as they are.
const WIDENED_READ: u64 = 1 << 20;
const DIRECT_BLOCK: u64 = 4096;

/// Which of a part's byte streams.
#[derive(Clone, Copy)]
enum Stream {
    Packed,
    Scales,
    Biases,
}

/// Rows of a matrix, read: one buffer per stream, each holding exactly its bytes of the rows.
#[derive(Debug)]
pub struct LoadedRows {
    /// Per stream (packed, scales, biases): the buffer and where in it the rows' bytes are.
    streams: [Option<(AlignedBuf, Range<usize>)>; 3],
    part: MatrixPart,
    rows: Range<usize>,
    activations: Activations,
    /// Bytes these rows moved from storage, and how each read reached it.
    pub read_bytes: u64,
    pub paths: Vec<ReadPath>,
}

impl LoadedRows {
    /// The rows read, as a matrix of their own (`rows.len()` rows).
    pub fn matrix(&self) -> Result<QMatrix<'_>, minirun_kernels::KernelError> {
        fn slice(s: &Option<(AlignedBuf, Range<usize>)>) -> &[u8] {
            match s {
                Some((buf, range)) => &buf.as_slice()[range.clone()],
                None => &[],
            }
        }
        let [packed, scales, biases] = &self.streams;
        QMatrix::new(
            self.part.format,
            self.rows.len(),
            self.part.cols,
            slice(packed),
            slice(scales),
            slice(biases),
        )
        .map(|m| m.with_activations(self.activations))
    }

    /// Which rows of the stored matrix these are.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }
}

/// The byte range of each stream that holds rows `rows`, or why they are not a matrix of their
/// own (a range that splits a band of rows sharing scales).
fn stream_ranges(geometry: RowBytes, rows: &Range<usize>) -> Result<[Range<u64>; 3], &'static str> {
    let band = geometry.band_rows;
    if rows.start >= rows.end {
        return Err("is an empty row range");
    }
    let one_band = rows.start / band == (rows.end - 1) / band;
    if !rows.start.is_multiple_of(band) && !one_band {
        return Err("starts inside a band of rows that share their scales");
    }
    let bands = (rows.start / band) as u64..rows.end.div_ceil(band) as u64;
    let times = |per: usize, r: &Range<u64>| r.start * per as u64..r.end * per as u64;
    let rows64 = rows.start as u64..rows.end as u64;
    Ok([
        times(geometry.packed, &rows64),
        times(geometry.scales, &bands),
        times(geometry.biases, &bands),
    ])
}

/// The file and the file ranges, in order, holding bytes `want` of `stream` of `part`; `None`
/// where the part has no such stream or `want` lies past it.
fn file_ranges(
    part: &PartLayout,
    stream: Stream,
    want: &Range<u64>,
) -> Option<(usize, Vec<Range<u64>>)> {
    let within = |base: u64, len: u64| {
        (want.end <= len).then(|| std::iter::once(base + want.start..base + want.end).collect())
    };
    match part {
        PartLayout::Tile {
            file,
            tile,
            packed,
            scales,
            biases,
            ..
        } => {
            let r = match stream {
                Stream::Packed => Some(packed),
                Stream::Scales => Some(scales),
                Stream::Biases => biases.as_ref(),
            }?;
            Some((*file, within(tile.start + r.start, r.end - r.start)?))
        }
        PartLayout::Pieces {
            packed,
            scales,
            biases,
        } => {
            let p = match stream {
                Stream::Packed => Some(packed),
                Stream::Scales => scales.as_ref(),
                Stream::Biases => biases.as_ref(),
            }?;
            Some((p.file, within(p.offset, p.len)?))
        }
        PartLayout::Bands {
            file,
            range,
            packed,
            scales,
        } => {
            let bands = match stream {
                Stream::Packed => packed,
                Stream::Scales => scales,
                Stream::Biases => return None,
            };
            Some((*file, through_bands(range.start, bands, want)?))
        }
    }
}

/// The file ranges holding bytes `want` of the stream that is `bands` (relative to `base`)
/// joined in order.
fn through_bands(base: u64, bands: &[Range<u64>], want: &Range<u64>) -> Option<Vec<Range<u64>>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for band in bands {
        let len = band.end.checked_sub(band.start)?;
        let (lo, hi) = (want.start.max(at), want.end.min(at + len));
        if lo < hi {
            let start = base + band.start + (lo - at);
            out.push(start..start + (hi - lo));
        }
        at += len;
    }
    (want.end <= at).then_some(out)
}

impl Artifact {
    /// Whether rows of `part` may be read without the rest of it: a tile whose recorded digest
    /// this run must check on every read cannot be (a digest covers the whole tile); a blob
    /// member, a banded part and a tile the evidence vouches for can.
    pub fn reads_rows_of(&self, part: &PartLayout) -> bool {
        match part {
            PartLayout::Tile { file, .. } => {
                !self.check_tile_digests
                    || self.payload[*file]
                        .container
                        .as_ref()
                        .is_none_or(|c| c.digests.is_none())
            }
            PartLayout::Pieces { .. } | PartLayout::Bands { .. } => true,
        }
    }

    /// Bytes reading rows `rows` of `part` moves from storage (what a step counts, and the
    /// plan a token); 0 where they cannot be read as a matrix of their own.
    pub fn rows_read_bytes(&self, part: &MatrixPart, rows: Range<usize>) -> u64 {
        self.row_reads(part, &rows).map_or(0, |reads| {
            reads
                .iter()
                .flat_map(|r| &r.pieces)
                .map(|(read, _)| read.end - read.start)
                .sum()
        })
    }

    /// The reads that fetch rows `rows` of `part`: per stream, the file and each piece's read
    /// (widened to whole 4 KiB blocks where it is long and the file has them, so that it can
    /// bypass the page cache) with the piece's bytes inside it.
    fn row_reads(&self, part: &MatrixPart, rows: &Range<usize>) -> Result<Vec<StreamRead>, String> {
        if rows.end > part.rows {
            return Err(format!(
                "has {} rows; rows {}..{} were asked for",
                part.rows, rows.start, rows.end
            ));
        }
        let ranges = stream_ranges(part.format.row_bytes(part.cols), rows)
            .map_err(|why| format!("rows {}..{} {why}", rows.start, rows.end))?;
        let streams = [Stream::Packed, Stream::Scales, Stream::Biases];
        let mut reads = Vec::new();
        for (index, (stream, want)) in streams.into_iter().zip(ranges).enumerate() {
            if want.is_empty() {
                continue;
            }
            let (file, pieces) = file_ranges(&part.part, stream, &want)
                .ok_or("does not store the bytes its format gives its rows")?;
            let file_len = self.payload_file_bytes(file);
            let pieces = pieces
                .into_iter()
                .map(|piece| {
                    let read = widened(&piece, file_len);
                    let inside =
                        (piece.start - read.start) as usize..(piece.end - read.start) as usize;
                    (read, inside)
                })
                .collect();
            reads.push(StreamRead {
                index,
                file,
                pieces,
            });
        }
        Ok(reads)
    }

    /// Rows `rows` of the one matrix `part`, read now: one positioned read per stream (per band
    /// touched, for a banded part), into buffers from the artifact's pool.
    pub fn read_rows(
        &self,
        part: &MatrixPart,
        rows: Range<usize>,
    ) -> Result<LoadedRows, ArtifactError> {
        let refuse = |reason: String| ArtifactError::Tensor {
            name: part.tensor.to_string(),
            reason,
        };
        if !self.reads_rows_of(&part.part) {
            return Err(refuse(
                "is a tile whose digest this run checks on every read, and a digest covers the whole tile: verify the artifact (`minirun verify`) to read it by rows".into(),
            ));
        }
        let reads = self.row_reads(part, &rows).map_err(refuse)?;
        let mut loaded = LoadedRows {
            streams: [None, None, None],
            part: part.clone(),
            rows,
            activations: self.activations,
            read_bytes: 0,
            paths: Vec::new(),
        };
        for read in &reads {
            loaded.streams[read.index] = Some(self.read_pieces(read, &mut loaded)?);
        }
        Ok(loaded)
    }

    /// A stream's pieces read and joined in order: the buffer and where in it they are.
    fn read_pieces(
        &self,
        read: &StreamRead,
        loaded: &mut LoadedRows,
    ) -> Result<(AlignedBuf, Range<usize>), ArtifactError> {
        let handle = self.handle(read.file)?;
        let mut bufs = Vec::with_capacity(read.pieces.len());
        for (range, inside) in &read.pieces {
            let mut buf = self.read_buffers.buffer((range.end - range.start) as usize);
            loaded
                .paths
                .push(self.timed_read(handle, range.start, &mut buf)?);
            loaded.read_bytes += range.end - range.start;
            bufs.push((buf, inside.clone()));
        }
        if bufs.len() == 1
            && let Some(one) = bufs.pop()
        {
            return Ok(one);
        }
        let len = bufs.iter().map(|(_, inside)| inside.len()).sum();
        let mut joined = self.read_buffers.buffer(len);
        let mut at = 0;
        for (buf, inside) in &bufs {
            let bytes = &buf.as_slice()[inside.clone()];
            joined.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        }
        Ok((joined, 0..len))
    }
}

/// The reads of one stream of a run of rows.
struct StreamRead {
    /// Which stream (packed, scales, biases).
    index: usize,
    file: usize,
    /// Each read's file range, and the stream's bytes inside it.
    pieces: Vec<(Range<u64>, Range<usize>)>,
}

/// `piece` widened to whole 4 KiB blocks where it is long and the file (`file_len` bytes) has
/// them; else itself.
fn widened(piece: &Range<u64>, file_len: u64) -> Range<u64> {
    let start = piece.start / DIRECT_BLOCK * DIRECT_BLOCK;
    let end = piece.end.div_ceil(DIRECT_BLOCK) * DIRECT_BLOCK;
    match piece.end - piece.start >= WIDENED_READ && end <= file_len {
        true => start..end,
        false => piece.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minirun_kernels::{BlockScale, FloatType, Format};

    fn fp8() -> RowBytes {
        Format::Fp8Block {
            block_rows: 128,
            block_cols: 128,
            scale: BlockScale::Float(FloatType::F32),
        }
        .row_bytes(256)
    }

    #[test]
    fn rows_are_one_range_of_each_stream() {
        let affine = Format::Affine {
            bits: 4,
            group: 64,
            scale: FloatType::BF16,
        }
        .row_bytes(256);
        // 128 packed bytes a row, 4 groups of 2-byte scales and biases.
        assert_eq!(
            stream_ranges(affine, &(3..5)).unwrap(),
            [384..640, 24..40, 24..40]
        );
        // FP8: rows 128..300 are block rows 1 and 2 (the last one partial).
        assert_eq!(
            stream_ranges(fp8(), &(128..300)).unwrap(),
            [32768..76800, 8..24, 0..0]
        );
    }

    #[test]
    fn a_range_that_splits_a_band_sharing_scales_is_refused_but_one_row_is_not() {
        assert!(stream_ranges(fp8(), &(64..200)).is_err());
        assert_eq!(stream_ranges(fp8(), &(130..131)).unwrap()[1], 8..16);
        assert!(stream_ranges(fp8(), &(5..5)).is_err());
    }

    #[test]
    fn a_range_through_bands_is_cut_at_each_band() {
        // Two bands of 10 bytes at 100 and 200 of the part's read, which starts at 1000.
        let bands = [100..110, 200..210];
        assert_eq!(
            through_bands(1000, &bands, &(5..15)).unwrap(),
            vec![1105..1110, 1200..1205]
        );
        assert_eq!(
            through_bands(1000, &bands, &(12..14)).unwrap(),
            vec![1202..1204]
        );
        assert!(through_bands(1000, &bands, &(15..21)).is_none());
    }

    #[test]
    fn a_long_read_is_widened_to_whole_blocks_inside_the_file() {
        let mib = 1 << 20;
        assert_eq!(widened(&(100..100 + mib), 1 << 30), 0..mib + 4096);
        // Short, or past the file's end once widened: read as it is.
        assert_eq!(widened(&(100..200), 1 << 30), 100..200);
        assert_eq!(widened(&(100..100 + mib), 100 + mib), 100..100 + mib);
    }
}
