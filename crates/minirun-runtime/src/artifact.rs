//! Opening a packed artifact for running: its unit manifests, config.json and tokenizer, and
//! an index from source tensor names to where their bytes are. Payload is read lazily: a
//! tensor's bytes are read (once, then held resident) when the model first asks for it, and a
//! streamed part (a routed expert's tile) is described by [`PartLayout`] so a streaming store
//! can read just it. Payload files are opened only through held verification evidence (rooted,
//! no-follow, identity rechecked) unless the caller asked for an unverified run. Every tile
//! container's header is read and checked against its file length and its manifest entry when
//! the artifact is opened, before a byte of a tile is used.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use minirun_format::artifact::{FileEntry, Layout, Member, Quantization};
use minirun_format::index::ArtifactIndex;
use minirun_format::tile::{HEADER_BYTES, QuantMode, ScaleDtype, TileContainer};
use minirun_store::{
    AlignedBuf, ArtifactFiles, BufferPool, HeldEvidence, LayoutError, PayloadFile, ReadPath,
};

use crate::read_clock::ReadClock;
use minirun_kernels::{Activations, BlockScale, FloatType, Format, QMatrix};

mod registration;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error(transparent)]
    Evidence(#[from] minirun_store::StoreError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(
        "{0} is not a complete artifact ({1}): pack it again with `minirun pack`, or download it with `minirun download`"
    )]
    Incomplete(String, &'static str),
    #[error(
        "{0} has no config.json. A publication without one (Kimi K3's) takes it from the upstream repository its index.json names: `minirun verify {0} --repo OWNER/NAME --revision SHA` fetches it from that upstream and verifies it against the upstream's tree"
    )]
    NoConfig(String),
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("the artifact has no tensor {0} (the model's config.json needs it)")]
    Missing(String),
    #[error("{name}: {reason}")]
    Tensor { name: String, reason: String },
}

/// Where the bytes come from, and what vouches for them.
pub enum Access {
    /// Every payload file through held evidence.
    Verified(Box<HeldEvidence>),
    /// Plain reads; the caller said so (`--unverified`).
    Unverified,
}

/// One payload file of the artifact.
struct PayloadEntry {
    path: String,
    bytes: u64,
    /// The container's header, checked when the artifact was opened.
    container: Option<Box<TileContainer>>,
    /// The open file, for reads.
    handle: OnceLock<PayloadFile>,
    /// The whole file, once a resident matrix of a container asked for it.
    resident: OnceLock<HeldFile>,
}

/// A container file's bytes for resident matrices: read into memory, or mapped by a baseline
/// that lets the kernel's page cache decide what stays in memory.
enum HeldFile {
    Read(AlignedBuf),
    Mapped(Box<dyn AsRef<[u8]> + Send + Sync>),
}

impl HeldFile {
    fn bytes(&self) -> &[u8] {
        match self {
            HeldFile::Read(buf) => buf.as_slice(),
            HeldFile::Mapped(map) => (**map).as_ref(),
        }
    }
}

/// Maps one whole payload file (given its path) into memory; see
/// [`Artifact::map_containers_unverified`].
pub type FileMapper =
    dyn Fn(&Path) -> std::io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> + Send + Sync;

/// Where one tensor's bytes are: a whole blob member, or the packed tensor of a tile container
/// (one tile per leading-dimension slice).
pub(crate) enum Location {
    Member {
        file: usize,
        member: Box<Member>,
        /// The member's bytes, kept in the buffer they were read into (a copy would double the
        /// memory of a large member, an embedding or a head, while it is made).
        resident: OnceLock<AlignedBuf>,
    },
    /// A container's tiles, all of them (a matrix or a stack), or only `tile` (one routed
    /// expert of the published DeepSeek V4 layout, whose containers order experts by
    /// `expert_order`).
    Tiled { file: usize, tile: Option<u64> },
    /// Row bands in one file, read as one range and joined (the published Kimi K3 layout): a
    /// deterministic tensor's bands, or an expert projection's consecutive tiles. `member`
    /// describes a float tensor (for [`Artifact::vector`]).
    Banded {
        format: Format,
        rows: usize,
        cols: usize,
        member: Option<Box<Member>>,
        part: PartLayout,
        /// The part's bytes joined ([`join_bands`]), held once read.
        resident: OnceLock<AlignedBuf>,
    },
}

/// An artifact opened for running: an index from source tensor names to their bytes, which are
/// read when first used.
pub struct Artifact {
    pub root: PathBuf,
    pub config_json: String,
    pub tokenizer_json: Option<String>,
    pub tokenizer_config_json: Option<String>,
    /// Kimi K3's tokenizer vocabulary, when the artifact has one at its root.
    pub tiktoken_model: Option<Vec<u8>>,
    /// What vouched for the bytes, in words for the run's header.
    pub provenance: String,
    files: ArtifactFiles,
    /// Whether a streamed tile's recorded SHA-256 is checked when it is read: always, unless
    /// the evidence is a full verification against the publisher (ADR 0013).
    check_tile_digests: bool,
    payload: Vec<PayloadEntry>,
    tensors: BTreeMap<String, Location>,
    /// Set only by [`Artifact::map_containers_unverified`].
    mapper: Option<Box<FileMapper>>,
    /// Buffers of streamed reads, reused for the next read of the same length.
    read_buffers: BufferPool,
    /// Wall time streamed reads kept storage busy.
    read_clock: ReadClock,
    /// The arithmetic of every matrix handed out (resident or streamed).
    activations: Activations,
    /// Bytes of tensors read once and handed out converted, not held as read (routing tables).
    held_converted: std::sync::atomic::AtomicU64,
}

