//! Where the user's evidence key lives, read from the real environment: each case runs this
//! test binary again as a child with only the variables it names, so no test changes the
//! environment of another.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use minirun_store::SealKey;

/// The variable the documentation names for the key file.
const KEY_ENV: &str = "MINIRUN_EVIDENCE_KEY";

/// The child's side: makes the user's key where the environment says. Ignored so that a
/// plain `cargo test` does not run it in the parent's environment.
#[test]
#[ignore = "run by the key_location tests as a child process"]
fn child_makes_the_users_key() {
    SealKey::for_user().unwrap();
}

fn make_key_with(env: &[(&str, &Path)]) -> std::process::Output {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "child_makes_the_users_key",
            "--ignored",
            "--nocapture",
        ])
        .env_clear();
    for (name, value) in env {
        child.env(name, value);
    }
    child.output().unwrap()
}

fn assert_private_key_at(path: &Path, output: &std::process::Output) {
    assert!(output.status.success(), "{output:?}");
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).unwrap();
    let hex = text.strip_suffix('\n').unwrap_or("not one line");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{text:?}"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn the_key_variable_names_the_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("my.key");
    let home = dir.path().join("home");
    let output = make_key_with(&[(KEY_ENV, &key), ("HOME", &home)]);
    assert_private_key_at(&key, &output);
    assert!(
        !home.exists(),
        "nothing is made in HOME when the variable is set"
    );
}

#[test]
fn without_the_variable_the_key_lives_in_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    let output = make_key_with(&[("XDG_CONFIG_HOME", dir.path())]);
    assert_private_key_at(&dir.path().join("minirun/evidence.key"), &output);
}
