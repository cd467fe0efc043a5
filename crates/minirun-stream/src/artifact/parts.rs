//! Streamed parts: one matrix of a stack read on its own into reused aligned buffers
//! ([`LoadedPart`]), with the wall time reads kept storage busy.

use std::ops::Range;
use std::time::Duration;

use minirun_kernels::{Activations, QMatrix};
use minirun_store::{AlignedBuf, PayloadFile, ReadPath};

use super::bands::join_bands;
use super::part_layout::{MatrixPart, PartLayout, Piece};
use super::{Artifact, ArtifactError, invalid};

/// One streamed part's bytes: one buffer per read.
#[derive(Debug)]
pub struct LoadedPart {
    reads: Vec<AlignedBuf>,
    /// Which read and which range of it hold the packed, scale and bias bytes.
    packed: (usize, Range<usize>),
    scales: Option<(usize, Range<usize>)>,
    biases: Option<(usize, Range<usize>)>,
    /// How each read reached storage.
    pub paths: Vec<ReadPath>,
    /// The arithmetic of its matrices (the artifact's when it was read).
    activations: Activations,
}

impl LoadedPart {
    /// Reads of this part that bypassed the page cache (`O_DIRECT`), and reads that went
    /// through it.
    pub fn read_kinds(&self) -> (u64, u64) {
        let direct = self
            .paths
            .iter()
            .filter(|p| **p == ReadPath::Direct)
            .count() as u64;
        (direct, self.paths.len() as u64 - direct)
    }

    /// Bytes held in memory for this part.
    pub fn allocated(&self) -> usize {
        self.reads.iter().map(AlignedBuf::allocated).sum()
    }

    /// The matrix, computing from the loaded bytes.
    pub fn matrix(&self, part: &MatrixPart) -> Result<QMatrix<'_>, minirun_kernels::KernelError> {
        let slice = |r: &Option<(usize, Range<usize>)>| match r {
            Some((i, range)) => &self.reads[*i].as_slice()[range.clone()],
            None => &[][..],
        };
        let (i, packed) = &self.packed;
        QMatrix::new(
            part.format,
            part.rows,
            part.cols,
            &self.reads[*i].as_slice()[packed.clone()],
            slice(&self.scales),
            slice(&self.biases),
        )
        .map(|m| m.with_activations(self.activations))
    }
}

impl Artifact {
    /// Keeps up to `limit` bytes of dropped read buffers for the next read of the same length
    /// (a streamed run gives what its plan sets aside for reads in flight and for its cache).
    pub fn keep_read_buffers(&self, limit: u64) {
        self.read_buffers.set_limit(limit);
    }

    /// Bytes of read buffers kept now for the next reads.
    pub fn kept_read_buffer_bytes(&self) -> u64 {
        self.read_buffers.kept_bytes()
    }

    /// Makes up to `sets` sets of read buffers of `lengths` now, every page written, for reads
    /// to take later (within the limit [`Artifact::keep_read_buffers`] set); the bytes made.
    pub fn prepare_read_buffers(&self, lengths: &[usize], sets: usize) -> u64 {
        self.read_buffers.prefill(lengths, sets)
    }

    /// Wall time during which at least one streamed read ([`Artifact::load_part`]) was in
    /// flight, since the artifact was opened.
    pub fn read_busy(&self) -> Duration {
        self.read_clock.busy()
    }

    pub(super) fn timed_read(
        &self,
        handle: &PayloadFile,
        offset: u64,
        buf: &mut AlignedBuf,
    ) -> Result<ReadPath, ArtifactError> {
        let _timing = self.read_clock.start();
        Ok(handle.read_into(offset, buf)?)
    }

