//! `dormouse completions SHELL` prints a completion script that bash sources and that registers
//! dormouse's completion, naming every subcommand, and `--version` names the commit the program was built from.

mod common;

use common::{bin, stderr};

#[test]
fn the_bash_script_parses_and_completes_every_subcommand() {
    let out = bin("completions").arg("bash").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let script = String::from_utf8(out.stdout).unwrap();
    for subcommand in ["train", "export", "generate", "serve", "quickstart", "plot"] {
        assert!(script.contains(subcommand), "{subcommand} is not completed");
    }
    // Sourced by bash, the script registers dormouse's completion.
    let registered = std::process::Command::new("bash")
        .args([
            "-c",
            "source <(\"$0\" completions bash) && complete -p dormouse",
        ])
        .arg(env!("CARGO_BIN_EXE_dormouse"))
        .output()
        .unwrap();
    let registered_line = String::from_utf8_lossy(&registered.stdout);
    assert!(
        registered_line.ends_with("dormouse\n"),
        "{registered_line} {}",
        stderr(&registered)
    );
}

#[test]
fn the_version_names_the_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dormouse"))
        .arg("--version")
        .output()
        .unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    let commit = line
        .trim()
        .strip_prefix(concat!("dormouse ", env!("CARGO_PKG_VERSION"), " (commit "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(build_commit::is_description(commit), "{line}");
}
