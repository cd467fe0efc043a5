//! Where a stored matrix's bytes are, without its bytes: a part of a stack ([`PartLayout`]: a
//! container's tile, slices of blob members, or row bands), a stack's parts ([`StackLayout`]),
//! and one matrix with its format and shape ([`MatrixPart`]). What the planner sizes and a
//! streamed read reads.

use std::ops::Range;

use minirun_kernels::Format;

/// A byte range of a blob member.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The member's source tensor name.
    pub tensor: String,
    pub file: usize,
    /// The piece's first byte in the file.
    pub offset: u64,
    /// The piece's first byte in the member.
    pub start: u64,
    pub len: u64,
}

/// Where one matrix of a stack is stored, without its bytes.
#[derive(Debug, Clone)]
pub enum PartLayout {
    /// Tile `index` of a container: one read of `tile` (file offsets) holds the packed, scale and
    /// bias bytes at the given offsets relative to the tile's start.
    Tile {
        file: usize,
        index: u64,
        tile: Range<u64>,
        packed: Range<u64>,
        scales: Range<u64>,
        biases: Option<Range<u64>>,
    },
    /// Slices of blob members, one read each.
    Pieces {
        packed: Piece,
        scales: Option<Piece>,
        biases: Option<Piece>,
    },
    /// Row bands: one read of `range` (file offsets); the packed bytes are the `packed` ranges
    /// joined in order, the scales the `scales` ranges (none for a float tensor), each relative
    /// to the range's start. Joined into one buffer after the read.
    Bands {
        file: usize,
        range: Range<u64>,
        packed: Vec<Range<u64>>,
        scales: Vec<Range<u64>>,
    },
}

impl PartLayout {
    /// Bytes this part takes read into aligned buffers: each read's buffer may cost up to one
    /// alignment unit more than its bytes.
    pub fn allocated_bytes(&self) -> u64 {
        let reads = match self {
            PartLayout::Tile { .. } => 1,
            PartLayout::Pieces { scales, biases, .. } => {
                1 + u64::from(scales.is_some()) + u64::from(biases.is_some())
            }
            // Joined inside the read: the read, and its scales set aside while the packed
            // bands move.
            PartLayout::Bands { .. } if self.joins_in_place() => {
                let scales = self.byte_lengths()[1] as u64;
                return self.read_bytes() + minirun_store::SLOT_ALIGN as u64 + scales;
            }
            // The read and the joined copy are both held while the bands are joined.
            PartLayout::Bands { .. } => {
                return 2 * (self.read_bytes() + minirun_store::SLOT_ALIGN as u64);
            }
        };
        self.read_bytes() + reads * minirun_store::SLOT_ALIGN as u64
    }

    /// The lengths of the buffers a loaded copy of this part keeps (a banded part keeps its
    /// read, joined inside it, or else the joined copy, the read given back).
    pub fn held_lengths(&self) -> Vec<usize> {
        match self {
            PartLayout::Tile { tile, .. } => vec![(tile.end - tile.start) as usize],
            PartLayout::Bands { .. } if self.joins_in_place() => vec![self.read_bytes() as usize],
            PartLayout::Bands { .. } => vec![self.joined_len()],
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => [Some(packed), scales.as_ref(), biases.as_ref()]
                .into_iter()
                .flatten()
                .map(|p| p.len as usize)
                .collect(),
        }
    }

    /// Bytes a loaded copy of this part keeps in memory, alignment slack included.
    pub fn held_bytes(&self) -> u64 {
        let slack = minirun_store::SLOT_ALIGN;
        self.held_lengths()
            .iter()
            .map(|&len| (len + slack) as u64)
            .sum()
    }

    /// Bytes of its packed elements, its scales and its biases, as a matrix computes from
    /// them (a banded part's joined).
    pub fn byte_lengths(&self) -> [usize; 3] {
        let len = |r: &Range<u64>| (r.end - r.start) as usize;
        let piece = |p: &Option<Piece>| p.as_ref().map_or(0, |p| p.len as usize);
        match self {
            PartLayout::Tile {
                packed,
                scales,
                biases,
                ..
            } => [len(packed), len(scales), biases.as_ref().map_or(0, len)],
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => [packed.len as usize, piece(scales), piece(biases)],
            PartLayout::Bands { packed, scales, .. } => [
                packed.iter().map(len).sum(),
                scales.iter().map(len).sum(),
                0,
            ],
        }
    }

    /// Whether a banded part's bands can be joined inside its read instead of into a copy as
    /// large: its packed bands ascend without overlapping and every band lies in the read, so
    /// each packed band moves toward the start and never onto one not yet moved (the scales,
    /// a few percent of the bytes, are set aside first). A copy would double the memory of
    /// reading a layer whose matrices are all banded, as Kimi K3's are.
    pub fn joins_in_place(&self) -> bool {
        let PartLayout::Bands {
            range,
            packed,
            scales,
            ..
        } = self
        else {
            return false;
        };
        let len = range.end.saturating_sub(range.start);
        let ascending = packed.windows(2).all(|w| w[0].end <= w[1].start);
        let inside = packed
            .iter()
            .chain(scales)
            .all(|r| r.start <= r.end && r.end <= len);
        ascending && inside && self.joined_len() as u64 <= len
    }

    /// Bytes a read of this part moves from storage.
    pub fn read_bytes(&self) -> u64 {
        match self {
            PartLayout::Tile { tile, .. } => tile.end - tile.start,
            PartLayout::Bands { range, .. } => range.end - range.start,
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => {
                packed.len
                    + scales.as_ref().map_or(0, |p| p.len)
                    + biases.as_ref().map_or(0, |p| p.len)
            }
        }
    }

    /// The length of a banded part's joined bytes (0 for another part).
    pub fn joined_len(&self) -> usize {
        match self {
            PartLayout::Bands { packed, scales, .. } => packed
                .iter()
                .chain(scales)
                .map(|r| (r.end - r.start) as usize)
                .sum(),
            _ => 0,
        }
    }

    /// Where a banded part's scales start in its joined bytes (0 for another part).
    pub fn joined_packed_len(&self) -> usize {
        match self {
            PartLayout::Bands { packed, .. } => {
                packed.iter().map(|r| (r.end - r.start) as usize).sum()
            }
            _ => 0,
        }
    }
}

/// A stack's format, shape and where each of its matrices is.
#[derive(Debug, Clone)]
pub struct StackLayout {
    pub name: String,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<PartLayout>,
}

impl StackLayout {
    /// Matrix `i` of the stack, as a part that can be read on its own.
    pub fn matrix_part(&self, i: usize) -> Option<MatrixPart> {
        Some(MatrixPart {
            tensor: self.name.as_str().into(),
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            part: self.parts.get(i)?.clone(),
        })
    }

    /// Every matrix of the stack, as parts that can be read on their own.
    pub fn matrix_parts(&self) -> Vec<MatrixPart> {
        let tensor: std::sync::Arc<str> = self.name.as_str().into();
        self.parts
            .iter()
            .map(|part| MatrixPart {
                tensor: std::sync::Arc::clone(&tensor),
                format: self.format,
                rows: self.rows,
                cols: self.cols,
                part: part.clone(),
            })
            .collect()
    }
}

/// One matrix of a stack: its format and shape, and where it is stored.
#[derive(Debug, Clone)]
pub struct MatrixPart {
    /// The stored tensor it is part of (shared by every matrix of a stack).
    pub tensor: std::sync::Arc<str>,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub part: PartLayout,
}
