//! `minirun quickstart` end to end, in a small size: every step reported, the run at the floor
//! equal to the resident run, the commands it prints next run as printed, a rerun replacing
//! what the last one wrote, and a folder holding anything else refused and left alone.

mod common;

use std::path::Path;
use std::process::Command;

use common::{minirun, stderr};

fn quickstart(dir: &Path) -> std::process::Output {
    let dir = dir.to_str().unwrap();
    minirun(&[
        "quickstart",
        "--dir",
        dir,
        "--size-mb",
        "8",
        "--tokens",
        "6",
    ])
}

/// A printed `minirun ...` command, run by the shell as a person would paste it.
fn run_as_printed(command: &str) -> std::process::Output {
    let binary = env!("CARGO_BIN_EXE_minirun");
    let key =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(concat!(env!("CARGO_CRATE_NAME"), ".key"));
    let rest = command.strip_prefix("minirun ").expect("a minirun command");
    Command::new("sh")
        .arg("-c")
        .arg(format!("'{binary}' {rest}"))
        .env("MINIRUN_EVIDENCE_KEY", key)
        .output()
        .unwrap()
}

#[test]
fn the_quickstart_runs_at_the_floor_with_the_resident_bits_and_its_next_commands_work() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("qs");
    let out = quickstart(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for step in [
        "1/6 generating",
        "2/6 packing",
        "3/6 signing",
        "4/6 verifying",
        "5/6 running at the floor",
    ] {
        assert!(text.contains(step), "{step}: {text}");
    }
    assert!(
        text.contains("(routed experts and every layer streamed): floor"),
        "{text}"
    );
    assert!(
        text.contains("6/6 the floor's 6 tokens and every logit equal the resident run's"),
        "{text}"
    );
    assert!(dir.join("artifact/.minirun/evidence.json").is_file());
    let next: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "next:")
        .skip(1)
        .map(|l| l.trim().split("   #").next().unwrap().trim())
        .collect();
    assert_eq!(next.len(), 3, "{text}");
    assert!(next[0].starts_with("minirun serve ") && next[0].ends_with("--budget floor"));
    let run = run_as_printed(next[1]);
    assert!(run.status.success(), "{}: {}", next[1], stderr(&run));
    assert!(stderr(&run).contains("tokens/s"), "{}", stderr(&run));
    let plan = run_as_printed(next[2]);
    assert!(plan.status.success(), "{}: {}", next[2], stderr(&plan));
    assert!(String::from_utf8_lossy(&plan.stdout).contains("balanced"));

    // A rerun replaces what the last one wrote.
    let again = quickstart(&dir);
    assert!(again.status.success(), "{}", stderr(&again));
}

#[test]
fn a_folder_holding_anything_else_is_refused_and_left_alone() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("notes.txt"), b"mine").unwrap();
    let out = quickstart(root.path());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("notes.txt") && err.contains("--dir"), "{err}");
    let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "nothing was written beside it");
    assert_eq!(
        std::fs::read(root.path().join("notes.txt")).unwrap(),
        b"mine"
    );
}
