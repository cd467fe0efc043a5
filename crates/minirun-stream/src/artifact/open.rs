//! Opening an artifact: the metadata read fail-closed, every unit manifest's files registered,
//! every container header checked against its file length and manifest entry, and a published
//! layout handed to the reader its architecture registered.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use crate::read_clock::ReadClock;
use minirun_format::artifact::{FileEntry, Layout};
use minirun_format::index::ArtifactIndex;
use minirun_format::tile::{HEADER_BYTES, TileContainer};
use minirun_kernels::Activations;
use minirun_store::{ArtifactFiles, BufferPool};

use super::{Access, Artifact, ArtifactError, Location, PayloadEntry, PublishedReader, invalid};

/// The most payload an artifact's manifests may list (4 EiB): thousands of times any model.
pub(super) const MAX_ARTIFACT_BYTES: u64 = 1 << 62;

/// The largest metadata file read (config, tokenizer): far above any real one, and a bound on
/// what a hostile directory can make this process allocate.
pub(super) const METADATA_LIMIT: u64 = 256 << 20;

impl Access {
    pub(super) fn files(self, root: &Path) -> Result<ArtifactFiles, ArtifactError> {
        match self {
            Access::Verified(held) => Ok(ArtifactFiles::Verified(held)),
            Access::Unverified => Ok(ArtifactFiles::unverified(root)?),
        }
    }

    pub(super) fn provenance(&self) -> String {
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
pub(super) fn read_metadata(
    files: &ArtifactFiles,
    path: &str,
) -> Result<Option<Vec<u8>>, ArtifactError> {
    Ok(files
        .read_metadata(path, METADATA_LIMIT)?
        .map(|read| read.bytes))
}

pub(super) fn text(path: &str, bytes: Vec<u8>) -> Result<String, ArtifactError> {
    String::from_utf8(bytes).map_err(|_| invalid(path, "is not UTF-8"))
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
            #[cfg(feature = "mapped-baseline")]
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

    pub(super) fn add_file(&mut self, unit: &str, entry: &FileEntry) -> Result<(), ArtifactError> {
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
}
