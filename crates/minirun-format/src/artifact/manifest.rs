//! `<unit>/manifest.json`: every payload file of a unit, its geometry, its source tensors and
//! its SHA-256. Specified in `docs/formats/artifact.md`. Quantization modes and scale types are
//! the tile container's own enums, so a manifest that names one this build does not know is
//! refused when it is parsed, not when a kernel meets a string.

use serde::{Deserialize, Serialize};

use crate::tile::{QuantMode, ScaleDtype};

/// Where some bytes came from in the upstream checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    pub source_tensor: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// The shard file the tensor is in.
    pub shard: String,
    /// Byte offset of the tensor's data in the shard.
    pub shard_offset: u64,
    pub bytes: u64,
}

/// How a quantized tensor is encoded (recorded for tile containers and for quantized
/// tensors stored as plain streams).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantization {
    pub scheme: String,
    pub layout: QuantMode,
    pub element_bits: u32,
    pub group: u32,
    pub block_rows: u32,
    pub scale_dtype: ScaleDtype,
    pub role: QuantRole,
}

/// Which part of a quantized matrix a plain-stream member holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuantRole {
    Packed,
    Scales,
    Biases,
}

/// One tensor inside a blob: its bytes lie at `offset..offset + bytes` of the blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    #[serde(flatten)]
    pub source: SourceRef,
    pub offset: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quantization: Option<Quantization>,
    /// Why a quantized tensor is a plain stream instead of a tile container.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub not_tiled: Option<String>,
}

/// One payload file of a unit. (A manifest holds a few of these; boxing the larger
/// variant would only complicate the serialized form's code.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FileEntry {
    TileContainer {
        name: String,
        bytes: u64,
        sha256: String,
        layout: QuantMode,
        scheme: String,
        rows: u32,
        cols: u32,
        /// Tiles: one per expert, or 1 for a single matrix.
        count: u32,
        element_bits: u32,
        group: u32,
        block_rows: u32,
        scale_dtype: ScaleDtype,
        packed: SourceRef,
        scales: SourceRef,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        biases: Option<SourceRef>,
    },
    Blob {
        name: String,
        bytes: u64,
        sha256: String,
        members: Vec<Member>,
    },
}

impl FileEntry {
    pub fn name(&self) -> &str {
        match self {
            FileEntry::TileContainer { name, .. } | FileEntry::Blob { name, .. } => name,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            FileEntry::TileContainer { bytes, .. } | FileEntry::Blob { bytes, .. } => *bytes,
        }
    }

    pub fn sha256(&self) -> &str {
        match self {
            FileEntry::TileContainer { sha256, .. } | FileEntry::Blob { sha256, .. } => sha256,
        }
    }
}

/// `<unit>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitManifest {
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_repo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_revision: Option<String>,
    pub files: Vec<FileEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blobs_length_and_digest_are_its_own() {
        let entry: FileEntry = serde_json::from_str(
            r#"{"kind":"blob","name":"a.blob","bytes":7,"sha256":"ab12","members":[]}"#,
        )
        .expect("a blob entry");
        assert_eq!(
            (entry.name(), entry.bytes(), entry.sha256()),
            ("a.blob", 7, "ab12")
        );
    }

    #[test]
    fn a_tile_containers_length_and_digest_are_its_own() {
        let source = r#"{"source_tensor":"w","dtype":"U8","shape":[1],"shard":"s","shard_offset":0,"bytes":1}"#;
        let entry: FileEntry = serde_json::from_str(&format!(
            r#"{{"kind":"tile-container","name":"w.tile","bytes":32768,"sha256":"cd34","layout":"mxfp4","scheme":"x","rows":1,"cols":32,"count":1,"element_bits":4,"group":32,"block_rows":1,"scale_dtype":"uint8-e8m0","packed":{source},"scales":{source}}}"#
        ))
        .expect("a tile container entry");
        assert_eq!(
            (entry.name(), entry.bytes(), entry.sha256()),
            ("w.tile", 32768, "cd34")
        );
    }
}
