//! Verification and held evidence against a hostile filesystem: symbolic-link components,
//! files swapped, modified with their mtime restored, truncated, added, removed or
//! hard-linked, each refused with a message that names the file and what changed.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use minirun_format::tree::{FileDigest, RepoFile, Tree};
use minirun_store::{HeldEvidence, OpenError, SealKey, StoreError, VerifyError, verify};

const PIN: &str = "0123456789abcdef0123456789abcdef01234567";

/// This test binary's evidence key (the user's own stays untouched).
fn key() -> SealKey {
    SealKey::load_or_create(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("store-tests.key"))
        .unwrap()
}

/// Writes a small artifact and returns the tree that publishes it.
fn artifact(dir: &Path) -> Tree {
    let contents: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "index.json",
            b"{\"format\": \"quantized_tile_container\"}\n".to_vec(),
            false,
        ),
        (
            "layer00/manifest.json",
            b"{\"unit\": \"layer00\"}\n".to_vec(),
            false,
        ),
        (
            "layer00/layer00-w1.mxfp4tile",
            (0..300_000u32).map(|i| (i * 7) as u8).collect(),
            true,
        ),
        (
            "layer01/layer01-w1.mxfp4tile",
            (0..200_000u32).map(|i| (i * 13) as u8).collect(),
            true,
        ),
    ];
    let mut files = BTreeMap::new();
    for (path, content, lfs) in contents {
        let target = dir.join(path);
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        fs::write(&target, &content).unwrap();
        files.insert(
            path.to_string(),
            RepoFile {
                path: path.to_string(),
                size: content.len() as u64,
                digest: digest_of(&content, lfs),
            },
        );
    }
    Tree {
        repo: "team/tiny-minirun".into(),
        revision: PIN.into(),
        files,
    }
}

/// The published digest, computed independently of the code under test: SHA-256 for LFS
/// files, SHA-1 of `blob <len>\0` + content for git files.
fn digest_of(content: &[u8], lfs: bool) -> FileDigest {
    use sha1::Digest as _;
    if lfs {
        return FileDigest::Sha256(sha2::Sha256::digest(content).into());
    }
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    FileDigest::GitBlobSha1(h.finalize().into())
}

fn verified() -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    (dir, tree)
}

const W1: &str = "layer00/layer00-w1.mxfp4tile";

#[test]
fn a_clean_artifact_gives_evidence_that_opens_every_file() {
    let (dir, tree) = verified();
    let held = HeldEvidence::load(dir.path(), &key()).unwrap();
    let e = held.evidence();
    assert_eq!(
        (e.repo.as_str(), e.revision.as_str(), e.mode.as_str()),
        ("team/tiny-minirun", PIN, "full")
    );
    assert_eq!(e.files.len(), 4);
    assert_eq!(e.tree_identity, minirun_store::tree_identity(&tree));
    let w1 = e.files.iter().find(|f| f.path == W1).unwrap();
    assert!(w1.payload && w1.digest.algorithm == "sha256");
    let index = e.files.iter().find(|f| f.path == "index.json").unwrap();
    assert!(!index.payload && index.digest.algorithm == "git-blob-sha1");
    held.open(W1).unwrap();
    assert!(matches!(
        held.open("README.md"),
        Err(StoreError::NotEvidenced { .. })
    ));
    assert!(held.may_skip_tile_digests("team/tiny-minirun", PIN));
    assert!(!held.may_skip_tile_digests("team/tiny-minirun", &"f".repeat(40)));
    assert!(!held.may_skip_tile_digests("other/repo-minirun", PIN));
}

#[test]
fn symbolic_link_components_are_refused_for_files_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    // A file replaced by a link to an identical copy.
    let copy = dir.path().join("elsewhere.bin");
    fs::rename(dir.path().join(W1), &copy).unwrap();
    std::os::unix::fs::symlink(&copy, dir.path().join(W1)).unwrap();
    let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
    assert!(
        matches!(err, VerifyError::Open(OpenError::SymbolicLink { .. })),
        "{err}"
    );
    let root = minirun_store::Root::open(dir.path()).unwrap();
    assert!(matches!(
        root.open_file(W1),
        Err(OpenError::SymbolicLink { .. })
    ));

    // A directory component that is a link.
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    fs::rename(dir.path().join("layer01"), dir.path().join("real01")).unwrap();
    std::os::unix::fs::symlink("real01", dir.path().join("layer01")).unwrap();
    let root = minirun_store::Root::open(dir.path()).unwrap();
    assert!(matches!(
        root.open_file("layer01/layer01-w1.mxfp4tile"),
        Err(OpenError::SymbolicLink { .. })
    ));
    assert!(verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).is_err());
    assert!(
        !dir.path().join(".minirun/evidence.json").exists(),
        "no evidence on failure"
    );
}

