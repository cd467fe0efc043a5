//! The one reader of an artifact's layout: units are real directories (a link is not one), a
//! manifest is opened without following links and read bounded, and a directory still being
//! packed is refused.

use std::fs;

use minirun_format::artifact::{INCOMPLETE_MARKER, MAX_MANIFEST_BYTES};
use minirun_store::{ArtifactFiles, LayoutError, OpenError};

const MANIFEST: &str = r#"{"unit":"layer00","files":[{"kind":"blob","name":"layer00-plain.blob","bytes":3,"sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","members":[]}]}"#;

fn artifact() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("layer00")).unwrap();
    fs::write(dir.path().join("layer00/manifest.json"), MANIFEST).unwrap();
    fs::write(dir.path().join("layer00/layer00-plain.blob"), b"abc").unwrap();
    fs::write(dir.path().join("index.json"), b"{}").unwrap();
    dir
}

#[test]
fn units_are_the_real_directories_holding_a_manifest() {
    let dir = artifact();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::create_dir(elsewhere.path().join("layer01")).unwrap();
    fs::write(
        elsewhere.path().join("layer01/manifest.json"),
        MANIFEST.replace("layer00", "layer01"),
    )
    .unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("layer01"), dir.path().join("layer01"))
        .unwrap();
    fs::create_dir(dir.path().join("empty")).unwrap();
    fs::create_dir(dir.path().join(".minirun")).unwrap();
    let files = ArtifactFiles::unverified(dir.path()).unwrap();
    files.check_complete().unwrap();
    let units = files.unit_manifests().unwrap();
    let names: Vec<&str> = units.iter().map(|m| m.unit.as_str()).collect();
    assert_eq!(names, ["layer00"], "the linked unit is not read");

    std::os::unix::fs::symlink(
        elsewhere.path().join("layer01/manifest.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let tree = minirun_store::own_manifest_tree(dir.path()).unwrap();
    assert_eq!(
        tree.files.keys().collect::<Vec<_>>(),
        [
            "index.json",
            "layer00/layer00-plain.blob",
            "layer00/manifest.json"
        ],
        "the payload, the root's regular files and the manifests; no link"
    );
}

#[test]
fn a_linked_or_oversized_manifest_is_refused() {
    let dir = artifact();
    let manifest = dir.path().join("layer00/manifest.json");
    let real = dir.path().join("real.json");
    fs::rename(&manifest, &real).unwrap();
    std::os::unix::fs::symlink(&real, &manifest).unwrap();
    let files = ArtifactFiles::unverified(dir.path()).unwrap();
    assert!(matches!(
        files.unit_manifests(),
        Err(LayoutError::Open(OpenError::SymbolicLink { .. }))
    ));

    fs::remove_file(&manifest).unwrap();
    let huge = fs::File::create(&manifest).unwrap();
    huge.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
    assert!(matches!(
        files.unit_manifests(),
        Err(LayoutError::TooLarge { .. })
    ));
}

#[test]
fn an_interrupted_pack_or_a_missing_index_is_not_an_artifact() {
    let dir = artifact();
    fs::write(dir.path().join(INCOMPLETE_MARKER), b"").unwrap();
    let files = ArtifactFiles::unverified(dir.path()).unwrap();
    assert!(matches!(
        files.check_complete(),
        Err(LayoutError::Incomplete { reason, .. }) if reason.contains("interrupted")
    ));
    fs::remove_file(dir.path().join(INCOMPLETE_MARKER)).unwrap();
    fs::remove_file(dir.path().join("index.json")).unwrap();
    assert!(matches!(
        files.check_complete(),
        Err(LayoutError::Incomplete { reason, .. }) if reason.contains("index.json")
    ));
}

#[test]
fn manifests_without_digests_send_the_user_to_the_publisher() {
    let dir = artifact();
    fs::write(
        dir.path().join("layer00/manifest.json"),
        br#"{"layer": 0, "experts": []}"#,
    )
    .unwrap();
    let err = minirun_store::own_manifest_tree(dir.path()).unwrap_err();
    assert!(matches!(err, LayoutError::NoOwnDigests { .. }), "{err}");
    assert!(err.to_string().contains("--repo"), "{err}");
}

#[test]
fn a_published_layout_is_named_when_it_has_no_digests() {
    let dir = artifact();
    fs::write(
        dir.path().join("layer00/manifest.json"),
        br#"{"layer": 0, "nonexpert": {}}"#,
    )
    .unwrap();
    let files = minirun_store::ArtifactFiles::unverified(dir.path()).unwrap();
    assert_eq!(
        files.layout().unwrap(),
        minirun_format::artifact::Layout::K3Published
    );
    let err = minirun_store::own_manifest_tree(dir.path()).unwrap_err();
    assert!(matches!(err, LayoutError::NoOwnDigests { .. }), "{err}");
    assert!(
        err.to_string().contains("published Kimi K3 layout"),
        "{err}"
    );
}

#[test]
fn offline_verification_refuses_an_index_json_that_is_not_an_index() {
    let dir = artifact();
    fs::write(dir.path().join("index.json"), b"not json at all").unwrap();
    let err = minirun_store::own_manifest_tree(dir.path()).unwrap_err();
    assert!(matches!(err, LayoutError::NotAnIndex { .. }), "{err}");
}
