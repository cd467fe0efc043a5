//! The artifact's side of a signed statement: the statement lists every file no manifest
//! digests, hashed (digests computed with Python's hashlib), and a verified statement vouches
//! for exactly those files, the payload its manifests record, and the statement and signature.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use minirun_format::tree::FileDigest;
use minirun_sign::{Identity, Listed, SIGNATURE_FILE, STATEMENT_FILE, Statement};
use minirun_store::{SignedError, signed_tree, statement_of};

const MANIFEST: &str = r#"{"unit":"layer00","files":[{"kind":"blob","name":"layer00-plain.blob","bytes":3,"sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","members":[]}]}"#;
const CONFIG: &[u8] = b"{\"model_type\": \"x\"}\n";

fn artifact() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("layer00")).unwrap();
    fs::write(dir.path().join("layer00/manifest.json"), MANIFEST).unwrap();
    fs::write(dir.path().join("layer00/layer00-plain.blob"), b"abc").unwrap();
    fs::write(dir.path().join("index.json"), b"{}").unwrap();
    fs::write(dir.path().join("config.json"), CONFIG).unwrap();
    // A statement and signature already beside the artifact are not listed in a new one.
    fs::write(dir.path().join(STATEMENT_FILE), b"old statement").unwrap();
    fs::write(dir.path().join(SIGNATURE_FILE), b"old signature").unwrap();
    dir
}

fn sha(hex: &str) -> [u8; 32] {
    let bytes: Vec<u8> = (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

fn listed(size: u64, hex: &str) -> Listed {
    Listed {
        size,
        sha256: sha(hex),
    }
}

fn identity() -> Identity {
    Identity {
        repo: "team/model".into(),
        revision: "0123456789abcdef0123456789abcdef01234567".into(),
    }
}

#[test]
fn a_statement_lists_every_file_but_payload_statement_and_signature_with_its_digest() {
    let dir = artifact();
    let statement = statement_of(dir.path(), Some(identity())).unwrap();
    let expected = BTreeMap::from([
        (
            "config.json".to_string(),
            listed(
                20,
                "8575c51f02273b9201e4a6e8800e1f1dd62c6dd0eff6696dd0d0038c02c03da8",
            ),
        ),
        (
            "index.json".to_string(),
            listed(
                2,
                "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            ),
        ),
        (
            "layer00/manifest.json".to_string(),
            listed(
                171,
                "46e077ab193621860e7a55b882ecf84282f306ea5ad484c4fb6b83c1d870ebf7",
            ),
        ),
    ]);
    assert_eq!(statement.files, expected);
    assert_eq!(statement.identity, Some(identity()));
}

#[test]
fn a_verified_statement_vouches_for_its_files_the_manifests_payload_and_itself() {
    let dir = artifact();
    let statement = statement_of(dir.path(), Some(identity())).unwrap();
    let tree = signed_tree(dir.path(), &statement, b"abc", b"").unwrap();
    assert_eq!(
        (tree.repo.as_str(), tree.revision.as_str()),
        ("team/model", identity().revision.as_str())
    );
    let digests: BTreeMap<&str, (u64, String)> = tree
        .files
        .iter()
        .map(|(path, f)| (path.as_str(), (f.size, f.digest.hex())))
        .collect();
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert_eq!(
        digests,
        BTreeMap::from([
            (
                "config.json",
                (
                    20,
                    "8575c51f02273b9201e4a6e8800e1f1dd62c6dd0eff6696dd0d0038c02c03da8".to_string()
                )
            ),
            (
                "index.json",
                (
                    2,
                    "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a".to_string()
                )
            ),
            ("layer00/layer00-plain.blob", (3, abc.to_string())),
            (
                "layer00/manifest.json",
                (
                    171,
                    "46e077ab193621860e7a55b882ecf84282f306ea5ad484c4fb6b83c1d870ebf7".to_string()
                )
            ),
            (STATEMENT_FILE, (3, abc.to_string())),
            (SIGNATURE_FILE, (0, empty.to_string())),
        ])
    );
    assert!(
        tree.files
            .values()
            .all(|f| matches!(f.digest, FileDigest::Sha256(_)))
    );
}

#[test]
fn a_manifest_that_is_not_the_signed_one_is_refused_by_size_or_digest() {
    let dir = artifact();
    let statement = statement_of(dir.path(), None).unwrap();
    let manifest = "layer00/manifest.json";
    let mut wrong_size = statement.clone();
    wrong_size.files.get_mut(manifest).unwrap().size += 1;
    let mut wrong_digest = statement.clone();
    wrong_digest.files.get_mut(manifest).unwrap().sha256[0] ^= 1;
    for (what, lie) in [("size", wrong_size), ("digest", wrong_digest)] {
        match signed_tree(dir.path(), &lie, b"", b"") {
            Err(SignedError::Mismatch { path, .. }) => assert_eq!(path, manifest, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_statement_without_a_unit_manifest_vouches_for_nothing() {
    let dir = artifact();
    let mut statement = statement_of(dir.path(), None).unwrap();
    statement.files.remove("layer00/manifest.json");
    assert!(matches!(
        signed_tree(dir.path(), &statement, b"", b""),
        Err(SignedError::NoManifests)
    ));
    // A manifest in a folder that cannot be a unit (a hidden one) is not a unit's manifest.
    let mut misnamed = Statement {
        identity: None,
        files: statement.files.clone(),
    };
    fs::create_dir(dir.path().join(".hidden")).unwrap();
    fs::write(dir.path().join(".hidden/manifest.json"), MANIFEST).unwrap();
    misnamed.files.insert(
        ".hidden/manifest.json".into(),
        listed(
            171,
            "46e077ab193621860e7a55b882ecf84282f306ea5ad484c4fb6b83c1d870ebf7",
        ),
    );
    assert!(matches!(
        signed_tree(dir.path(), &misnamed, b"", b""),
        Err(SignedError::NoManifests)
    ));
}

#[test]
fn a_statement_that_lists_payload_is_refused() {
    let dir = artifact();
    let mut statement = statement_of(dir.path(), None).unwrap();
    statement.files.insert(
        "layer00/layer00-plain.blob".into(),
        listed(
            3,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
    );
    assert!(matches!(
        signed_tree(dir.path(), &statement, b"", b""),
        Err(SignedError::ListsPayload { .. })
    ));
}

#[test]
fn evidence_of_a_signed_pass_names_its_signer_and_vouches_for_every_byte() {
    let dir = artifact();
    let statement = statement_of(dir.path(), Some(identity())).unwrap();
    fs::write(dir.path().join(STATEMENT_FILE), b"abc").unwrap();
    fs::write(dir.path().join(SIGNATURE_FILE), b"").unwrap();
    let tree = signed_tree(dir.path(), &statement, b"abc", b"").unwrap();
    let signer = minirun_store::SignerRecord {
        principals: "publisher@example.org".into(),
        fingerprint: "SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG".into(),
    };
    let key = minirun_store::SealKey::load_or_create(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("store-tests.key"),
    )
    .unwrap();
    let verified = minirun_store::verify_signed(
        dir.path(),
        &tree,
        signer.clone(),
        minirun_store::Sealing {
            key: &key,
            progress: &|_| {},
            stop: &std::sync::atomic::AtomicBool::new(false),
        },
    )
    .unwrap();
    assert_eq!(verified.evidence.signer, Some(signer.clone()));
    assert_eq!(verified.evidence.mode, "signed");
    assert!(verified.evidence.vouches_for_every_byte());
    let held = minirun_store::HeldEvidence::load(dir.path(), &key).unwrap();
    assert_eq!(held.evidence().signer, Some(signer));
}