#[test]
fn a_file_swapped_after_verification_is_caught_at_open_naming_the_inode() {
    let (dir, _) = verified();
    let path = dir.path().join(W1);
    let same = fs::read(&path).unwrap();
    let temp = dir.path().join("swap.tmp");
    fs::write(&temp, &same).unwrap();
    fs::rename(&temp, &path).unwrap();
    let err = HeldEvidence::load(dir.path(), &key()).unwrap_err();
    assert!(
        matches!(&err, StoreError::Changed { path, .. } if path == W1),
        "{err}"
    );
    assert!(err.to_string().contains("inode"), "{err}");
}

#[test]
fn a_file_modified_with_its_mtime_restored_is_caught_by_its_ctime() {
    let (dir, _) = verified();
    let held = HeldEvidence::load(dir.path(), &key()).unwrap();
    let path = dir.path().join(W1);
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut bytes = fs::read(&path).unwrap();
    bytes[10] ^= 0xFF;
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes[10..11], 10).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    assert_eq!(
        fs::metadata(&path).unwrap().modified().unwrap(),
        mtime,
        "mtime restored"
    );
    let err = held.open(W1).unwrap_err();
    assert!(err.to_string().contains("status-change time"), "{err}");
}

#[test]
fn truncated_wrong_extra_missing_and_hard_linked_files_fail_verification() {
    let check = |damage: &dyn Fn(&Path), expect: &dyn Fn(&VerifyError) -> bool| {
        let dir = tempfile::tempdir().unwrap();
        let tree = artifact(dir.path());
        damage(dir.path());
        let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
        assert!(expect(&err), "{err}");
    };
    check(
        &|d| {
            let f = fs::OpenOptions::new().write(true).open(d.join(W1)).unwrap();
            f.set_len(1000).unwrap();
        },
        &|e| matches!(e, VerifyError::WrongSize { path, got: 1000, .. } if path == W1),
    );
    check(
        &|d| {
            let mut b = fs::read(d.join(W1)).unwrap();
            b[5] ^= 1;
            fs::write(d.join(W1), b).unwrap();
        },
        &|e| matches!(e, VerifyError::WrongDigest { path, .. } if path == W1),
    );
    check(
        &|d| fs::write(d.join("layer00/extra.bin"), b"x").unwrap(),
        &|e| matches!(e, VerifyError::Files { extra, missing } if extra == &["layer00/extra.bin"] && missing.is_empty()),
    );
    check(
        &|d| fs::remove_file(d.join("index.json")).unwrap(),
        &|e| matches!(e, VerifyError::Files { missing, .. } if missing == &["index.json"]),
    );
    check(
        &|d| {
            let outside = d
                .parent()
                .unwrap()
                .join(format!("hardlink-{}", std::process::id()));
            let _ = fs::remove_file(&outside);
            fs::hard_link(d.join(W1), &outside).unwrap();
        },
        &|e| matches!(e, VerifyError::Open(OpenError::HardLinked { links: 2, .. })),
    );
}

#[test]
fn a_truncated_or_appended_file_after_verification_is_caught_naming_the_size() {
    let (dir, _) = verified();
    let held = HeldEvidence::load(dir.path(), &key()).unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join(W1))
        .unwrap();
    std::io::Write::write_all(&mut f, b"more").unwrap();
    let err = held.open(W1).unwrap_err();
    assert!(err.to_string().contains("size"), "{err}");
}

/// Verifies on one thread and asks the pass to stop once `after` bytes were hashed.
fn verify_stopping_after(
    dir: &Path,
    tree: &Tree,
    after: u64,
) -> Result<minirun_store::Verified, VerifyError> {
    let stop = AtomicBool::new(false);
    let seen = AtomicU64::new(0);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        verify(
            dir,
            tree,
            &key(),
            &|n| {
                if seen.fetch_add(n, Ordering::Relaxed) + n >= after {
                    stop.store(true, Ordering::Relaxed);
                }
            },
            &stop,
        )
    })
}