    /// Reads one part now (one read per contiguous range: one for a tile) into aligned buffers
    /// (reused ones where [`Artifact::keep_read_buffers`] allows), checking the tile's recorded
    /// SHA-256 unless the evidence is a full verification.
    pub fn load_part(&self, part: &PartLayout) -> Result<LoadedPart, ArtifactError> {
        match part {
            PartLayout::Tile {
                file,
                index,
                tile,
                packed,
                scales,
                biases,
            } => {
                let handle = self.handle(*file)?;
                let mut buf = self.read_buffers.buffer((tile.end - tile.start) as usize);
                let path = self.timed_read(handle, tile.start, &mut buf)?;
                if self.check_tile_digests
                    && let Some(c) = &self.payload[*file].container
                    && c.digests.is_some()
                {
                    c.verify_tile(*index, buf.as_slice())
                        .map_err(|e| invalid(&self.payload[*file].path, e.to_string()))?;
                }
                let range = |r: &Range<u64>| (0, r.start as usize..r.end as usize);
                Ok(LoadedPart {
                    reads: vec![buf],
                    packed: range(packed),
                    scales: Some(range(scales)),
                    biases: biases.as_ref().map(range),
                    paths: vec![path],
                    activations: self.activations,
                })
            }
            PartLayout::Bands {
                file,
                range,
                scales,
                ..
            } => {
                let handle = self.handle(*file)?;
                let mut read = self.read_buffers.buffer((range.end - range.start) as usize);
                let path = self.timed_read(handle, range.start, &mut read)?;
                let len = part.joined_len();
                let buf = join_bands(part, read, |len| self.read_buffers.buffer(len));
                let p = part.joined_packed_len();
                Ok(LoadedPart {
                    reads: vec![buf],
                    packed: (0, 0..p),
                    scales: (!scales.is_empty()).then_some((0, p..len)),
                    biases: None,
                    paths: vec![path],
                    activations: self.activations,
                })
            }
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => {
                let mut reads = Vec::new();
                let mut paths = Vec::new();
                let mut read = |p: &Piece| -> Result<(usize, Range<usize>), ArtifactError> {
                    let handle = self.handle(p.file)?;
                    let mut buf = self.read_buffers.buffer(p.len as usize);
                    paths.push(self.timed_read(handle, p.offset, &mut buf)?);
                    reads.push(buf);
                    Ok((reads.len() - 1, 0..p.len as usize))
                };
                let packed = read(packed)?;
                let scales = scales.as_ref().map(&mut read).transpose()?;
                let biases = biases.as_ref().map(&mut read).transpose()?;
                Ok(LoadedPart {
                    reads,
                    packed,
                    scales,
                    biases,
                    paths,
                    activations: self.activations,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::bands::{join_bands_in_place, join_bands_into};
    use crate::artifact::part_layout::{PartLayout, Piece};

    const SLACK: u64 = minirun_store::SLOT_ALIGN as u64;

    fn piece(len: u64) -> Piece {
        Piece {
            tensor: "w".into(),
            file: 0,
            offset: 0,
            start: 0,
            len,
        }
    }

    /// A cache counts what a loaded part keeps; loading it may take more at once (a banded
    /// part's scales set aside, or its read beside its joined copy).
    #[test]
    fn a_loaded_part_keeps_its_buffers_and_a_banded_one_its_joined_bytes() {
        let tile = PartLayout::Tile {
            file: 0,
            index: 0,
            tile: 16384..49152,
            packed: 0..30000,
            scales: 30000..32000,
            biases: None,
        };
        assert_eq!(tile.held_lengths(), vec![32768]);
        assert_eq!(tile.held_bytes(), 32768 + SLACK);
        assert_eq!(tile.held_bytes(), tile.allocated_bytes());

        let pieces = PartLayout::Pieces {
            packed: piece(1000),
            scales: Some(piece(100)),
            biases: None,
        };
        assert_eq!(pieces.held_lengths(), vec![1000, 100]);
        assert_eq!(pieces.held_bytes(), 1100 + 2 * SLACK);
        assert_eq!(pieces.held_bytes(), pieces.allocated_bytes());

        // Two bands of 3,000 packed bytes and 100 of scales each, with padding between them.
        let bands = PartLayout::Bands {
            file: 0,
            range: 0..16384,
            packed: vec![0..3000, 8192..11192],
            scales: vec![4096..4196, 12288..12388],
        };
        assert!(bands.joins_in_place());
        assert_eq!(bands.held_lengths(), vec![16384]);
        assert_eq!(bands.held_bytes(), 16384 + SLACK);
        assert_eq!(bands.allocated_bytes(), 16384 + SLACK + 200);

        // The same bands listed out of file order: joined into a copy.
        let unordered = PartLayout::Bands {
            file: 0,
            range: 0..16384,
            packed: vec![8192..11192, 0..3000],
            scales: vec![12288..12388, 4096..4196],
        };
        assert!(!unordered.joins_in_place());
        assert_eq!(unordered.held_lengths(), vec![6200]);
        assert_eq!(unordered.held_bytes(), 6200 + SLACK);
        assert_eq!(unordered.allocated_bytes(), 2 * (16384 + SLACK));
    }

    /// Bands joined inside their read are the bytes a separate copy joins, whether the packed
    /// bands are far apart, touching, or touch their scales.
    #[test]
    // A list of one band is a layout, not a range of numbers meant as a list.
    #[allow(clippy::single_range_in_vec_init)]
    fn bands_joined_in_place_are_the_bytes_joined_into_a_copy() {
        let layouts = [
            (vec![0..3000, 8192..11192], vec![4096..4196, 12288..12388]),
            (vec![0..3000, 3000..6000], vec![6000..6100, 6100..6200]),
            (vec![100..3100, 3200..6200], vec![3100..3200, 0..100]),
            (vec![0..0, 5..4005], vec![4005..4100]),
        ];
        for (packed, scales) in layouts {
            let part = PartLayout::Bands {
                file: 0,
                range: 1000..1000 + 16384,
                packed,
                scales,
            };
            assert!(part.joins_in_place(), "{part:?}");
            let read: Vec<u8> = (0..16384u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            let mut copy = vec![0u8; part.joined_len()];
            join_bands_into(&part, &read, &mut copy);
            let mut in_place = read.clone();
            join_bands_in_place(&part, &mut in_place);
            assert_eq!(&in_place[..copy.len()], &copy[..], "{part:?}");
        }
    }

    /// A layout whose bands overlap, or lie past the read, is never joined in place (where a
    /// move could land on bytes not yet moved, or out of the buffer).
    #[test]
    // A list of one band is a layout, not a range of numbers meant as a list.
    #[allow(clippy::single_range_in_vec_init)]
    fn overlapping_or_outlying_bands_are_not_joined_in_place() {
        let bands = |packed: &[Range<u64>], scales: &[Range<u64>]| PartLayout::Bands {
            file: 0,
            range: 0..8192,
            packed: packed.to_vec(),
            scales: scales.to_vec(),
        };
        assert!(!bands(&[0..3000, 2000..5000], &[]).joins_in_place());
        assert!(!bands(&[0..3000, 4000..9000], &[]).joins_in_place());
        assert!(!bands(&[0..3000], &[8000..8200]).joins_in_place());
        // Scales overlapping the packed bytes would join to more than the read holds.
        assert!(!bands(&[0..6000], &[0..6000]).joins_in_place());
        assert!(bands(&[0..3000, 4000..8192], &[3000..3100]).joins_in_place());
    }
}
