//! The tables outside the layers, the token embedding and the output head: held for the run,
//! or read from storage by rows when the plan does not hold them. A step needs one embedding
//! row per token, read as one positioned read each; the head's rows are independent outputs,
//! read a tile of rows at a time (the next tile read while the current one computes), each
//! tile a matrix of its own whose rows compute the bits they compute in the whole head
//! ([`minirun_kernels::QMatrix::matvec_rows`]).

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Instant;

use crate::artifact::{Artifact, ArtifactError, LoadedRows, MatrixPart, StackLayout};
use crate::step::StepStats;
use minirun_kernels::QMatrix;

/// Bytes a head tile takes unless the plan says otherwise: large enough that a read runs near
/// the device's rate, small enough that two of them (the one computing and the next, read
/// ahead) are a small part of any floor.
pub const TABLE_TILE_BYTES: u64 = 8 << 20;

/// Which tables a run reads from storage, and how.
#[derive(Debug, Clone, Default)]
pub struct StoredTables {
    /// The tables' tensor names (`model.embed_tokens.weight`).
    pub names: BTreeSet<String>,
    /// Bytes of one tile of a head's rows.
    pub tile_bytes: u64,
    /// Whether the next tile is read while the current one computes.
    pub read_ahead: bool,
}

/// What a model computes with a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TableUse {
    /// One row per token, before the first layer.
    Embedding,
    /// Every row, for each token's logits.
    Head,
    /// Both: a head tied to the embedding.
    EmbeddingAndHead,
}

/// A table a dry build asked for, and what the model computes with it.
#[derive(Debug, Clone)]
pub struct RecordedTable {
    pub layout: StackLayout,
    pub used_as: TableUse,
}

/// What a table costs held and what it costs left on storage: the planner's terms for it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableTerms {
    /// The tensor's name (`lm_head.weight`).
    pub name: String,
    pub used_as: TableUse,
    /// Bytes it takes held (as stored).
    pub resident_bytes: u64,
    /// Bytes a decode step reads of it from storage where it is not held: one row for the
    /// embedding, every row for the head.
    pub read_per_token: u64,
    /// Buffers reading it takes: a row's for the embedding (rows are read one at a time and
    /// made f32 at once), two tiles' for the head (the one computing and the next, read ahead).
    pub pool_bytes: u64,
    /// Whether it can be read by rows at all (see [`Artifact::reads_rows_of`]); one that cannot
    /// is always held.
    pub by_rows: bool,
    /// Whether the plan leaves it on storage.
    pub stored: bool,
}

impl TableTerms {
    /// The plan's terms for `table`, its head read in tiles of about `tile_bytes`.
    pub fn of(artifact: &Artifact, table: &RecordedTable, tile_bytes: u64) -> TableTerms {
        let layout = &table.layout;
        let resident_bytes = crate::layer_stream::resident_bytes(artifact, layout.parts.iter());
        let name = layout.name.clone();
        let (part, [part_layout]) = (layout.matrix_part(0), layout.parts.as_slice()) else {
            return TableTerms::held_only(name, table.used_as, resident_bytes);
        };
        let Some(part) = part.filter(|_| artifact.reads_rows_of(part_layout)) else {
            return TableTerms::held_only(name, table.used_as, resident_bytes);
        };
        let row = artifact.rows_read_bytes(&part, 0..1);
        let tile = tile_rows(&part, tile_bytes);
        let head_tiles: Vec<Range<usize>> = tiles(part.rows, tile).collect();
        let head_read: u64 = head_tiles
            .iter()
            .map(|rows| artifact.rows_read_bytes(&part, rows.clone()))
            .sum();
        let buffers = |rows: Range<usize>| {
            let joins = u64::from(matches!(
                part.part,
                crate::artifact::PartLayout::Bands { .. }
            ));
            (1 + joins) * artifact.rows_read_bytes(&part, rows) + 3 * READ_SLACK
        };
        // Two tiles in flight (the one computing and the next), one where a tile is the table.
        let in_flight = head_tiles.len().min(2) as u64;
        let (read_per_token, pool_bytes) = match table.used_as {
            TableUse::Embedding => (row, buffers(0..1)),
            TableUse::Head => (head_read, in_flight * buffers(0..tile)),
            TableUse::EmbeddingAndHead => (head_read + row, in_flight * buffers(0..tile)),
        };
        TableTerms {
            name,
            used_as: table.used_as,
            resident_bytes,
            read_per_token,
            pool_bytes,
            by_rows: true,
            stored: false,
        }
    }