#[test]
fn an_interrupted_pass_resumes_reusing_only_files_whose_identity_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    // Largest first: the 300,000-byte file is hashed first, then the pass stops.
    let err = verify_stopping_after(dir.path(), &tree, 300_000).unwrap_err();
    assert!(matches!(err, VerifyError::Stopped { done: 1 }), "{err}");
    assert!(dir.path().join(".minirun/verify-checkpoint.json").exists());
    assert!(!dir.path().join(".minirun/evidence.json").exists());

    let resumed = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(
        resumed.reused, 1,
        "the checkpointed file was not hashed again"
    );
    assert_eq!(resumed.evidence.files.len(), 4);
    assert!(
        !dir.path().join(".minirun/verify-checkpoint.json").exists(),
        "removed when done"
    );

    // A checkpointed file replaced since (same content, new inode) is hashed again.
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    verify_stopping_after(dir.path(), &tree, 300_000).unwrap_err();
    let content = fs::read(dir.path().join(W1)).unwrap();
    fs::remove_file(dir.path().join(W1)).unwrap();
    fs::write(dir.path().join(W1), content).unwrap();
    let resumed = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(resumed.reused, 0);
}

#[test]
fn a_spot_check_hashes_the_largest_payloads_that_fit_and_is_labelled_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    let verified = minirun_store::verify_with(
        dir.path(),
        &tree,
        minirun_store::Authority::Publication,
        minirun_store::Selection::SpotCheck { budget: 250_000 },
        minirun_store::Sealing {
            key: &key(),
            progress: &|_| {},
            stop: &AtomicBool::new(false),
        },
    )
    .unwrap();
    let e = &verified.evidence;
    assert_eq!(e.mode, "spot-check");
    let paths: Vec<&str> = e.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["layer01/layer01-w1.mxfp4tile"],
        "300,000 bytes overflow the budget"
    );
    let held = HeldEvidence::load(dir.path(), &key()).unwrap();
    assert!(matches!(
        held.open(W1),
        Err(StoreError::NotEvidenced { .. })
    ));
    assert!(
        !held.may_skip_tile_digests("team/tiny-minirun", PIN),
        "never on a spot check"
    );
}

#[test]
fn a_new_revision_carries_forward_unchanged_files_and_re_verifying_one_hashes_everything() {
    let (dir, tree) = verified();
    let again = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(
        (again.reused, again.carried),
        (0, 0),
        "the same revision is hashed again"
    );

    // Revision B changes one file.
    let new_content = b"{\"format\": \"quantized_tile_container\", \"v\": 2}\n".to_vec();
    fs::write(dir.path().join("index.json"), &new_content).unwrap();
    let mut next = tree.clone();
    next.revision = "f".repeat(40);
    let entry = next.files.get_mut("index.json").unwrap();
    entry.size = new_content.len() as u64;
    entry.digest = digest_of(&new_content, false);
    let bumped = verify(dir.path(), &next, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(bumped.carried, 3, "the three unchanged files");
    assert_eq!(bumped.evidence.revision, "f".repeat(40));

    // Another repository's evidence donates nothing.
    let mut other = next.clone();
    other.repo = "someone/else-minirun".into();
    other.revision = "e".repeat(40);
    let fresh = verify(dir.path(), &other, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(fresh.carried, 0);
}

#[test]
fn a_planted_evidence_folder_link_is_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(".minirun")).unwrap();
    let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false))
        .expect_err("verify wrote evidence through a planted link")
        .to_string();
    assert!(err.contains("a symbolic link"), "{err}");
    let written: Vec<_> = fs::read_dir(elsewhere.path()).unwrap().collect();
    assert!(written.is_empty(), "{written:?}");
}

/// The stored evidence's record, as a reader would take it if it did not check the seal.
fn stored_evidence(dir: &Path) -> minirun_store::Evidence {
    let text = fs::read_to_string(dir.join(".minirun/evidence.json")).unwrap();
    let stored: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(stored["sealed"].clone()).unwrap()
}

/// Rewrites W1 in place with other bytes of the same length (what an attacker with write
/// access to the folder does), returning its identity now.
fn tamper_with_w1(dir: &Path) -> minirun_store::FileIdentity {
    let mut content = fs::read(dir.join(W1)).unwrap();
    content[1000] ^= 0xff;
    fs::write(dir.join(W1), &content).unwrap();
    minirun_store::FileIdentity::of(&fs::metadata(dir.join(W1)).unwrap())
}

