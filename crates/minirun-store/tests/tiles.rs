//! Tiles read through held evidence: the tile SHA-256 is skipped only under a full
//! verification of the pinned repository and revision; lengths and geometry are always checked.

use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use minirun_format::tree::{FileDigest, RepoFile, Tree};
use minirun_store::{HeldEvidence, SealKey, StoreError, TileReadError, TileRequest, verify};

/// This test binary's evidence key (the user's own stays untouched).
fn key() -> SealKey {
    SealKey::load_or_create(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("tiles-tests.key"))
        .unwrap()
}
use sha2::Digest as _;

const PIN: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "team/tiny-minirun";
const PATH: &str = "layer00/layer00-w1.mxfp4tile";

fn artifact(dir: &Path) -> (Tree, minirun_format::tile::TileContainer) {
    fs::create_dir_all(dir.join("layer00")).unwrap();
    let file = fs::File::create(dir.join(PATH)).unwrap();
    let (_, container) =
        minirun_format::synthetic::write_mxfp4_container(file, 512, 1024, 3, 9, true, |_| {})
            .unwrap();
    let content = fs::read(dir.join(PATH)).unwrap();
    let mut files = std::collections::BTreeMap::new();
    files.insert(
        PATH.to_string(),
        RepoFile {
            path: PATH.into(),
            size: content.len() as u64,
            digest: FileDigest::Sha256(sha2::Sha256::digest(&content).into()),
        },
    );
    let tree = Tree {
        repo: REPO.into(),
        revision: PIN.into(),
        files,
    };
    (tree, container)
}

#[test]
fn the_digest_is_skipped_only_under_held_authority_and_lengths_and_geometry_always_count() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, container) = artifact(dir.path());
    verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    let held = HeldEvidence::load(dir.path(), &key()).unwrap();
    let size = tree.files[PATH].size;
    let request = TileRequest {
        path: PATH,
        manifest_bytes: size,
        geometry: container.geometry,
        repo: REPO,
        revision: PIN,
    };
    let trusted = held.load_tile(&request, 2).unwrap();
    assert!(
        !trusted.digest_checked,
        "full evidence of the pinned revision"
    );
    assert_eq!(trusted.bytes.len() as u64, container.layout.tile_stride);
    let start = container.tile_range(2).unwrap().start as usize;
    let content = fs::read(dir.path().join(PATH)).unwrap();
    assert_eq!(trusted.bytes, content[start..start + trusted.bytes.len()]);

    let other = TileRequest {
        revision: &"f".repeat(40),
        ..request
    };
    assert!(
        held.load_tile(&other, 2).unwrap().digest_checked,
        "another revision: re-hashed"
    );

    let wrong_len = TileRequest {
        manifest_bytes: size + 1,
        ..request
    };
    assert!(matches!(
        held.load_tile(&wrong_len, 0),
        Err(TileReadError::Length {
            what: "the manifest",
            ..
        })
    ));
    let mut geometry = container.geometry;
    geometry.rows *= 2;
    let wrong_geometry = TileRequest {
        geometry,
        ..request
    };
    assert!(matches!(
        held.load_tile(&wrong_geometry, 0),
        Err(TileReadError::Geometry { .. })
    ));
    assert!(matches!(
        held.load_tile(&request, 3),
        Err(TileReadError::Container { .. })
    ));

    // A tile changed after verification: the identity recheck refuses the open.
    let mut bytes = content;
    bytes[start] ^= 1;
    fs::write(dir.path().join(PATH), bytes).unwrap();
    assert!(matches!(
        held.load_tile(&request, 2),
        Err(TileReadError::Store(StoreError::Changed { .. }))
    ));
}
