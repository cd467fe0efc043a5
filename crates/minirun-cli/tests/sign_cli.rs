//! Signed artifacts, both ways with OpenSSH's own `ssh-keygen`: a statement `minirun sign`
//! writes verifies with `ssh-keygen -Y verify` and with an independent Python reader, a
//! signature `ssh-keygen -Y sign` makes verifies with `minirun verify --allowed-signers`, the
//! golden statement is what signing the packed fixture writes, and every tampering is refused
//! with its reason and leaves no evidence behind.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fixture, minirun, stderr};
use sha2::Digest as _;

const PIN: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "minirun-tests/deepseek-v3-tiny";

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/signed")
}

fn test_key() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../minirun-sign/testdata/publisher_ed25519")
}

fn ssh_keygen(args: &[&str], stdin: Option<&Path>) -> Output {
    let mut command = Command::new("ssh-keygen");
    command.args(args);
    if let Some(path) = stdin {
        command.stdin(fs::File::open(path).unwrap());
    }
    command
        .output()
        .expect("ssh-keygen (Debian's openssh-client) must be installed: tools/test.sh, the test command, installs it")
}

/// The fixture packed (with the golden statement's identity) into `dir/art`, signed by `key`.
fn signed_artifact(dir: &Path, key: &Path) -> PathBuf {
    let art = dir.join("art");
    let out = minirun(&[
        "pack",
        "--source",
        fixture().to_str().unwrap(),
        "--out",
        art.to_str().unwrap(),
        "--source-repo",
        REPO,
        "--source-revision",
        PIN,
        "--sign",
        key.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    art
}

/// A fresh Ed25519 key pair in `dir`, and an allowed-signers file trusting it as `principal`
/// with `options`.
fn new_key(dir: &Path, name: &str, principal: &str, options: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(name);
    let out = ssh_keygen(
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            name,
            "-f",
            key.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let public = fs::read_to_string(key.with_extension("pub")).unwrap();
    let allowed = dir.join(format!("{name}.allowed"));
    fs::write(&allowed, format!("{principal} {options} {public}")).unwrap();
    (key, allowed)
}

fn verify_signed(art: &Path, allowed: &Path) -> Output {
    minirun(&[
        "verify",
        art.to_str().unwrap(),
        "--allowed-signers",
        allowed.to_str().unwrap(),
    ])
}

fn run_header(art: &Path) -> Output {
    minirun(&[
        "run",
        art.to_str().unwrap(),
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
    ])
}

#[test]
fn the_golden_statement_is_what_signing_writes_and_three_readers_accept_it() {
    let dir = tempfile::tempdir().unwrap();
    let art = signed_artifact(dir.path(), &test_key());
    for name in ["minirun-statement.txt", "minirun-statement.txt.sig"] {
        assert_eq!(
            fs::read(art.join(name)).unwrap(),
            fs::read(data().join(name)).unwrap(),
            "{name} differs from the golden one"
        );
    }
    let allowed = data().join("allowed_signers");
    let out = ssh_keygen(
        &[
            "-Y",
            "verify",
            "-f",
            allowed.to_str().unwrap(),
            "-I",
            "publisher@example",
            "-n",
            "minirun-artifact",
            "-s",
            art.join("minirun-statement.txt.sig").to_str().unwrap(),
        ],
        Some(&art.join("minirun-statement.txt")),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let python = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/check_signed_statement.py"))
        .args([
            art.to_str().unwrap(),
            allowed.to_str().unwrap(),
            "publisher@example",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&python.stdout);
    assert!(python.status.success() && said.ends_with("OK\n"), "{said}");
    let out = verify_signed(&art, &allowed);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("signed by publisher@example"),
        "{}",
        stderr(&out)
    );
    let out = run_header(&art);
    assert!(out.status.success(), "{}", stderr(&out));
    let header = stderr(&out);
    assert!(
        header.contains(&format!(
            "verified against its statement of {REPO}@{PIN}, signed by publisher@example (key SHA256:"
        )),
        "{header}"
    );
    let info = minirun(&["info", art.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&info.stdout);
    assert!(
        shown.contains("signature   signed with ssh-ed25519 key SHA256:"),
        "{shown}"
    );
    let info = minirun(&["info", art.to_str().unwrap(), "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(doc["signature"]["state"], "signed", "{doc}");
    assert_eq!(doc["signature"]["key_algorithm"], "ssh-ed25519", "{doc}");
}

#[test]
fn a_signature_ssh_keygen_makes_over_the_statement_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (key, allowed) = new_key(dir.path(), "openssh", "release@example", "");
    let art = signed_artifact(dir.path(), &test_key());
    fs::remove_file(art.join("minirun-statement.txt.sig")).unwrap();
    let statement = art.join("minirun-statement.txt");
    let out = ssh_keygen(
        &[
            "-Y",
            "sign",
            "-f",
            key.to_str().unwrap(),
            "-n",
            "minirun-artifact",
            statement.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = verify_signed(&art, &allowed);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("signed by release@example"),
        "{}",
        stderr(&out)
    );
}

/// One tampering: what to do to a freshly signed artifact, and what the refusal must say.
struct Tampering {
    name: &'static str,
    act: fn(&Path, &Path),
    refusal: &'static str,
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{}: {from}", path.display());
    fs::write(path, text.replacen(from, to, 1)).unwrap();
}

fn sign_with_ssh_keygen(dir: &Path, art: &Path, namespace: &str) {
    let (key, _) = new_key(dir, &format!("other-{namespace}"), "x@example", "");
    fs::remove_file(art.join("minirun-statement.txt.sig")).unwrap();
    let statement = art.join("minirun-statement.txt");
    let out = ssh_keygen(
        &[
            "-Y",
            "sign",
            "-f",
            key.to_str().unwrap(),
            "-n",
            namespace,
            statement.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

const TAMPERINGS: &[Tampering] = &[
    Tampering {
        name: "config.json edited",
        act: |_, art| {
            edit(
                &art.join("config.json"),
                "\"rms_norm_eps\"",
                "\"rms_norm_eps\" ",
            )
        },
        refusal: "config.json",
    },
    Tampering {
        name: "tokenizer.json edited",
        act: |_, art| edit(&art.join("tokenizer.json"), "\"model\"", "\"model\" "),
        refusal: "tokenizer.json",
    },
    Tampering {
        name: "index.json edited",
        act: |_, art| {
            edit(
                &art.join("index.json"),
                "deepseek-v3-tiny",
                "deepseek-v3-tinY",
            )
        },
        refusal: "index.json",
    },
    Tampering {
        name: "a payload file and its manifest digest changed together",
        act: |_, art| {
            let manifest = art.join("layer00/manifest.json");
            let text = fs::read_to_string(&manifest).unwrap();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            let entry = &value["files"][0];
            let name = entry["name"].as_str().unwrap();
            let payload = art.join("layer00").join(name);
            let mut bytes = fs::read(&payload).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 1;
            fs::write(&payload, &bytes).unwrap();
            let new_sha: String = sha2::Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            edit(&manifest, entry["sha256"].as_str().unwrap(), &new_sha);
        },
        refusal: "layer00/manifest.json differs from the signed statement",
    },
    Tampering {
        name: "a file added",
        act: |_, art| fs::write(art.join("chat_template.jinja"), "{{ messages }}").unwrap(),
        refusal: "chat_template.jinja",
    },
    Tampering {
        name: "the statement edited",
        act: |_, art| {
            edit(
                &art.join("minirun-statement.txt"),
                "repo minirun-tests/",
                "repo minirun-test5/",
            )
        },
        refusal: "does not match the statement",
    },
    Tampering {
        name: "signed by a key the file does not trust",
        act: |dir, art| sign_with_ssh_keygen(dir, art, "minirun-artifact"),
        refusal: "is not in the allowed signers file",
    },
    Tampering {
        name: "signed in another namespace",
        act: |dir, art| sign_with_ssh_keygen(dir, art, "git"),
        refusal: "namespace \"git\"",
    },
    Tampering {
        name: "another artifact's statement and signature replayed",
        act: |dir, art| {
            let other = dir.join("other");
            let out = minirun(&[
                "pack",
                "--source",
                fixture()
                    .with_file_name("mlx-affine8-g32")
                    .to_str()
                    .unwrap(),
                "--out",
                other.to_str().unwrap(),
                "--sign",
                test_key().to_str().unwrap(),
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
            for name in ["minirun-statement.txt", "minirun-statement.txt.sig"] {
                fs::copy(other.join(name), art.join(name)).unwrap();
            }
        },
        refusal: "differs from the signed statement",
    },
];

#[test]
fn every_tampering_is_refused_with_its_reason_and_leaves_no_evidence() {
    let golden_allowed = data().join("allowed_signers");
    for tampering in TAMPERINGS {
        let dir = tempfile::tempdir().unwrap();
        let art = signed_artifact(dir.path(), &test_key());
        let out = verify_signed(&art, &golden_allowed);
        assert!(out.status.success(), "{}: {}", tampering.name, stderr(&out));
        (tampering.act)(dir.path(), &art);
        let out = verify_signed(&art, &golden_allowed);
        assert_eq!(out.status.code(), Some(1), "{}: accepted", tampering.name);
        assert!(
            stderr(&out).contains(tampering.refusal),
            "{}: {}",
            tampering.name,
            stderr(&out)
        );
        let out = run_header(&art);
        assert!(
            stderr(&out).contains("has no verification evidence"),
            "{}: a run after a refused verification: {}",
            tampering.name,
            stderr(&out)
        );
    }
}

#[test]
fn an_expired_or_not_yet_valid_key_or_a_missing_signature_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let art = signed_artifact(dir.path(), &test_key());
    let public = fs::read_to_string(test_key().with_extension("pub")).unwrap();
    for (options, refusal) in [
        ("valid-before=20200101Z", "expired"),
        ("valid-after=29990101Z", "only from"),
        ("valid-before=20200101", "no trailing Z"),
        ("cert-authority", "not in the allowed signers file"),
    ] {
        let allowed = dir.path().join("allowed");
        fs::write(&allowed, format!("publisher@example {options} {public}")).unwrap();
        let out = verify_signed(&art, &allowed);
        assert_eq!(out.status.code(), Some(1), "{options}");
        assert!(
            stderr(&out).contains(refusal),
            "{options}: {}",
            stderr(&out)
        );
    }
    fs::remove_file(art.join("minirun-statement.txt.sig")).unwrap();
    let out = verify_signed(&art, &data().join("allowed_signers"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("minirun-statement.txt.sig"),
        "{}",
        stderr(&out)
    );
    fs::remove_file(art.join("minirun-statement.txt")).unwrap();
    let out = verify_signed(&art, &data().join("allowed_signers"));
    assert!(
        stderr(&out).contains("it was never signed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn each_listed_file_edited_alone_is_refused_naming_it() {
    let allowed = data().join("allowed_signers");
    let statement = fs::read_to_string(data().join("minirun-statement.txt")).unwrap();
    let listed: Vec<&str> = statement
        .lines()
        .skip(3)
        .filter_map(|line| line.splitn(3, ' ').nth(2))
        .collect();
    assert!(listed.len() > 10, "{listed:?}");
    for path in listed {
        let dir = tempfile::tempdir().unwrap();
        let art = signed_artifact(dir.path(), &test_key());
        let mut bytes = fs::read(art.join(path)).unwrap();
        bytes.push(b'\n');
        fs::write(art.join(path), bytes).unwrap();
        let out = verify_signed(&art, &allowed);
        assert_eq!(out.status.code(), Some(1), "{path} edited: accepted");
        assert!(stderr(&out).contains(path), "{path}: {}", stderr(&out));
    }
}