/// Rewrites `relative` (sealed JSON) with `edit` applied to its record and sealed under
/// `forger`'s key, as someone without the user's key would.
fn forge(dir: &Path, relative: &str, forger: &SealKey, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(relative);
    let mut stored: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut stored["sealed"]);
    let body = serde_json::to_vec(&stored["sealed"]).unwrap();
    stored["seal"] = forger.seal("minirun-evidence-seal/2", &body).into();
    fs::write(&path, serde_json::to_vec(&stored).unwrap()).unwrap();
}

/// Tampers with W1, then rewrites the sealed file `relative` to vouch for its new identity,
/// sealed with a key of the attacker's own.
fn tamper_and_forge(dir: &Path, relative: &str) {
    let now = tamper_with_w1(dir);
    let home = tempfile::tempdir().unwrap();
    let forger = SealKey::load_or_create(&home.path().join("forger.key")).unwrap();
    forge(dir, relative, &forger, |record| {
        set_identity(record, W1, now)
    });
}

/// The verification error when W1 was hashed (and found tampered with) instead of vouched for.
fn assert_w1_was_hashed(err: &VerifyError, what: &str) {
    assert!(
        matches!(err, VerifyError::WrongDigest { path, .. } if path == W1),
        "{what} vouched for the tampered file: {err}"
    );
}

fn set_identity(record: &mut serde_json::Value, path: &str, identity: minirun_store::FileIdentity) {
    let files = record["files"].as_array_mut().unwrap();
    let file = files.iter_mut().find(|f| f["path"] == path).unwrap();
    file["identity"] = serde_json::to_value(identity).unwrap();
}

#[test]
fn evidence_forged_for_a_tampered_file_is_refused_by_readers() {
    let (dir, _) = verified();
    tamper_and_forge(dir.path(), ".minirun/evidence.json");
    let err = HeldEvidence::load(dir.path(), &key()).unwrap_err();
    assert!(
        matches!(err, StoreError::UnsealedEvidence { .. }),
        "forged evidence was taken: {err}"
    );
    assert!(err.to_string().contains("minirun verify"), "{err}");
}

#[test]
fn a_checkpoint_forged_for_a_tampered_file_is_ignored_and_the_file_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    verify_stopping_after(dir.path(), &tree, 300_000).unwrap_err();
    tamper_and_forge(dir.path(), ".minirun/verify-checkpoint.json");
    let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
    assert_w1_was_hashed(&err, "the forged checkpoint");
}

#[test]
fn forged_evidence_of_an_earlier_revision_carries_nothing_forward() {
    let (dir, tree) = verified();
    tamper_and_forge(dir.path(), ".minirun/evidence.json");
    let mut next = tree.clone();
    next.revision = "f".repeat(40);
    let err = verify(dir.path(), &next, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
    assert_w1_was_hashed(&err, "forged evidence of an earlier revision");
}

#[test]
fn evidence_survives_a_new_device_number_only_on_a_volume_with_a_stable_identity() {
    let (dir, _) = verified();
    let mut moved = stored_evidence(dir.path());
    let volume = minirun_store::Root::open(dir.path()).unwrap().volume();
    assert_eq!(moved.root.volume, volume);
    // What a replugged disk looks like: every device number moves, nothing else does.
    moved.root.device ^= 0x10;
    moved.root.fsid ^= 0x10;
    for file in &mut moved.files {
        file.identity.device ^= 0x10;
    }
    minirun_store::evidence::write(dir.path(), &moved, &key()).unwrap();
    let loaded = HeldEvidence::load(dir.path(), &key());
    match &volume {
        Some(_) => {
            let held = loaded.expect("the remount rule refused a remounted volume");
            held.open(W1).unwrap();
            tamper_with_w1(dir.path());
            assert!(matches!(held.open(W1), Err(StoreError::Changed { .. })));
        }
        None => assert!(matches!(loaded, Err(StoreError::RootChanged { .. }))),
    }

    let mut elsewhere = moved.clone();
    elsewhere.root.volume = Some("uuid:another-volume".into());
    minirun_store::evidence::write(dir.path(), &elsewhere, &key()).unwrap();
    assert!(matches!(
        HeldEvidence::load(dir.path(), &key()),
        Err(StoreError::RootChanged { .. })
    ));
}

#[test]
fn an_interrupted_pack_is_refused_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    fs::write(dir.path().join(".minirun-pack-incomplete"), b"").unwrap();
    let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
    assert!(matches!(err, VerifyError::Incomplete { .. }), "{err}");
    assert!(err.to_string().contains("minirun pack"), "{err}");
}

