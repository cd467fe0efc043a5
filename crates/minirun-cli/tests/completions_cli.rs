//! `minirun completions SHELL` prints a completion script the shell reads, naming every
//! subcommand, and `--version` names the commit the program was built from.

mod common;

use common::{minirun, stderr};

#[test]
fn the_bash_script_parses_and_completes_every_subcommand() {
    let out = minirun(&["completions", "bash"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = String::from_utf8(out.stdout).unwrap();
    for subcommand in [
        "quickstart",
        "pack",
        "verify",
        "plan",
        "run",
        "serve",
        "completions",
    ] {
        assert!(script.contains(subcommand), "{subcommand} is not completed");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("minirun.bash");
    std::fs::write(&path, &script).unwrap();
    let parsed = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = minirun(&["completions", shell]);
        assert!(out.status.success() && out.stdout.len() > 100, "{shell}");
    }
    assert!(!minirun(&["completions", "tcsh"]).status.success());
}

#[test]
fn the_version_names_the_commit() {
    let out = minirun(&["--version"]);
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let commit = line
        .trim()
        .strip_prefix(concat!("minirun ", env!("CARGO_PKG_VERSION"), " (commit "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(build_commit::is_description(commit), "{line}");
}
