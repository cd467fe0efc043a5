//! The page-cache baseline's hook (feature `mapped-baseline`): container files mapped whole
//! instead of read, so that the kernel decides what stays in memory, as mmap-based runtimes
//! run a model larger than memory. Nothing in minirun's own commands enables it.

use std::path::Path;

use super::{Artifact, ArtifactError, invalid};

/// Maps one whole payload file (given its path) into memory; see
/// [`Artifact::map_containers_unverified`].
pub type FileMapper =
    dyn Fn(&Path) -> std::io::Result<Box<dyn AsRef<[u8]> + Send + Sync>> + Send + Sync;

/// A mapped file's bytes.
pub(super) type MappedFile = Box<dyn AsRef<[u8]> + Send + Sync>;

impl Artifact {
    /// Resident matrices of tile containers come from `mapper`'s map of each whole file instead
    /// of a read into memory, for a baseline that measures what the kernel's page cache does with
    /// a model larger than memory (as mmap-based runtimes run one). The mapped bytes are not
    /// checked against any evidence, and may change under the run if the file does: so this is
    /// refused for a verified artifact.
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

    /// Container file `file`, whole, mapped, when a mapper was given.
    pub(super) fn mapped_file(&self, file: usize) -> Result<Option<MappedFile>, ArtifactError> {
        let Some(mapper) = &self.mapper else {
            return Ok(None);
        };
        let entry = &self.payload[file];
        let map = mapper(&self.root.join(&entry.path))
            .map_err(|e| invalid(&entry.path, format!("cannot be mapped: {e}")))?;
        let len = (*map).as_ref().len() as u64;
        if len != entry.bytes {
            return Err(invalid(
                &entry.path,
                format!("maps {len} bytes, its manifest says {}", entry.bytes),
            ));
        }
        Ok(Some(map))
    }
}
