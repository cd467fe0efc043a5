//! What the reader of a published layout (in its architecture's folder, `models/<arch>/
//! published_layout.rs`) registers tensors through: payload files, blob members, container
//! headers and tensor locations. Only the artifact touches its tables; a reader says what it
//! found, and a tensor named twice is refused here as in the own layout.

use std::sync::OnceLock;

use minirun_format::artifact::Member;
use minirun_format::tile::TileContainer;

use super::open::read_metadata;
use super::{Artifact, ArtifactError, Location, PayloadEntry, invalid};

impl Artifact {
    /// A metadata file of the artifact (`None` when it has none), read as `config.json` is.
    pub fn metadata(&self, path: &str) -> Result<Option<Vec<u8>>, ArtifactError> {
        read_metadata(&self.files, path)
    }

    /// The length of payload file `file`, as its manifest (or its open handle) gives it.
    pub fn file_bytes(&self, file: usize) -> u64 {
        self.payload[file].bytes
    }

    /// The checked header of payload file `file`, when it is a tile container.
    pub fn container(&self, file: usize) -> Option<&TileContainer> {
        self.payload[file].container.as_deref()
    }

    /// Records the header of payload file `file`, checked by the caller against its entry.
    pub fn set_container(&mut self, file: usize, container: TileContainer) {
        self.payload[file].container = Some(Box::new(container));
    }

    /// A payload file the artifact's manifests do not list with a length: opened now, its
    /// length taken from the open file.
    pub fn add_unlisted_file(&mut self, path: &str) -> Result<usize, ArtifactError> {
        let handle = self.files.open_streamed(path)?;
        let file = self.payload.len();
        self.payload.push(PayloadEntry {
            path: path.to_string(),
            bytes: handle.len(),
            container: None,
            handle: OnceLock::new(),
            resident: OnceLock::new(),
        });
        let _ = self.payload[file].handle.set(handle);
        Ok(file)
    }

    pub fn add_listed_file(&mut self, path: &str, bytes: u64) -> usize {
        self.payload.push(PayloadEntry {
            path: path.to_string(),
            bytes,
            container: None,
            handle: OnceLock::new(),
            resident: OnceLock::new(),
        });
        self.payload.len() - 1
    }

    pub fn add_member(&mut self, file: usize, m: Member) -> Result<(), ArtifactError> {
        let path = self.payload[file].path.clone();
        let name = m.source.source_tensor.clone();
        let location = Location::Member {
            file,
            member: Box::new(m),
            resident: OnceLock::new(),
        };
        self.insert(&path, &name, location)
    }
}

impl Artifact {
    pub fn insert(
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

    /// `len` bytes at `offset` of payload file `file`, read now.
    pub fn read_vec(&self, file: usize, offset: u64, len: u64) -> Result<Vec<u8>, ArtifactError> {
        Ok(self.read_aligned(file, offset, len)?.as_slice().to_vec())
    }
}