    fn held_only(name: String, used_as: TableUse, resident_bytes: u64) -> TableTerms {
        TableTerms {
            name,
            used_as,
            resident_bytes,
            read_per_token: 0,
            pool_bytes: 0,
            by_rows: false,
            stored: false,
        }
    }

    /// What it takes of the floor: its buffers where streaming it takes less, else its bytes.
    pub fn floor_bytes(&self) -> u64 {
        match self.stored_at_floor() {
            true => self.pool_bytes,
            false => self.resident_bytes,
        }
    }

    /// Whether streaming it takes less than holding it (what the floor does).
    pub fn stored_at_floor(&self) -> bool {
        self.by_rows && self.pool_bytes < self.resident_bytes
    }
}

/// What one read buffer may take beyond its bytes: the buffer's alignment, and a long read's
/// widening to whole 4 KiB blocks at both ends.
const READ_SLACK: u64 = minirun_store::SLOT_ALIGN as u64 + 2 * 4096;

/// A table as the model computes from it.
#[derive(Clone)]
pub enum Table<'w> {
    /// Read once and held.
    Held(QMatrix<'w>),
    /// Read by rows when a step needs them.
    Stored(StoredTable<'w>),
    /// A dry build's: recorded, never read.
    Recorded { rows: usize, cols: usize },
}

impl Table<'_> {
    pub fn rows(&self) -> usize {
        match self {
            Table::Held(m) => m.rows(),
            Table::Stored(t) => t.part.rows,
            Table::Recorded { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Table::Held(m) => m.cols(),
            Table::Stored(t) => t.part.cols,
            Table::Recorded { cols, .. } => *cols,
        }
    }
}

/// A table on storage: where its one matrix is, and the rows of a tile.
#[derive(Clone)]
pub struct StoredTable<'w> {
    artifact: &'w Artifact,
    part: MatrixPart,
    tile_rows: usize,
    read_ahead: bool,
}

/// Rows a tile of `part` of about `tile_bytes` holds: whole bands of rows sharing scales, at
/// least one band.
pub fn tile_rows(part: &MatrixPart, tile_bytes: u64) -> usize {
    let g = part.format.row_bytes(part.cols);
    let band = g.band_rows.max(1);
    let band_bytes = (g.packed * band + g.scales + g.biases).max(1) as u64;
    let bands = (tile_bytes / band_bytes).max(1) as usize;
    (bands * band).min(part.rows.max(1))
}

/// The row ranges of the tiles of a table of `rows` rows, `tile_rows` each (the last one
/// shorter), in order.
pub fn tiles(rows: usize, tile_rows: usize) -> impl Iterator<Item = Range<usize>> {
    let step = tile_rows.max(1);
    (0..rows)
        .step_by(step)
        .map(move |start| start..(start + step).min(rows))
}

