//! Units: which directories of an artifact are units, which unit a tensor belongs to, and the
//! checks every reader applies to a unit manifest before trusting a field of it.

use std::collections::BTreeSet;

use super::manifest::UnitManifest;

/// The artifact's root metadata document.
pub const INDEX_FILE: &str = "index.json";

/// Every unit directory holds one.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Present in an artifact directory while a pack is writing it; its absence (with index.json
/// present) is what says an artifact is complete.
pub const INCOMPLETE_MARKER: &str = ".minirun-pack-incomplete";

/// The largest unit manifest a reader accepts: far above any real one (a 384-expert layer's is
/// under 1 MB), and a bound on what a hostile directory can make a reader allocate.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// Why a unit manifest is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{path} is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { path: String },
    #[error("{path} is not a unit manifest: {reason}")]
    NotAManifest { path: String, reason: String },
    #[error("{path} names unit {named:?}, but it is in the directory {unit:?}")]
    WrongUnit {
        path: String,
        unit: String,
        named: String,
    },
    #[error("{path} lists {name:?}, which is not a plain file name inside its unit")]
    BadFileName { path: String, name: String },
    #[error("{path} lists {name:?} twice")]
    DuplicateFile { path: String, name: String },
}

/// `model.layers.7.mlp...` -> `layer07`; anything outside a layer -> `global`.
pub fn unit_of(name: &str) -> String {
    let mut parts = name.split('.');
    while let Some(part) = parts.next() {
        if part == "layers"
            && let Some(n) = parts.next().and_then(|n| n.parse::<u32>().ok())
        {
            return format!("layer{n:02}");
        }
    }
    "global".to_string()
}

/// Whether a directory entry of the artifact root may be a unit: a plain, visible name (the
/// dot-folders are minirun's own: evidence, partial downloads).
pub fn is_unit_name(name: &str) -> bool {
    is_member_file_name(name) && !name.starts_with('.')
}

/// Whether a manifest's file name names a file directly inside its unit.
pub fn is_member_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains(['/', '\\', '\0'])
}

/// `<unit>/manifest.json`.
pub fn manifest_path(unit: &str) -> String {
    format!("{unit}/{MANIFEST_FILE}")
}

/// Parses the manifest of the unit directory `unit`: bounded, the unit it names must be its
/// directory's, and every file it lists a distinct plain name inside the unit.
pub fn parse_manifest(unit: &str, bytes: &[u8]) -> Result<UnitManifest, ManifestError> {
    let path = manifest_path(unit);
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge { path });
    }
    let manifest: UnitManifest =
        serde_json::from_slice(bytes).map_err(|e| ManifestError::NotAManifest {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if manifest.unit != unit {
        return Err(ManifestError::WrongUnit {
            path,
            unit: unit.to_string(),
            named: manifest.unit,
        });
    }
    let mut seen = BTreeSet::new();
    for file in &manifest.files {
        let name = file.name();
        if !is_member_file_name(name) || name == MANIFEST_FILE {
            return Err(ManifestError::BadFileName {
                path,
                name: name.to_string(),
            });
        }
        if !seen.insert(name) {
            return Err(ManifestError::DuplicateFile {
                path,
                name: name.to_string(),
            });
        }
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_belong_to_their_layer_or_to_global() {
        assert_eq!(unit_of("model.layers.7.mlp.gate_proj.weight"), "layer07");
        assert_eq!(
            unit_of("model.layers.61.self_attn.q_a_proj.weight"),
            "layer61"
        );
        assert_eq!(unit_of("model.embed_tokens.weight"), "global");
        assert_eq!(unit_of("model.layers.x.norm"), "global");
    }

    #[test]
    fn manifests_are_refused_for_what_would_mislead_a_reader() {
        let ok = br#"{"unit":"layer00","files":[]}"#;
        assert!(parse_manifest("layer00", ok).is_ok());
        assert!(matches!(
            parse_manifest("layer01", ok),
            Err(ManifestError::WrongUnit { .. })
        ));
        assert!(matches!(
            parse_manifest("layer00", b"{"),
            Err(ManifestError::NotAManifest { .. })
        ));
        let blob = |name: &str| {
            format!(r#"{{"kind":"blob","name":"{name}","bytes":0,"sha256":"","members":[]}}"#)
        };
        let with =
            |files: &[String]| format!(r#"{{"unit":"layer00","files":[{}]}}"#, files.join(","));
        for bad in ["../x", "a/b", "", "manifest.json"] {
            let doc = with(&[blob(bad)]);
            assert!(
                matches!(
                    parse_manifest("layer00", doc.as_bytes()),
                    Err(ManifestError::BadFileName { .. })
                ),
                "{bad:?}"
            );
        }
        let twice = with(&[blob("a.blob"), blob("a.blob")]);
        assert!(matches!(
            parse_manifest("layer00", twice.as_bytes()),
            Err(ManifestError::DuplicateFile { .. })
        ));
        let unknown_mode = with(&[r#"{"kind":"tile-container","name":"w.tile","bytes":1,"sha256":"","layout":"nf4","scheme":"x","rows":1,"cols":1,"count":1,"element_bits":4,"group":32,"block_rows":1,"scale_dtype":"float16","packed":{"source_tensor":"w","dtype":"U8","shape":[1],"shard":"s","shard_offset":0,"bytes":1},"scales":{"source_tensor":"s","dtype":"U8","shape":[1],"shard":"s","shard_offset":0,"bytes":1}}"#.to_string()]);
        assert!(matches!(
            parse_manifest("layer00", unknown_mode.as_bytes()),
            Err(ManifestError::NotAManifest { .. })
        ));
        assert!(is_unit_name("layer00") && !is_unit_name(".minirun") && !is_unit_name("a/b"));
    }

    #[test]
    fn a_units_manifest_is_its_manifest_json() {
        assert_eq!(manifest_path("layer07"), "layer07/manifest.json");
    }

    /// A valid manifest padded with whitespace to `len` bytes.
    fn manifest_of_length(len: usize) -> Vec<u8> {
        let mut doc = br#"{"unit":"layer00","files":[]}"#.to_vec();
        doc.resize(len, b' ');
        doc
    }

    #[test]
    fn a_manifest_of_the_largest_accepted_size_is_read() {
        let doc = manifest_of_length(MAX_MANIFEST_BYTES as usize);
        assert_eq!(
            parse_manifest("layer00", &doc),
            Ok(UnitManifest {
                unit: "layer00".to_string(),
                source_repo: None,
                source_revision: None,
                files: vec![],
            })
        );
    }

    #[test]
    fn a_manifest_one_byte_over_the_limit_is_too_large() {
        let doc = manifest_of_length(MAX_MANIFEST_BYTES as usize + 1);
        assert_eq!(
            parse_manifest("layer00", &doc),
            Err(ManifestError::TooLarge {
                path: "layer00/manifest.json".to_string()
            })
        );
    }

    #[test]
    fn a_manifest_of_distinct_files_is_read() {
        let doc = br#"{"unit":"layer00","files":[
            {"kind":"blob","name":"a.blob","bytes":7,"sha256":"aa","members":[]},
            {"kind":"blob","name":"b.blob","bytes":9,"sha256":"bb","members":[]}]}"#;
        let manifest = parse_manifest("layer00", doc).expect("two distinct files");
        let names: Vec<&str> = manifest.files.iter().map(|f| f.name()).collect();
        assert_eq!(names, ["a.blob", "b.blob"]);
    }
}
