//! Which layout an artifact directory is in, and what a manifest file is: the one place these
//! are recognised, so the runtime, offline verification and `minirun info` cannot disagree about
//! an artifact (each used to look for the same keys on its own).
//!
//! Three layouts exist, each described once in [`LAYOUTS`] (its name on the command line, its
//! name in words, the manifest that marks it, its spec), which layout detection, `minirun info`
//! and `minirun pack --layout` all read: minirun's own (`minirun pack`'s unit manifests), the
//! published Kimi K3 layout and the published DeepSeek V4 layout. A directory is recognised by
//! the manifest its layout always has: K3's `layer00/manifest.json` (a layer manifest), V4's
//! `global00/manifest.json`.

use super::v4_published::UnitKind;

/// Where the published Kimi K3 layout always has a layer manifest.
pub const K3_PROBE: &str = "layer00/manifest.json";

/// Where the published DeepSeek V4 layout always has a unit manifest.
pub const V4_PROBE: &str = "global00/manifest.json";

/// An artifact directory's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `minirun pack`'s: unit manifests with per-file SHA-256s.
    Own = 0,
    /// Kimi K3 as its publisher released it: row-band layer manifests, banded expert containers.
    K3Published = 1,
    /// DeepSeek V4 as its publisher released it: `layersNN` / `global00` / `mtpNN` units.
    V4Published = 2,
}

/// One layout, described once.
#[derive(Debug)]
pub struct LayoutRow {
    pub layout: Layout,
    /// Its name on the command line and in JSON (`minirun pack --layout NAME`).
    pub name: &'static str,
    /// Its name in words.
    pub described: &'static str,
    /// The manifest a directory in this layout always has (none for minirun's own, what a
    /// directory is when it has no other's).
    pub probe: Option<&'static str>,
    /// Its spec, from the repository's root.
    pub spec: &'static str,
}

/// Every layout, in [`Layout`]'s order.
pub const LAYOUTS: [LayoutRow; 3] = [
    LayoutRow {
        layout: Layout::Own,
        name: "minirun",
        described: "minirun's own layout",
        probe: None,
        spec: "docs/formats/artifact.md",
    },
    LayoutRow {
        layout: Layout::K3Published,
        name: "kimi-k3-published",
        described: "the published Kimi K3 layout",
        probe: Some(K3_PROBE),
        spec: "docs/formats/k3-published.md",
    },
    LayoutRow {
        layout: Layout::V4Published,
        name: "deepseek-v4-published",
        described: "the published DeepSeek V4 layout",
        probe: Some(V4_PROBE),
        spec: "docs/formats/v4-published.md",
    },
];

impl Layout {
    /// The layout of the directory whose metadata `read` returns (`None` for a file that does
    /// not exist). Reads at most the two probe manifests.
    pub fn detect<E>(
        mut read: impl FnMut(&str) -> Result<Option<Vec<u8>>, E>,
    ) -> Result<Layout, E> {
        if let Some(bytes) = read(K3_PROBE)?
            && ManifestKind::of(&bytes) == ManifestKind::K3Layer
        {
            return Ok(Layout::K3Published);
        }
        if read(V4_PROBE)?.is_some() {
            return Ok(Layout::V4Published);
        }
        Ok(Layout::Own)
    }

    /// The layout's row of [`LAYOUTS`].
    pub fn row(self) -> &'static LayoutRow {
        &LAYOUTS[self as usize]
    }

    /// The layout's name as people say it.
    pub fn describe(self) -> &'static str {
        self.row().described
    }

    /// The layout's name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The layout named `name` on the command line, if there is one.
    pub fn from_name(name: &str) -> Option<Layout> {
        LAYOUTS.iter().find(|r| r.name == name).map(|r| r.layout)
    }

    /// Whether its manifests carry per-file SHA-256s (only `minirun pack`'s do).
    pub fn has_own_digests(self) -> bool {
        self == Layout::Own
    }
}

/// What a manifest file is, from its bytes alone (its directory is the caller's to check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    /// A published Kimi K3 layer manifest: a JSON object with `layer` and `nonexpert`.
    K3Layer,
    /// A published DeepSeek V4 unit manifest: a JSON object with `files`, `source_revision` and
    /// a `unit` named `layersNN`, `global00` or `mtpNN`.
    V4Unit,
    /// Anything else (minirun's own unit manifests included; `parse_manifest` judges those).
    Other,
}