impl<'w> StoredTable<'w> {
    /// The one matrix of `layout`, read by rows, tiles of about `tile_bytes`.
    pub fn new(
        artifact: &'w Artifact,
        layout: &StackLayout,
        (tile_bytes, read_ahead): (u64, bool),
    ) -> Result<StoredTable<'w>, ArtifactError> {
        let part = match layout.matrix_parts().as_slice() {
            [part] => part.clone(),
            parts => {
                return Err(ArtifactError::Tensor {
                    name: layout.name.clone(),
                    reason: format!("is a stack of {} matrices, not one table", parts.len()),
                });
            }
        };
        if !artifact.reads_rows_of(&part.part) {
            return Err(ArtifactError::Tensor {
                name: layout.name.clone(),
                reason: "is a tile whose digest this run checks on every read: it cannot be read by rows, and the plan should have held it".into(),
            });
        }
        Ok(StoredTable {
            artifact,
            tile_rows: tile_rows(&part, tile_bytes),
            part,
            read_ahead,
        })
    }

    /// Row `row`, read now (one positioned read per stream).
    pub fn read_row(&self, row: usize, stats: &mut StepStats) -> Result<LoadedRows, ArtifactError> {
        let started = Instant::now();
        let loaded = self.artifact.read_rows(&self.part, row..row + 1)?;
        count(&loaded, started, stats);
        Ok(loaded)
    }

    /// Every tile of rows in order through `compute` (handed the tile's rows, read), the next
    /// tile read while the current one computes where the plan reads ahead.
    pub fn each_tile<E: From<ArtifactError>>(
        &self,
        stats: &mut StepStats,
        mut compute: impl FnMut(&LoadedRows, &mut StepStats) -> Result<(), E>,
    ) -> Result<(), E> {
        let read = |rows: Range<usize>| self.artifact.read_rows(&self.part, rows);
        let mut tiles = tiles(self.part.rows, self.tile_rows);
        if !self.read_ahead {
            for rows in tiles {
                let started = Instant::now();
                let loaded = read(rows)?;
                count(&loaded, started, stats);
                compute(&loaded, stats)?;
            }
            return Ok(());
        }
        std::thread::scope(|scope| {
            let mut ahead = tiles.next().map(|rows| scope.spawn(move || read(rows)));
            while let Some(reading) = ahead.take() {
                let started = Instant::now();
                let loaded = reading.join().unwrap_or_else(|_| {
                    Err(ArtifactError::Tensor {
                        name: self.part.tensor.to_string(),
                        reason: "a tile's read thread panicked".into(),
                    })
                })?;
                count(&loaded, started, stats);
                ahead = tiles.next().map(|rows| scope.spawn(move || read(rows)));
                compute(&loaded, stats)?;
            }
            Ok(())
        })
    }
}

/// A read's figures in the step's: its bytes, its reads, the time the step waited for it.
fn count(loaded: &LoadedRows, started: Instant, stats: &mut StepStats) {
    stats.io_time += started.elapsed();
    stats.table_read_bytes += loaded.read_bytes;
    for path in &loaded.paths {
        match path {
            minirun_store::ReadPath::Direct => stats.direct_reads += 1,
            minirun_store::ReadPath::BufferedDontNeed => stats.buffered_reads += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::{PartLayout, Piece};
    use minirun_kernels::{BlockScale, FloatType, Format};

    fn part(format: Format, rows: usize, cols: usize) -> MatrixPart {
        let piece = Piece {
            tensor: "t".into(),
            file: 0,
            offset: 0,
            start: 0,
            len: 0,
        };
        MatrixPart {
            tensor: "t".into(),
            format,
            rows,
            cols,
            part: PartLayout::Pieces {
                packed: piece,
                scales: None,
                biases: None,
            },
        }
    }

    #[test]
    fn a_tile_is_whole_bands_of_about_its_bytes() {
        let bf16 = part(Format::Dense(FloatType::BF16), 1000, 512);
        // 1 KiB a row: 8 KiB is 8 rows; the whole table when it is smaller.
        assert_eq!(tile_rows(&bf16, 8 << 10), 8);
        assert_eq!(tile_rows(&bf16, 1 << 30), 1000);
        assert_eq!(tile_rows(&bf16, 1), 1);
        let fp8 = Format::Fp8Block {
            block_rows: 128,
            block_cols: 128,
            scale: BlockScale::E8m0,
        };
        // A band of 128 rows of 512 bytes and 4 scale bytes: 64 KiB + 4 B, so 200 KiB holds 3.
        assert_eq!(tile_rows(&part(fp8, 4096, 512), 200 << 10), 384);
        assert_eq!(tile_rows(&part(fp8, 4096, 512), 1), 128);
    }

    #[test]
    fn tiles_cover_every_row_once_in_order() {
        assert_eq!(tiles(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(tiles(8, 4).collect::<Vec<_>>(), vec![0..4, 4..8]);
        assert_eq!(tiles(3, 0).collect::<Vec<_>>(), vec![0..1, 1..2, 2..3]);
    }
}
