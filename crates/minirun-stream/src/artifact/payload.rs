//! The payload files: opened once, through the evidence where there is one, their lengths
//! checked against the manifests, and read at byte offsets into aligned buffers.

use minirun_store::{AlignedBuf, PayloadFile};

use super::{Artifact, ArtifactError, invalid};

impl Artifact {
    /// The file's open handle, its length checked against the manifest on the first open.
    pub(super) fn handle(&self, file: usize) -> Result<&PayloadFile, ArtifactError> {
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

    /// `len` bytes at `offset` of payload file `file`, read now into an aligned buffer (kept as
    /// it is: a copy would double a large file's memory while it is made).
    pub(super) fn read_aligned(
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

    /// The evidence the artifact was opened through, if it was.
    pub fn evidence(&self) -> Option<&minirun_store::Evidence> {
        self.files.held().map(|held| held.evidence())
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
}
