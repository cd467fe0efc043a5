//! The artifact layout: what a packed (or published) artifact directory holds and how its
//! metadata is written. One owner for these rules, so the packer that writes an artifact and
//! every reader (verification, `check`, the runtime) agree on them.
//!
//! ```text
//! <artifact>/
//!   index.json                  the artifact's identity and totals ([`index_writer`], `crate::index`)
//!   config.json, tokenizer...   the upstream's root files, verbatim
//!   <unit>/manifest.json        one per unit ([`manifest`])
//!   <unit>/<payload files>      tile containers and plain-stream blobs
//!   .minirun-pack-incomplete    present only while a pack is writing ([`INCOMPLETE_MARKER`])
//! ```
//!
//! Pure rules and types only: the I/O that applies them (rooted, no-follow opens) lives in
//! `minirun-store`. Spec: `docs/formats/artifact.md`.

pub mod index_writer;
pub mod k3_published;
pub mod layout;
pub mod manifest;
mod units;
pub mod v4_published;

pub use layout::{LAYOUTS, Layout, LayoutRow, ManifestKind};
pub use manifest::{FileEntry, Member, QuantRole, Quantization, SourceRef, UnitManifest};
pub use units::{
    INCOMPLETE_MARKER, INDEX_FILE, MANIFEST_FILE, MAX_MANIFEST_BYTES, ManifestError,
    is_member_file_name, is_unit_name, manifest_path, parse_manifest, unit_of,
};