/// A matrix, or a stack of equally shaped matrices (experts, attention heads), as stored.
#[derive(Debug, Clone)]
pub struct Stack<'a> {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    matrices: Vec<QMatrix<'a>>,
}

impl<'a> Stack<'a> {
    pub(crate) fn new(
        format: Format,
        rows: usize,
        cols: usize,
        matrices: Vec<QMatrix<'a>>,
    ) -> Stack<'a> {
        Stack {
            format,
            rows,
            cols,
            matrices,
        }
    }

    pub fn len(&self) -> usize {
        self.matrices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.matrices.is_empty()
    }

    /// Matrix `i` of the stack.
    pub fn get(&self, i: usize) -> Option<QMatrix<'a>> {
        self.matrices.get(i).copied()
    }

    /// The only matrix of a stack of one.
    pub fn single(&self, name: &str) -> Result<QMatrix<'a>, ArtifactError> {
        match (self.matrices.len(), self.get(0)) {
            (1, Some(m)) => Ok(m),
            (n, _) => Err(ArtifactError::Tensor {
                name: name.to_string(),
                reason: format!("is a stack of {n} matrices where the model needs one"),
            }),
        }
    }
}

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
            PartLayout::Bands { .. } => vec![joined_len(self)],
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
        ascending && inside && joined_len(self) as u64 <= len
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

