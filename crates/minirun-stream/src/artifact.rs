//! Opening a packed artifact for running: its unit manifests, config.json and tokenizer, and
//! an index from source tensor names to where their bytes are. Payload is read lazily: a
//! tensor's bytes are read (once, then held resident) when the model first asks for it, and a
//! streamed part (a routed expert's tile) is described by [`PartLayout`] so a streaming store
//! can read just it. Payload files are opened only through held verification evidence (rooted,
//! no-follow, identity rechecked) unless the caller asked for an unverified run. Every tile
//! container's header is read and checked against its file length and its manifest entry when
//! the artifact is opened, before a byte of a tile is used.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::read_clock::ReadClock;
use minirun_format::artifact::{Layout, Member};
use minirun_format::tile::TileContainer;
use minirun_kernels::{Activations, Format};
use minirun_store::{
    AlignedBuf, ArtifactFiles, BufferPool, HeldEvidence, LayoutError, PayloadFile,
};

use resident::HeldFile;

mod bands;
mod kernel_formats;
#[cfg(feature = "mapped-baseline")]
mod mapped_baseline;
mod open;
mod part_layout;
mod parts;
mod payload;
mod registration;
mod resident;
mod rows;
mod tensor_index;

#[cfg(feature = "mapped-baseline")]
pub use mapped_baseline::FileMapper;
pub use part_layout::{MatrixPart, PartLayout, Piece, StackLayout};
pub use parts::LoadedPart;
pub use resident::Stack;
pub use rows::LoadedRows;

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

/// Where one tensor's bytes are: a whole blob member, or the packed tensor of a tile container
/// (one tile per leading-dimension slice).
pub enum Location {
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
    #[cfg(feature = "mapped-baseline")]
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

pub fn invalid(path: &str, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::Invalid {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn tensor_err(name: &str, reason: String) -> ArtifactError {
    ArtifactError::Tensor {
        name: name.to_string(),
        reason,
    }
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
