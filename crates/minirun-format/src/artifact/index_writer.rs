//! The `index.json` a pack writes: the single-source-units shape (spec:
//! `docs/formats/index-json.md`), with the tokenizer and configuration identities when the
//! upstream's repository and pinned revision are known. [`crate::index`] reads every shape;
//! this writes the one minirun produces.

use serde_json::{Value, json};

/// `format` of a minirun pack.
pub const FORMAT: &str = "quantized_tile_container";
/// `format_version` of a minirun pack.
pub const FORMAT_VERSION: u64 = 1;
/// `relationship` of a minirun pack: only headers and zero padding are not the upstream's bytes.
pub const RELATIONSHIP: &str = "byte_preserving_repack";

/// One `units[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitTotals {
    pub unit: String,
    pub files: usize,
    pub bytes: u64,
}

/// A root file pinned by its length and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootFileIdentity {
    pub file: String,
    pub bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// Who published the upstream checkpoint, and the root files that identify its configuration
/// and tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub repo: String,
    pub revision: String,
    pub configuration: RootFileIdentity,
    /// The tokenizer file and the licence file it is published under; `None` when the
    /// checkpoint has no tokenizer file or no licence file (the identity then is absent, never
    /// made up).
    pub tokenizer: Option<(RootFileIdentity, String)>,
}

/// Everything a pack's `index.json` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackIndex {
    pub units: Vec<UnitTotals>,
    pub total_bytes: u64,
    pub provenance: Option<Provenance>,
}

impl PackIndex {
    /// The document as JSON.
    pub fn to_value(&self) -> Value {
        let units: Vec<Value> = self
            .units
            .iter()
            .map(|u| json!({ "unit": u.unit, "files": u.files, "bytes": u.bytes }))
            .collect();
        let mut index = json!({
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "relationship": RELATIONSHIP,
            "units": units,
            "total_bytes": self.total_bytes,
        });
        let Some(p) = &self.provenance else {
            return index;
        };
        let identity = |id: &RootFileIdentity| {
            json!({ "file": id.file, "bytes": id.bytes, "sha256": id.sha256,
                    "source_repo": p.repo, "source_revision": p.revision })
        };
        index["source_repo"] = json!(p.repo);
        index["source_revision"] = json!(p.revision);
        index["configuration"] = identity(&p.configuration);
        if let Some((tokenizer, license)) = &p.tokenizer {
            let mut t = identity(tokenizer);
            t["license"] = json!(license);
            index["tokenizer"] = t;
        }
        index
    }

    /// The document as written: pretty JSON and a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(&self.to_value()).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

/// Whether `bytes` are an `index.json` that a minirun pack wrote (by its format and
/// relationship), as opposed to anything else a directory might hold.
pub fn is_pack_index(bytes: &[u8]) -> bool {
    let Ok(index) = serde_json::from_slice::<Value>(bytes) else {
        return false;
    };
    index.get("relationship").and_then(Value::as_str) == Some(RELATIONSHIP)
        && index.get("format").and_then(Value::as_str) == Some(FORMAT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{ArtifactIndex, IndexShape};

    fn id(file: &str) -> RootFileIdentity {
        RootFileIdentity {
            file: file.into(),
            bytes: 12,
            sha256: "ab".repeat(32),
        }
    }

    #[test]
    fn the_reader_reads_what_the_writer_writes() {
        let index = PackIndex {
            units: vec![UnitTotals {
                unit: "layer00".into(),
                files: 2,
                bytes: 40_000,
            }],
            total_bytes: 40_000,
            provenance: Some(Provenance {
                repo: "owner/model".into(),
                revision: "a".repeat(40),
                configuration: id("config.json"),
                tokenizer: Some((id("tokenizer.json"), "LICENSE".into())),
            }),
        };
        let bytes = index.to_bytes();
        assert!(is_pack_index(&bytes));
        let read = ArtifactIndex::parse(&bytes);
        assert_eq!(read.shape, IndexShape::SingleSourceUnits);
        assert_eq!(read.sources[0].repo, "owner/model");
        assert_eq!(read.units[0].bytes, Some(40_000));
        assert!(
            matches!(read.tokenizer, Some(Ok(_))),
            "{:?}",
            read.tokenizer
        );
        assert!(matches!(read.configuration, Some(Ok(_))));
        assert!(!is_pack_index(br#"{"format": "quantized_tile_container"}"#));
    }
}