impl ManifestKind {
    pub fn of(bytes: &[u8]) -> ManifestKind {
        let Ok(serde_json::Value::Object(doc)) = serde_json::from_slice(bytes) else {
            return ManifestKind::Other;
        };
        if doc.contains_key("nonexpert") && doc.contains_key("layer") {
            return ManifestKind::K3Layer;
        }
        let v4_unit = doc
            .get("unit")
            .and_then(|u| u.as_str())
            .is_some_and(|u| UnitKind::of(u).is_some());
        if v4_unit && doc.contains_key("files") && doc.contains_key("source_revision") {
            return ManifestKind::V4Unit;
        }
        ManifestKind::Other
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn detect(files: &[(&str, &str)]) -> Layout {
        let files: BTreeMap<&str, &str> = files.iter().copied().collect();
        let read = |path: &str| Ok::<_, ()>(files.get(path).map(|s| s.as_bytes().to_vec()));
        Layout::detect(read).unwrap()
    }

    #[test]
    fn manifests_are_told_apart_by_their_keys() {
        let k3 = r#"{"layer": 0, "nonexpert": {}}"#;
        let v4 = r#"{"unit": "layers03", "files": [], "source_revision": "abc"}"#;
        assert_eq!(ManifestKind::of(k3.as_bytes()), ManifestKind::K3Layer);
        assert_eq!(ManifestKind::of(v4.as_bytes()), ManifestKind::V4Unit);
        for other in [
            r#"{"unit": "layer00", "files": [], "source_revision": "abc"}"#,
            r#"{"unit": "global00", "files": []}"#,
            r#"{"layer": 0}"#,
            r#"[{"layer": 0, "nonexpert": {}}]"#,
            "not json",
        ] {
            assert_eq!(
                ManifestKind::of(other.as_bytes()),
                ManifestKind::Other,
                "{other}"
            );
        }
    }

    #[test]
    fn a_directory_is_recognised_by_its_probe_manifest() {
        let k3 = r#"{"layer": 0, "nonexpert": {}}"#;
        assert_eq!(detect(&[(K3_PROBE, k3)]), Layout::K3Published);
        assert_eq!(detect(&[(V4_PROBE, "{}")]), Layout::V4Published);
        // minirun's own layer00 manifest is not a K3 layer manifest.
        assert_eq!(detect(&[(K3_PROBE, r#"{"unit": "layer00"}"#)]), Layout::Own);
        assert_eq!(detect(&[]), Layout::Own);
        assert!(!Layout::K3Published.has_own_digests());
        assert!(Layout::Own.has_own_digests());
    }

    #[test]
    fn a_read_error_is_the_callers() {
        let failing = |_: &str| Err::<Option<Vec<u8>>, _>("unreadable");
        assert_eq!(Layout::detect(failing), Err("unreadable"));
    }

    #[test]
    fn each_row_is_its_layouts_and_names_it_once() {
        for (i, row) in LAYOUTS.iter().enumerate() {
            assert_eq!(row.layout as usize, i, "{}", row.name);
            assert_eq!(row.layout.row().name, row.name);
            assert_eq!(row.layout.name(), row.name);
            assert_eq!(Layout::from_name(row.name), Some(row.layout));
            assert_eq!(row.probe.is_some(), row.layout != Layout::Own);
        }
        assert_eq!(Layout::K3Published.name(), "kimi-k3-published");
        assert_eq!(Layout::V4Published.name(), "deepseek-v4-published");
        assert_eq!(Layout::Own.name(), "minirun");
        assert_eq!(LAYOUTS[1].probe, Some(K3_PROBE));
        assert_eq!(LAYOUTS[2].probe, Some(V4_PROBE));
        assert_eq!(Layout::from_name("kimi-k3"), None);
        assert_eq!(Layout::from_name(""), None);
    }

    #[test]
    fn every_layouts_spec_is_in_the_repository() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for row in &LAYOUTS {
            let spec = std::fs::read_to_string(root.join(row.spec)).unwrap();
            assert!(spec.starts_with('#'), "{}", row.spec);
        }
    }

    #[test]
    fn each_layout_is_described_by_name() {
        assert_eq!(Layout::Own.describe(), "minirun's own layout");
        assert_eq!(
            Layout::K3Published.describe(),
            "the published Kimi K3 layout"
        );
        assert_eq!(
            Layout::V4Published.describe(),
            "the published DeepSeek V4 layout"
        );
    }
}