pub(crate) fn invalid(path: &str, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::Invalid {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// The most payload an artifact's manifests may list (4 EiB): thousands of times any model.
const MAX_ARTIFACT_BYTES: u64 = 1 << 62;

/// The largest metadata file read (config, tokenizer): far above any real one, and a bound on
/// what a hostile directory can make this process allocate.
const METADATA_LIMIT: u64 = 256 << 20;

impl Access {
    fn files(self, root: &Path) -> Result<ArtifactFiles, ArtifactError> {
        match self {
            Access::Verified(held) => Ok(ArtifactFiles::Verified(held)),
            Access::Unverified => Ok(ArtifactFiles::unverified(root)?),
        }
    }

    fn provenance(&self) -> String {
        match self {
            Access::Unverified => {
                "bytes not checked against any publication (--unverified)".to_string()
            }
            Access::Verified(held) => {
                let e = held.evidence();
                if let Some(signer) = &e.signer {
                    let of = match e.repo.is_empty() {
                        true => String::new(),
                        false => format!(" of {}@{}", e.repo, e.revision),
                    };
                    format!(
                        "verified against its statement{of}, signed by {} (key {})",
                        signer.principals, signer.fingerprint
                    )
                } else if e.repo.is_empty() {
                    "verified offline against the artifact's own manifests (which are not authenticated)".to_string()
                } else {
                    let mut text =
                        format!("verified ({}) against {}@{}", e.mode, e.repo, e.revision);
                    for f in &e.files {
                        if let Some(o) = &f.origin {
                            let from = format!(
                                "; {} against {}@{}, the upstream its index.json names",
                                f.path, o.repo, o.revision
                            );
                            text.push_str(&from);
                        }
                    }
                    text
                }
            }
        }
    }
}

/// A root metadata file (a verified run refuses one the evidence does not cover).
fn read_metadata(files: &ArtifactFiles, path: &str) -> Result<Option<Vec<u8>>, ArtifactError> {
    Ok(files
        .read_metadata(path, METADATA_LIMIT)?
        .map(|read| read.bytes))
}

fn text(path: &str, bytes: Vec<u8>) -> Result<String, ArtifactError> {
    String::from_utf8(bytes).map_err(|_| invalid(path, "is not UTF-8"))
}

/// The cell's value, loading it first if no one has.
fn once<T>(
    cell: &OnceLock<T>,
    load: impl FnOnce() -> Result<T, ArtifactError>,
) -> Result<&T, ArtifactError> {
    if let Some(value) = cell.get() {
        return Ok(value);
    }
    let value = load()?;
    Ok(cell.get_or_init(|| value))
}

/// How an architecture reads a layout its publisher released (`models/<arch>/published_layout.rs`):
/// it registers every tensor of an artifact in that layout, checked against its own config. The
/// registry hands every architecture's reader to [`Artifact::open_with`].
pub struct PublishedReader {
    pub layout: Layout,
    pub register: fn(&mut Artifact) -> Result<(), ArtifactError>,
}

impl Artifact {
    /// Opens an artifact in minirun's own layout at `root`: metadata, manifests and every
    /// container header are read and checked; payload is read when first used. An artifact in
    /// a published layout is refused: its architecture reads it ([`Artifact::open_with`]).
    pub fn open(root: &Path, access: Access) -> Result<Artifact, ArtifactError> {
        Artifact::open_with(root, access, &[])
    }

    /// [`Artifact::open`], with `readers` for the published layouts.
    pub fn open_with(
        root: &Path,
        access: Access,
        readers: &[&PublishedReader],
    ) -> Result<Artifact, ArtifactError> {
        let shown = root.display().to_string();
        let provenance = access.provenance();
        let check_tile_digests = match &access {
            Access::Verified(held) => !held.evidence().vouches_for_every_byte(),
            Access::Unverified => true,
        };
        let files = access.files(root)?;
        files.check_complete()?;
        // Verification records index.json's bytes and the run reports its identity: one that is
        // not even a JSON object is refused rather than carried along unread.
        let index = read_metadata(&files, "index.json")?.unwrap_or_default();
        if let Some(problem) = ArtifactIndex::parse(&index).parse_problem {
            return Err(invalid(
                &format!("{shown}/index.json"),
                format!(
                    "is not an artifact index ({problem}): pack the artifact again with `minirun pack`, or download it again"
                ),
            ));
        }
        let config_json = read_metadata(&files, "config.json")?
            .ok_or_else(|| ArtifactError::NoConfig(shown.clone()))?;
        let config_json = text("config.json", config_json)?;
        let tokenizer_json = read_metadata(&files, "tokenizer.json")?
            .map(|b| text("tokenizer.json", b))
            .transpose()?;
        let tokenizer_config_json = read_metadata(&files, "tokenizer_config.json")?
            .map(|b| text("tokenizer_config.json", b))
            .transpose()?;
        let tiktoken_model = read_metadata(&files, "tiktoken.model")?;
        let layout = files.layout()?;
        let manifests = match layout {
            Layout::Own => files.unit_manifests()?,
            Layout::K3Published | Layout::V4Published => Vec::new(),
        };
        let mut artifact = Artifact {
            root: root.to_path_buf(),
            config_json,
            tokenizer_json,
            tokenizer_config_json,
            tiktoken_model,
            provenance,
            files,
            check_tile_digests,
            payload: Vec::new(),
            tensors: BTreeMap::new(),
            mapper: None,
            read_buffers: BufferPool::new(),
            read_clock: ReadClock::new(),
            activations: Activations::F32,
            held_converted: Default::default(),
        };
        for manifest in &manifests {
            for entry in &manifest.files {
                artifact.add_file(&manifest.unit, entry)?;
            }
        }
        if layout != Layout::Own {
            let reader = readers.iter().find(|r| r.layout == layout).ok_or_else(|| {
                invalid(
                    &shown,
                    format!(
                        "is in {}, which only its architecture reads: open it through the registry (registry::open_artifact)",
                        layout.describe()
                    ),
                )
            })?;
            (reader.register)(&mut artifact)?;
        }
        if artifact.payload.is_empty() {
            return Err(ArtifactError::Incomplete(shown, "it has no unit manifests"));
        }
        // Blob sizes are the manifests' word until a blob is opened; bounding their sum keeps
        // every size the plan adds up (all of them parts of it) far from overflowing.
        let total = artifact
            .payload
            .iter()
            .try_fold(0u64, |sum, p| sum.checked_add(p.bytes));
        if total.is_none_or(|t| t > MAX_ARTIFACT_BYTES) {
            return Err(invalid(
                &shown,
                format!(
                    "its manifests list more than {MAX_ARTIFACT_BYTES} bytes of payload; no artifact is that large"
                ),
            ));
        }
        Ok(artifact)
    }

    /// The file's open handle, its length checked against the manifest on the first open.
    fn handle(&self, file: usize) -> Result<&PayloadFile, ArtifactError> {
        let entry = &self.payload[file];
        if let Some(h) = entry.handle.get() {
            return Ok(h);
        }
        let handle = self.files.open_streamed(&entry.path)?;
        if handle.len() != entry.bytes {
            return Err(invalid(
                &entry.path,
                format!(
                    "has {} bytes, its manifest says {}",
                    handle.len(),
                    entry.bytes
                ),
            ));
        }
        Ok(entry.handle.get_or_init(|| handle))
    }

    /// `len` bytes at `offset` of payload file `file`, read now.
    pub(crate) fn read_vec(
        &self,
        file: usize,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ArtifactError> {
        Ok(self.read_aligned(file, offset, len)?.as_slice().to_vec())
    }

    /// `len` bytes at `offset` of payload file `file`, read now into an aligned buffer (kept as
    /// it is: a copy would double a large file's memory while it is made).
    fn read_aligned(
        &self,
        file: usize,
        offset: u64,
        len: u64,
    ) -> Result<AlignedBuf, ArtifactError> {
        // The open checks the file's length against its manifest: only then is a buffer of a
        // length the manifest names allocated.
        let handle = self.handle(file)?;
        let mut buf = AlignedBuf::new(len as usize);
        handle.read_into(offset, &mut buf)?;
        Ok(buf)
    }

    fn add_file(&mut self, unit: &str, entry: &FileEntry) -> Result<(), ArtifactError> {
        let path = format!("{unit}/{}", entry.name());
        let file = self.payload.len();
        self.payload.push(PayloadEntry {
            path: path.clone(),
            bytes: entry.bytes(),
            container: None,
            handle: OnceLock::new(),
            resident: OnceLock::new(),
        });
        match entry {
            FileEntry::Blob { members, .. } => {
                for member in members {
                    let end = member.offset.checked_add(member.source.bytes);
                    if end.is_none_or(|end| end > entry.bytes()) {
                        return Err(invalid(
                            &path,
                            format!("member {} lies past the end", member.source.source_tensor),
                        ));
                    }
                    let location = Location::Member {
                        file,
                        member: Box::new(member.clone()),
                        resident: OnceLock::new(),
                    };
                    self.insert(&path, &member.source.source_tensor, location)?;
                }
            }
            FileEntry::TileContainer {
                packed,
                rows,
                cols,
                count,
                ..
            } => {
                if entry.bytes() < HEADER_BYTES {
                    return Err(invalid(&path, "is shorter than a header"));
                }
                let header = self.read_vec(file, 0, HEADER_BYTES)?;
                let container = TileContainer::parse(&header, entry.bytes())
                    .map_err(|e| invalid(&path, e.to_string()))?;
                let g = &container.geometry;
                if (g.rows, g.cols, g.tile_count) != (*rows, *cols, *count) {
                    return Err(invalid(
                        &path,
                        format!(
                            "its header holds {} tiles of {} x {}, its manifest says {count} of {rows} x {cols}",
                            g.tile_count, g.rows, g.cols
                        ),
                    ));
                }
                if container.layout.total_bytes != entry.bytes() {
                    return Err(invalid(
                        &path,
                        format!(
                            "its header's geometry needs {} bytes, its manifest says {}",
                            container.layout.total_bytes,
                            entry.bytes()
                        ),
                    ));
                }
                self.payload[file].container = Some(Box::new(container));
                self.insert(
                    &path,
                    &packed.source_tensor,
                    Location::Tiled { file, tile: None },
                )?;
            }
        }
        Ok(())
    }

    pub(crate) fn insert(
        &mut self,
        path: &str,
        name: &str,
        location: Location,
    ) -> Result<(), ArtifactError> {
        if self.tensors.insert(name.to_string(), location).is_some() {
            return Err(invalid(path, format!("holds {name} a second time")));
        }
        Ok(())
    }

    /// Resident matrices of tile containers come from `mapper`'s map of each whole file instead
    /// of a read into memory, for a baseline that measures what the kernel's page cache does with
    /// a model larger than memory (as mmap-based runtimes run one). The mapped bytes are not
    /// checked against any evidence, and may change under the run if the file does: so this is
    /// refused for a verified artifact. Nothing in minirun's own commands calls it.
    pub fn map_containers_unverified(
        &mut self,
        mapper: Box<FileMapper>,
    ) -> Result<(), ArtifactError> {
        if self.files.held().is_some() {
            return Err(invalid(
                &self.root.display().to_string(),
                "is opened through its evidence; mapped files bypass it, so only an artifact opened unverified can be mapped",
            ));
        }
        self.mapper = Some(mapper);
        Ok(())
    }

    /// Container file `file`, whole, for resident matrices: read, or mapped.
    fn held_file(&self, file: usize) -> Result<HeldFile, ArtifactError> {
        let entry = &self.payload[file];
        let Some(mapper) = &self.mapper else {
            return Ok(HeldFile::Read(self.read_aligned(file, 0, entry.bytes)?));
        };
        let map = mapper(&self.root.join(&entry.path))
            .map_err(|e| invalid(&entry.path, format!("cannot be mapped: {e}")))?;
        let len = (*map).as_ref().len() as u64;
        if len != entry.bytes {
            return Err(invalid(
                &entry.path,
                format!("maps {len} bytes, its manifest says {}", entry.bytes),
            ));
        }
        Ok(HeldFile::Mapped(map))
    }

    /// The evidence the artifact was opened through, if it was.
    pub fn evidence(&self) -> Option<&minirun_store::Evidence> {
        self.files.held().map(|held| held.evidence())
    }

    /// Bytes of payload held resident (read by the model, and kept as read or converted; mapped
    /// files do not count).
    pub fn payload_bytes(&self) -> u64 {
        let files: u64 = self
            .payload
            .iter()
            .filter_map(|p| match p.resident.get() {
                Some(HeldFile::Read(buf)) => Some(buf.len() as u64),
                _ => None,
            })
            .sum();
        let members: u64 = self
            .tensors
            .values()
            .filter_map(|l| match l {
                Location::Member { resident, .. } => resident.get().map(AlignedBuf::len),
                Location::Banded { resident, .. } => resident.get().map(AlignedBuf::len),
                Location::Tiled { .. } => None,
            })
            .map(|len| len as u64)
            .sum();
        files
            + members
            + self
                .held_converted
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The length of payload file `file` (an index a [`PartLayout`] names).
    pub fn payload_file_bytes(&self, file: usize) -> u64 {
        self.payload.get(file).map_or(0, |p| p.bytes)
    }

    /// Whether aligned reads of payload file `file` bypass the page cache (`O_DIRECT`), once it
    /// has been opened.
    pub fn payload_file_direct(&self, file: usize) -> Option<bool> {
        self.payload
            .get(file)
            .and_then(|p| p.handle.get())
            .map(PayloadFile::supports_direct)
    }

    /// Bytes of payload the manifests list.
    pub fn total_payload_bytes(&self) -> u64 {
        self.payload.iter().map(|p| p.bytes).sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A float tensor (norm weights, biases) as f32, checked against `len` elements before it
    /// is read.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        let dtype = self.check_vector(name, len)?;
        // Held as read: a streamed layer is built again every step, its norms from these bytes.
        let (bytes, _) = self.member(name)?;
        if Some(bytes.len()) != len.checked_mul(dtype.size()) {
            return Err(tensor_err(
                name,
                format!("read {} bytes; the config needs {len} floats", bytes.len()),
            ));
        }
        Ok((0..len).map(|i| dtype.read(bytes, i)).collect())
    }

    /// `f` of a member's bytes, for a tensor the model asks for once and holds converted (a
    /// routing table): the bytes a matrix already holds, else read for `f` alone and dropped
    /// after it, so that the run does not hold the tensor twice. What is read so counts as held
    /// ([`Artifact::payload_bytes`]): the model holds it, converted.
    fn with_member<T>(
        &self,
        name: &str,
        f: impl FnOnce(&[u8], &Member) -> Result<T, ArtifactError>,
    ) -> Result<T, ArtifactError> {
        if let Some(Location::Member {
            file,
            member,
            resident,
        }) = self.tensors.get(name)
            && resident.get().is_none()
        {
            let read = self.read_aligned(*file, member.offset, member.source.bytes)?;
            self.held_converted
                .fetch_add(member.source.bytes, std::sync::atomic::Ordering::Relaxed);
            return f(read.as_slice(), member);
        }
        let (bytes, member) = self.member(name)?;
        f(bytes, member)
    }

    /// Checks, without reading it, that `name` is a plain float tensor of `len` elements;
    /// returns its element type.
    pub fn check_vector(&self, name: &str, len: usize) -> Result<FloatType, ArtifactError> {
        let member = match self.tensors.get(name) {
            Some(Location::Member { member, .. })
            | Some(Location::Banded {
                member: Some(member),
                ..
            }) => member,
            other => return Err(not_a_member(name, other)),
        };
        let dtype = float_type(&member.source.dtype).ok_or_else(|| {
            tensor_err(
                name,
                format!("is {}, not a float tensor", member.source.dtype),
            )
        })?;
        let shape_len = member
            .source
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = len.checked_mul(dtype.size()).map(|b| b as u64);
        if shape_len != Some(len)
            || bytes != Some(member.source.bytes)
            || member.quantization.is_some()
        {
            return Err(tensor_err(
                name,
                format!(
                    "has shape {:?} in {} bytes; the config needs {len} floats",
                    member.source.shape, member.source.bytes
                ),
            ));
        }
        Ok(dtype)
    }

    /// The stack `layout` describes over `zeros` instead of its stored bytes: what a dry build
    /// of a layer hands the model, so that its builder runs (and says what it asks for) without
    /// a payload byte read. `zeros` must hold the longest of each part's byte lengths.
    pub fn unread_stack<'z>(
        &self,
        layout: &StackLayout,
        zeros: &'z [u8],
    ) -> Result<Stack<'z>, ArtifactError> {
        let matrices = layout
            .parts
            .iter()
            .map(|part| {
                let [packed, scales, biases] = part.byte_lengths();
                let slice = |n: usize| {
                    zeros
                        .get(..n)
                        .ok_or_else(|| tensor_err(&layout.name, format!("needs {n} zero bytes")))
                };
                QMatrix::new(
                    layout.format,
                    layout.rows,
                    layout.cols,
                    slice(packed)?,
                    slice(scales)?,
                    slice(biases)?,
                )
                .map(|m| m.with_activations(self.activations))
                .map_err(|e| tensor_err(&layout.name, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack::new(
            layout.format,
            layout.rows,
            layout.cols,
            matrices,
        ))
    }

    /// A plain integer tensor of `len` elements (I64 or I32, little-endian), widened to i64:
    /// DeepSeek V4's `tid2eid` tables.
    pub fn integers(&self, name: &str, len: usize) -> Result<Vec<i64>, ArtifactError> {
        self.with_member(name, |bytes, member| {
            let width = match member.source.dtype.as_str() {
                "I64" => 8,
                "I32" => 4,
                other => {
                    return Err(tensor_err(
                        name,
                        format!("is {other}, not an integer tensor"),
                    ));
                }
            };
            let shape_len = member
                .source
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d));
            if shape_len != Some(len) || bytes.len() != len * width || member.quantization.is_some()
            {
                return Err(tensor_err(
                    name,
                    format!(
                        "has shape {:?} in {} bytes; the config needs {len} integers",
                        member.source.shape,
                        bytes.len()
                    ),
                ));
            }
            Ok(bytes
                .chunks_exact(width)
                .map(|b| match b.try_into() {
                    Ok(eight) => i64::from_le_bytes(eight),
                    Err(_) => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                })
                .collect())
        })
    }

    /// A blob member's description, without reading it.
    fn member_entry(&self, name: &str) -> Result<(usize, &Member), ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member { file, member, .. }) => Ok((*file, member)),
            other => Err(not_a_member(name, other)),
        }
    }

    /// A blob member's bytes (read once, then resident).
    fn member(&self, name: &str) -> Result<(&[u8], &Member), ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member {
                file,
                member,
                resident,
            }) => {
                let bytes = once(resident, || {
                    self.read_aligned(*file, member.offset, member.source.bytes)
                })?;
                Ok((bytes.as_slice(), member))
            }
            Some(Location::Banded {
                member: Some(member),
                part,
                resident,
                ..
            }) => Ok((self.joined_bands(part, resident)?, member)),
            other => Err(not_a_member(name, other)),
        }
    }

    /// A banded part's bytes joined (packed, then scales), read once and held.
    fn joined_bands<'s>(
        &'s self,
        part: &PartLayout,
        resident: &'s OnceLock<AlignedBuf>,
    ) -> Result<&'s [u8], ArtifactError> {
        let joined = once(resident, || {
            let PartLayout::Bands { file, range, .. } = part else {
                return Err(tensor_err("bands", "are not a banded part".into()));
            };
            let read = self.read_aligned(*file, range.start, range.end - range.start)?;
            Ok(join_bands(part, read, AlignedBuf::new))
        })?;
        Ok(&joined.as_slice()[..joined_len(part)])
    }

    /// The matrix (or stack) of module `module`: `{module}.weight` with its scales and biases
    /// wherever they are stored, read now and held resident. Its shape must be `[.., rows,
    /// cols]` (`cols` in elements).
    pub fn matrix(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Stack<'_>, ArtifactError> {
        let layout = self.stack_layout(module, rows, cols)?;
        let matrices = layout
            .parts
            .iter()
            .map(|part| self.resident_matrix(&layout, part))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack {
            format: layout.format,
            rows: layout.rows,
            cols: layout.cols,
            matrices,
        })
    }

    /// One matrix of a stack, read now and held resident as [`Artifact::matrix`] holds it.
    pub fn resident_part(&self, part: &MatrixPart) -> Result<QMatrix<'_>, ArtifactError> {
        let layout = StackLayout {
            name: part.tensor.to_string(),
            format: part.format,
            rows: part.rows,
            cols: part.cols,
            parts: Vec::new(),
        };
        self.resident_matrix(&layout, &part.part)
    }

    fn resident_matrix(
        &self,
        layout: &StackLayout,
        part: &PartLayout,
    ) -> Result<QMatrix<'_>, ArtifactError> {
        let (packed, scales, biases) = match part {
            PartLayout::Tile {
                file,
                tile,
                packed,
                scales,
                biases,
                ..
            } => {
                let entry = &self.payload[*file];
                let bytes = once(&entry.resident, || self.held_file(*file))?.bytes();
                let at = |r: &Range<u64>| {
                    &bytes[(tile.start + r.start) as usize..(tile.start + r.end) as usize]
                };
                (at(packed), at(scales), biases.as_ref().map_or(&[][..], at))
            }
            PartLayout::Bands { .. } => {
                let Some(Location::Banded { resident, .. }) = self.tensors.get(&layout.name) else {
                    return Err(tensor_err(&layout.name, "is not a banded tensor".into()));
                };
                let bytes = self.joined_bands(part, resident)?;
                let p = joined_packed_len(part);
                (&bytes[..p], &bytes[p..], &[][..])
            }
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => {
                let piece = |p: &Piece| -> Result<&[u8], ArtifactError> {
                    let (bytes, _) = self.member(&p.tensor)?;
                    Ok(&bytes[p.start as usize..(p.start + p.len) as usize])
                };
                let optional = |p: &Option<Piece>| p.as_ref().map_or(Ok(&[][..]), piece);
                (piece(packed)?, optional(scales)?, optional(biases)?)
            }
        };
        QMatrix::new(
            layout.format,
            layout.rows,
            layout.cols,
            packed,
            scales,
            biases,
        )
        .map(|m| m.with_activations(self.activations))
        .map_err(|e| tensor_err(&layout.name, e.to_string()))
    }

    /// The arithmetic of the matrices this artifact hands out from now on (set it before a
    /// model is loaded: a model keeps the matrices it loaded).
    pub fn set_activations(&mut self, activations: Activations) {
        self.activations = activations;
    }

    pub fn activations(&self) -> Activations {
        self.activations
    }

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

    fn timed_read(
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
                let len = joined_len(part);
                let buf = join_bands(part, read, |len| self.read_buffers.buffer(len));
                let p = joined_packed_len(part);
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

    /// Where the matrices of module `module` are stored, checked against the shape the caller
    /// needs, without reading them.
    pub fn stack_layout(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<StackLayout, ArtifactError> {
        let name = self.weight_name(module);
        let layout = match self.tensors.get(&name) {
            None => return Err(ArtifactError::Missing(name)),
            Some(Location::Tiled { file, tile }) => self.tiled(&name, *file, *tile)?,
            Some(Location::Member { .. }) => self.plain_matrix(module, &name)?,
            Some(Location::Banded {
                format,
                rows,
                cols,
                part,
                ..
            }) => StackLayout {
                name: name.clone(),
                format: *format,
                rows: *rows,
                cols: *cols,
                parts: vec![part.clone()],
            },
        };
        if (layout.rows, layout.cols) != (rows, cols) {
            return Err(tensor_err(
                &name,
                format!(
                    "is {} x {}; config.json implies {rows} x {cols}",
                    layout.rows, layout.cols
                ),
            ));
        }
        Ok(layout)
    }

    fn tiled(
        &self,
        name: &str,
        file: usize,
        only: Option<u64>,
    ) -> Result<StackLayout, ArtifactError> {
        let Some(c) = &self.payload[file].container else {
            return Err(tensor_err(name, "has no container header".into()));
        };
        let g = &c.geometry;
        let format = match (g.mode, g.scale_dtype) {
            (QuantMode::Affine, dtype) => Format::Affine {
                bits: g.bits,
                group: g.group_size as usize,
                scale: scale_float(dtype)
                    .ok_or_else(|| tensor_err(name, "affine with e8m0 scales".into()))?,
            },
            (QuantMode::Mxfp4, _) => Format::Mxfp4,
            (QuantMode::Fp8E4m3Block, dtype) => Format::Fp8Block {
                block_rows: g.scale_block_rows as usize,
                block_cols: g.group_size as usize,
                scale: match dtype {
                    ScaleDtype::E8m0 => BlockScale::E8m0,
                    other => BlockScale::Float(
                        scale_float(other).ok_or_else(|| tensor_err(name, "bad scale".into()))?,
                    ),
                },
            },
        };
        let mut parts = Vec::new();
        let tiles = match only {
            Some(t) if t < u64::from(g.tile_count) => t..t + 1,
            Some(t) => return Err(tensor_err(name, format!("has no tile {t}"))),
            None => 0..u64::from(g.tile_count),
        };
        for index in tiles {
            let err = |e: minirun_format::tile::TileError| tensor_err(name, e.to_string());
            let tile = c.tile_range(index).map_err(err)?;
            let relative = |r: Range<u64>| r.start - tile.start..r.end - tile.start;
            parts.push(PartLayout::Tile {
                file,
                index,
                packed: relative(c.packed_range(index).map_err(err)?),
                scales: relative(c.scale_range(index).map_err(err)?),
                biases: c.bias_range(index).map_err(err)?.map(relative),
                tile,
            });
        }
        Ok(StackLayout {
            name: name.to_string(),
            format,
            rows: g.rows as usize,
            cols: g.cols as usize,
            parts,
        })
    }

    /// The stored name of module `module`'s matrix: `{module}.weight`, or gpt-oss's
    /// `{module}_blocks` (OpenAI's MXFP4 codes, kept under their upstream name).
    fn weight_name(&self, module: &str) -> String {
        let usual = format!("{module}.weight");
        let blocks = format!("{module}_blocks");
        match !self.tensors.contains_key(&usual) && self.tensors.contains_key(&blocks) {
            true => blocks,
            false => usual,
        }
    }

    /// Whether the artifact stores a matrix for module `module` (metadata only).
    pub fn has_matrix(&self, module: &str) -> bool {
        self.tensors.contains_key(&self.weight_name(module))
    }

    fn plain_matrix(&self, module: &str, name: &str) -> Result<StackLayout, ArtifactError> {
        let (file, member) = self.member_entry(name)?;
        let shape = &member.source.shape;
        let whole = |tensor: &str, file: usize, m: &Member| Piece {
            tensor: tensor.to_string(),
            file,
            offset: m.offset,
            start: 0,
            len: m.source.bytes,
        };
        let Some(q) = &member.quantization else {
            let dtype = float_type(&member.source.dtype).ok_or_else(|| {
                tensor_err(
                    name,
                    format!("is {} and not recorded as quantized", member.source.dtype),
                )
            })?;
            let (count, rows, cols) = leading(name, shape)?;
            return Ok(StackLayout {
                name: name.to_string(),
                format: Format::Dense(dtype),
                rows,
                cols,
                parts: split(name, whole(name, file, member), count, None, None)?,
            });
        };
        let format = quantized_format(name, q)?;
        // DeepSeek V4 names both its FP8 block scales and its FP4 expert scales `.scale`;
        // gpt-oss its MXFP4 scales `_scales`, beside its `_blocks`.
        let either = |usual: String| match self.tensors.contains_key(&usual) {
            true => usual,
            false if name.ends_with("_blocks") => format!("{module}_scales"),
            false => format!("{module}.scale"),
        };
        let (scales_name, biases_name) = match q.layout {
            QuantMode::Fp8E4m3Block => (either(format!("{name}_scale_inv")), None),
            QuantMode::Affine => (format!("{module}.scales"), Some(format!("{module}.biases"))),
            QuantMode::Mxfp4 => (either(format!("{module}.scales")), None),
        };
        let (scales_file, scales_member) = self.member_entry(&scales_name)?;
        let expected_scale_dtype = match q.scale_dtype {
            ScaleDtype::E8m0 => ["U8", "F8_E8M0"].as_slice(),
            ScaleDtype::F16 => ["F16"].as_slice(),
            ScaleDtype::Bf16 => ["BF16"].as_slice(),
            ScaleDtype::F32 => ["F32"].as_slice(),
        };
        if !expected_scale_dtype.contains(&scales_member.source.dtype.as_str()) {
            return Err(tensor_err(
                &scales_name,
                format!(
                    "is {}, but the manifest records {} scales",
                    scales_member.source.dtype, q.scale_dtype
                ),
            ));
        }
        let biases = match &biases_name {
            Some(b) => {
                let (bias_file, bias) = self.member_entry(b)?;
                if bias.source.dtype != scales_member.source.dtype {
                    return Err(tensor_err(
                        b,
                        format!(
                            "is {}, its scales {}",
                            bias.source.dtype, scales_member.source.dtype
                        ),
                    ));
                }
                Some(whole(b, bias_file, bias))
            }
            None => None,
        };
        if q.layout == QuantMode::Fp8E4m3Block && member.source.dtype != "F8_E4M3" {
            return Err(tensor_err(
                name,
                format!(
                    "is {}; only F8_E4M3 elements are implemented",
                    member.source.dtype
                ),
            ));
        }
        // gpt-oss's MXFP4 codes are [.., rows, cols / 32, 16]: one row's bytes are its blocks.
        let merged;
        let shape = match (shape.as_slice(), name.ends_with("_blocks")) {
            ([lead @ .., blocks, 16], true) if q.layout == QuantMode::Mxfp4 => {
                merged = [lead, &[blocks.saturating_mul(16)]].concat();
                &merged
            }
            _ => shape,
        };
        let (count, rows, stored_cols) = leading(name, shape)?;
        let cols = match format {
            Format::Affine { bits, .. } if member.source.dtype == "U32" => {
                stored_cols.saturating_mul(32) / bits as usize
            }
            Format::Mxfp4 if member.source.dtype == "U32" => stored_cols.saturating_mul(8),
            Format::Mxfp4 if matches!(member.source.dtype.as_str(), "I8" | "U8") => {
                stored_cols.saturating_mul(2)
            }
            Format::Fp8Block { .. } => stored_cols,
            _ => {
                return Err(tensor_err(
                    name,
                    format!(
                        "{} stored as {} is not implemented",
                        q.layout, member.source.dtype
                    ),
                ));
            }
        };
        Ok(StackLayout {
            name: name.to_string(),
            format,
            rows,
            cols,
            parts: split(
                name,
                whole(name, file, member),
                count,
                Some(whole(&scales_name, scales_file, scales_member)),
                biases,
            )?,
        })
    }
}

/// A banded part's packed ranges, then its scale ranges, out of `read` (its range's bytes),
/// into `out` (exactly their total length).
fn join_bands_into(part: &PartLayout, read: &[u8], out: &mut [u8]) {
    let PartLayout::Bands { packed, scales, .. } = part else {
        return;
    };
    let mut at = 0;
    for r in packed.iter().chain(scales) {
        let band = &read[r.start as usize..r.end as usize];
        out[at..at + band.len()].copy_from_slice(band);
        at += band.len();
    }
}

/// A banded part's bytes joined, packed then scales, out of `read` (its range's bytes): inside
/// the read where the part [`PartLayout::joins_in_place`], else into a buffer from `copy`. The
/// joined bytes are the returned buffer's first `joined_len(part)`.
fn join_bands(
    part: &PartLayout,
    mut read: AlignedBuf,
    copy: impl FnOnce(usize) -> AlignedBuf,
) -> AlignedBuf {
    if part.joins_in_place() {
        join_bands_in_place(part, read.as_mut_slice());
        return read;
    }
    let mut joined = copy(joined_len(part));
    join_bands_into(part, read.as_slice(), joined.as_mut_slice());
    joined
}

/// `join_bands_into` inside `buf` (the part's read), for a part that
/// [`PartLayout::joins_in_place`] (checked by [`join_bands`]): the joined bytes start at
/// `buf[0]`.
fn join_bands_in_place(part: &PartLayout, buf: &mut [u8]) {
    let PartLayout::Bands { packed, scales, .. } = part else {
        return;
    };
    let set_aside: Vec<u8> = scales
        .iter()
        .flat_map(|r| &buf[r.start as usize..r.end as usize])
        .copied()
        .collect();
    let mut at = 0;
    for r in packed {
        let (start, end) = (r.start as usize, r.end as usize);
        buf.copy_within(start..end, at);
        at += end - start;
    }
    buf[at..at + set_aside.len()].copy_from_slice(&set_aside);
}

/// The length of a banded part's joined bytes.
fn joined_len(part: &PartLayout) -> usize {
    match part {
        PartLayout::Bands { packed, scales, .. } => packed
            .iter()
            .chain(scales)
            .map(|r| (r.end - r.start) as usize)
            .sum(),
        _ => 0,
    }
}

/// Where a banded part's scales start in its joined bytes.
fn joined_packed_len(part: &PartLayout) -> usize {
    match part {
        PartLayout::Bands { packed, .. } => packed.iter().map(|r| (r.end - r.start) as usize).sum(),
        _ => 0,
    }
}

fn not_a_member(name: &str, location: Option<&Location>) -> ArtifactError {
    match location {
        Some(_) => tensor_err(
            name,
            "is a tile container where a plain tensor is expected".to_string(),
        ),
        None => ArtifactError::Missing(name.to_string()),
    }
}

/// The `count` equal slices of each member (experts, heads); refused when a length does not
/// divide evenly (a manifest that contradicts itself).
fn split(
    name: &str,
    packed: Piece,
    count: usize,
    scales: Option<Piece>,
    biases: Option<Piece>,
) -> Result<Vec<PartLayout>, ArtifactError> {
    let count64 = count as u64;
    let even = |p: &Option<Piece>| p.as_ref().is_none_or(|p| p.len.is_multiple_of(count64));
    if !(count > 0
        && count64 <= packed.len
        && packed.len.is_multiple_of(count64)
        && even(&scales)
        && even(&biases))
    {
        return Err(tensor_err(
            name,
            format!(
                "does not split into {count} equal matrices ({} packed bytes)",
                packed.len
            ),
        ));
    }
    let piece = |p: &Piece, i: u64| {
        let len = p.len / count64;
        Piece {
            tensor: p.tensor.clone(),
            file: p.file,
            offset: p.offset + len * i,
            start: len * i,
            len,
        }
    };
    Ok((0..count64)
        .map(|i| PartLayout::Pieces {
            packed: piece(&packed, i),
            scales: scales.as_ref().map(|p| piece(p, i)),
            biases: biases.as_ref().map(|p| piece(p, i)),
        })
        .collect())
}

/// `[count.., rows, cols]` with the leading dimensions multiplied; rank 2 gives a count of 1.
fn leading(name: &str, shape: &[usize]) -> Result<(usize, usize, usize), ArtifactError> {
    match shape {
        [rows, cols] => Ok((1, *rows, *cols)),
        [count, rows, cols] if *count > 0 => Ok((*count, *rows, *cols)),
        _ => Err(tensor_err(
            name,
            format!("has shape {shape:?}, not a matrix or a stack of matrices"),
        )),
    }
}

fn quantized_format(name: &str, q: &Quantization) -> Result<Format, ArtifactError> {
    let scale = scale_float(q.scale_dtype);
    let parameters_ok = match q.layout {
        QuantMode::Affine => matches!(q.element_bits, 4 | 8) && matches!(q.group, 32 | 64 | 128),
        QuantMode::Mxfp4 => q.element_bits == 4,
        QuantMode::Fp8E4m3Block => {
            q.element_bits == 8 && q.block_rows > 0 && q.group > 0 && q.group.is_multiple_of(8)
        }
    };
    if !parameters_ok {
        return Err(tensor_err(
            name,
            format!(
                "{} with {} bits, group {} and block rows {} is not implemented",
                q.layout, q.element_bits, q.group, q.block_rows
            ),
        ));
    }
    match (q.layout, scale) {
        (QuantMode::Affine, Some(scale)) => Ok(Format::Affine {
            bits: q.element_bits,
            group: q.group as usize,
            scale,
        }),
        (QuantMode::Mxfp4, None) if q.group == 32 => Ok(Format::Mxfp4),
        (QuantMode::Fp8E4m3Block, scale) => Ok(Format::Fp8Block {
            block_rows: q.block_rows as usize,
            block_cols: q.group as usize,
            scale: scale.map_or(BlockScale::E8m0, BlockScale::Float),
        }),
        (layout, _) => Err(tensor_err(
            name,
            format!("{layout} with {} scales is not implemented", q.scale_dtype),
        )),
    }
}

fn float_type(dtype: &str) -> Option<FloatType> {
    match dtype {
        "F32" => Some(FloatType::F32),
        "F16" => Some(FloatType::F16),
        "BF16" => Some(FloatType::BF16),
        _ => None,
    }
}

fn scale_float(dtype: ScaleDtype) -> Option<FloatType> {
    match dtype {
        ScaleDtype::F16 => Some(FloatType::F16),
        ScaleDtype::Bf16 => Some(FloatType::BF16),
        ScaleDtype::F32 => Some(FloatType::F32),
        ScaleDtype::E8m0 => None,
    }
}

fn tensor_err(name: &str, reason: String) -> ArtifactError {
    ArtifactError::Tensor {
        name: name.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let mut copy = vec![0u8; joined_len(&part)];
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
