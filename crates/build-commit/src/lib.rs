//! The commit a program is built from, for its `--version`: called from a build script, it sets
//! `BUILD_COMMIT` for the crate's code (`env!("BUILD_COMMIT")`) to the checkout's commit (12 hex
//! digits, `+changes` where the work tree differs from it), or to `unknown (not built from a git
//! checkout)`, and reruns the build script when the checkout's commit or index moves.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Sets `BUILD_COMMIT` for the crate being built (call from its `build.rs`).
pub fn emit() {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    if let Some(git) = manifest.as_deref().and_then(git_dir) {
        for watched in ["HEAD", "index", "refs", "packed-refs"] {
            println!("cargo:rerun-if-changed={}", git.join(watched).display());
        }
    }
    let dir = manifest.unwrap_or_default();
    println!("cargo:rerun-if-env-changed=BUILD_COMMIT");
    println!("cargo:rustc-env=BUILD_COMMIT={}", describe(&dir));
}

/// The commit of the checkout holding `dir`, as `--version` shows it.
pub fn describe(dir: &Path) -> String {
    let Some(commit) = git(dir, &["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown (not built from a git checkout)".to_string();
    };
    match git(dir, &["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if !changes.is_empty() => format!("{commit}+changes"),
        _ => commit,
    }
}

/// Whether `described` is what [`describe`] gives: 12 hex digits, maybe `+changes`, or the
/// words for a build outside a checkout (for the programs' tests of their `--version`).
pub fn is_description(described: &str) -> bool {
    let hex = described.strip_suffix("+changes").unwrap_or(described);
    described == "unknown (not built from a git checkout)"
        || hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit())
}

/// The `.git` folder of the checkout holding `dir`.
fn git_dir(dir: &Path) -> Option<PathBuf> {
    git(dir, &["rev-parse", "--absolute-git-dir"]).map(PathBuf::from)
}

/// `git ARGS` run in `dir`, its output trimmed; `None` where git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::{describe, is_description};

    #[test]
    fn this_checkout_is_described_by_its_commit_and_a_folder_outside_any_is_not() {
        let here = describe(std::path::Path::new(env!("CARGO_MANIFEST_DIR")));
        assert!(is_description(&here), "{here}");
        let outside = tempfile_dir();
        assert_eq!(
            describe(&outside),
            "unknown (not built from a git checkout)"
        );
        let _ = std::fs::remove_dir_all(outside);
    }

    #[test]
    fn only_a_commit_or_the_words_for_none_are_descriptions() {
        assert!(is_description("e65a3d3477e5"));
        assert!(is_description("e65a3d3477e5+changes"));
        assert!(!is_description("e65a3d3"));
        assert!(!is_description("e65a3d3477eg"));
        assert!(!is_description("unknown"));
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("build-commit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