#[test]
fn evidence_of_an_older_minirun_is_refused_naming_its_format_and_the_fix() {
    let (dir, _) = verified();
    let record = stored_evidence(dir.path());
    let mut older = serde_json::to_value(&record).unwrap();
    older["schema"] = "minirun-evidence/1".into();
    fs::write(
        dir.path().join(".minirun/evidence.json"),
        serde_json::to_vec_pretty(&older).unwrap(),
    )
    .unwrap();
    let err = HeldEvidence::load(dir.path(), &key()).unwrap_err();
    assert!(matches!(err, StoreError::BadEvidence { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("\"minirun-evidence/1\"") && text.contains("minirun verify"),
        "{text}"
    );
}

fn sealing<'a>(key: &'a SealKey, stop: &'a AtomicBool) -> minirun_store::Sealing<'a> {
    minirun_store::Sealing {
        key,
        progress: &|_| {},
        stop,
    }
}

/// A `config.json` the publication does not hold, as its upstream's tree lists it.
fn upstream_config(dir: &Path, content: &[u8]) -> minirun_store::SourcedFile {
    fs::write(dir.join("config.json"), content).unwrap();
    minirun_store::SourcedFile {
        file: RepoFile {
            path: "config.json".into(),
            size: content.len() as u64,
            digest: digest_of(content, false),
        },
        origin: minirun_store::Origin {
            repo: "upstream/Model".into(),
            revision: "f".repeat(40),
        },
    }
}

#[test]
fn a_file_from_the_named_upstream_is_verified_against_its_tree_and_recorded_with_its_origin() {
    use minirun_store::{ArtifactFiles, Authority, LayoutError, Selection, verify_sourced};
    let (key, stop) = (key(), AtomicBool::new(false));
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    let config = b"{\"model_type\": \"kimi_k3\"}\n";
    let sourced = upstream_config(dir.path(), config);
    let run = |sourced: &[minirun_store::SourcedFile], authority| {
        verify_sourced(
            dir.path(),
            &tree,
            sourced,
            authority,
            Selection::Full,
            sealing(&key, &stop),
        )
    };
    let verified = run(std::slice::from_ref(&sourced), Authority::Publication).unwrap();
    let record = verified
        .evidence
        .files
        .iter()
        .find(|f| f.path == "config.json")
        .unwrap();
    assert_eq!(record.origin.as_ref(), Some(&sourced.origin));
    assert_eq!(record.digest.algorithm, "git-blob-sha1");
    assert!(
        verified
            .evidence
            .files
            .iter()
            .all(|f| f.path == "config.json" || f.origin.is_none())
    );
    assert_eq!(
        verified.evidence.tree_identity,
        minirun_store::tree_identity(&tree),
        "the plan identity is the publication's alone"
    );
    let files = ArtifactFiles::Verified(Box::new(HeldEvidence::load(dir.path(), &key).unwrap()));
    let read = files
        .read_metadata("config.json", 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!((read.bytes.as_slice(), read.evidenced), (&config[..], true));

    // Without the source, the same folder holds a file the publication does not.
    let err = run(&[], Authority::Publication).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Files { extra, .. } if extra == &["config.json"]),
        "{err}"
    );
    // Content other than the upstream's fails, naming the file, and leaves no evidence.
    let wrong = upstream_config(dir.path(), b"{\"model_type\": \"kimi_k4\"}\n");
    let sourced_with_wrong_claim = minirun_store::SourcedFile {
        file: sourced.file.clone(),
        ..wrong
    };
    let err = run(
        std::slice::from_ref(&sourced_with_wrong_claim),
        Authority::Publication,
    )
    .unwrap_err();
    assert!(
        matches!(&err, VerifyError::WrongDigest { path, .. } if path == "config.json"),
        "{err}"
    );
    assert!(HeldEvidence::load(dir.path(), &key).is_err());
    // A sourced file must be present.
    fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = run(std::slice::from_ref(&sourced), Authority::Publication).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Files { missing, .. } if missing == &["config.json"]),
        "{err}"
    );
    // Only a publication names an upstream, and its own copy of a file wins.
    let err = run(std::slice::from_ref(&sourced), Authority::OwnManifests).unwrap_err();
    assert!(
        matches!(err, VerifyError::SourcedWithoutPublication { .. }),
        "{err}"
    );
    let mut listed = sourced.clone();
    listed.file.path = "index.json".into();
    let err = run(&[listed], Authority::Publication).unwrap_err();
    assert!(
        matches!(&err, VerifyError::SourcedTwice { path, .. } if path == "index.json"),
        "{err}"
    );
    // A file not in the evidence is still refused to a verified reader.
    upstream_config(dir.path(), config);
    run(&[], Authority::Publication).unwrap_err();
    fs::remove_file(dir.path().join("config.json")).unwrap();
    run(&[], Authority::Publication).unwrap();
    fs::write(dir.path().join("config.json"), config).unwrap();
    let files = ArtifactFiles::Verified(Box::new(HeldEvidence::load(dir.path(), &key).unwrap()));
    assert!(matches!(
        files.read_metadata("config.json", 1 << 20),
        Err(LayoutError::NotEvidenced { .. })
    ));
}

