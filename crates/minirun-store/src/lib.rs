//! minirun's verified store. A positive verification is evidence for one publication (repo,
//! pinned revision, tree) and one set of filesystem objects (device, inode, size, nanosecond
//! mtime and ctime), not a label on a folder name. Every file is opened beneath a held root
//! without following symbolic links; readers open only evidenced files and recheck each
//! file's identity on every open.
//!
//! The evidence format is specified in `docs/formats/evidence.md`.

mod artifact_files;
pub mod checkpoint;
pub mod evidence;
mod held;
mod identity;
mod payload;
mod root;
pub mod seal;
mod signed;
mod sole_writer;
mod tiles;
mod verify;

pub use artifact_files::{ArtifactFiles, LayoutError, Metadata, own_manifest_tree, read_bounded};
pub use evidence::{Evidence, EvidenceFile, Origin, SignerRecord, tree_identity};
pub use held::{HeldEvidence, StoreError};
pub use identity::FileIdentity;
pub use payload::{AlignedBuf, BufferPool, PayloadFile, ReadPath, SLOT_ALIGN};
pub use root::{EntryKind, OpenError, Root};
pub use seal::{KeyError, SealKey};
pub use signed::{SignedError, signed_tree, statement_of};
pub use tiles::{LoadedTile, TileReadError, TileRequest};
pub use verify::{
    Authority, Sealing, Selection, SourcedFile, Verified, VerifyError, verify, verify_signed,
    verify_sourced, verify_with,
};