/// Revision B claims, for a file unchanged on disk, another digest of the same size or the same
/// digest at another size: revision A's record of the file is not reused, the file is hashed
/// again, and the pass fails naming it.
#[test]
fn an_earlier_record_is_reused_only_for_the_same_claimed_size_and_digest() {
    for lie in ["digest", "size"] {
        let (dir, tree) = verified();
        let mut next = tree.clone();
        next.revision = "f".repeat(40);
        let entry = next.files.get_mut(W1).unwrap();
        if lie == "digest" {
            entry.digest = FileDigest::Sha256([7; 32]);
        } else {
            entry.size += 1;
        }
        let err = verify(dir.path(), &next, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
        assert!(err.to_string().contains(W1), "{lie}: {err}");
    }
}

/// An interrupted pass's checkpoint is for its own publication: a pass against another
/// revision starts from nothing.
#[test]
fn a_checkpoint_of_another_revision_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact(dir.path());
    verify_stopping_after(dir.path(), &tree, 300_000).unwrap_err();
    let mut next = tree.clone();
    next.revision = "f".repeat(40);
    let fresh = verify(dir.path(), &next, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!((fresh.reused, fresh.carried), (0, 0));
}

/// The small artifact with an index that pins config.json by `bytes` and `sha256`.
fn artifact_pinning_config(dir: &Path, bytes: u64, sha256: &str) -> Tree {
    let mut tree = artifact(dir);
    let config = b"{\"model_type\": \"x\"}\n".to_vec();
    let index = format!(
        r#"{{"format": "quantized_tile_container", "configuration": {{"file": "config.json", "bytes": {bytes}, "sha256": "{sha256}", "source_repo": "team/model", "source_revision": "{PIN}"}}}}"#
    );
    for (path, content) in [("config.json", config), ("index.json", index.into_bytes())] {
        fs::write(dir.join(path), &content).unwrap();
        tree.files.insert(
            path.to_string(),
            RepoFile {
                path: path.to_string(),
                size: content.len() as u64,
                digest: digest_of(&content, false),
            },
        );
    }
    tree
}

/// A configuration file the index pins must be exactly the pinned bytes, even where the
/// published tree agrees with the file (digest computed with Python's hashlib).
#[test]
fn a_file_the_index_pins_must_be_exactly_the_pinned_bytes() {
    let right = "8575c51f02273b9201e4a6e8800e1f1dd62c6dd0eff6696dd0d0038c02c03da8";
    let dir = tempfile::tempdir().unwrap();
    let tree = artifact_pinning_config(dir.path(), 20, right);
    verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap();
    let wrong = "0".repeat(64);
    for (bytes, sha256, what) in [(21, right, "21"), (20, wrong.as_str(), "SHA-256")] {
        let dir = tempfile::tempdir().unwrap();
        let tree = artifact_pinning_config(dir.path(), bytes, sha256);
        let err = verify(dir.path(), &tree, &key(), &|_| {}, &AtomicBool::new(false)).unwrap_err();
        match &err {
            VerifyError::PinnedIdentity {
                path,
                role,
                what: said,
            } => {
                assert_eq!((path.as_str(), *role), ("config.json", "configuration"));
                assert!(said.contains(what), "{err}");
            }
            other => panic!("{other}"),
        }
    }
}
