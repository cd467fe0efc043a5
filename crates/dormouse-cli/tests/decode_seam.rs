//! Both inference commands refuse what they cannot serve honestly, before a byte is sampled:
//! an export whose Engram memory has one row per order (an `--engram-ram` run, or a config
//! with `engram_rows = 1`), a training checkpoint (naming the command that converts it,
//! without reading its optimizer or sidecar), and any other file (saying what it is).

mod common;

use std::fs;

use common::{run, stderr, trained_export};

fn refused_by_both(dir: &std::path::Path, file: &str) -> Vec<String> {
    ["generate", "serve"]
        .iter()
        .map(|command| {
            let args: Vec<&str> = match *command {
                "generate" => vec!["--export", file, "--prompt", "once", "--max-tokens", "8"],
                _ => vec!["--export", file, "--port", "0"],
            };
            let out = run(dir, command, &args);
            assert_eq!(out.status.code(), Some(1), "{command}: {}", stderr(&out));
            assert!(out.stdout.is_empty(), "{command} produced output");
            stderr(&out)
        })
        .collect()
}

#[test]
fn an_engram_ram_export_is_refused_naming_the_sidecar_and_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 2, &["--engram-ram", "--engram-slots", "4096"]);
    for message in refused_by_both(dir.path(), export.to_str().unwrap()) {
        assert!(message.contains("1 row(s) per order"), "{message}");
        assert!(
            message.contains(".ngram") && message.contains("--engram-ram"),
            "{message}"
        );
    }
}

#[test]
fn a_one_row_memory_without_engram_ram_is_refused_too_and_no_memory_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let nano = dormouse::DormouseConfig::preset("nano").unwrap();
    let one_row = dormouse::DormouseConfig {
        engram_rows: 1,
        ..nano.clone()
    };
    fs::write(dir.path().join("one-row.toml"), one_row.to_toml()).unwrap();
    let export = trained_export(dir.path(), 2, &["--config", "one-row.toml"]);
    for message in refused_by_both(dir.path(), export.to_str().unwrap()) {
        assert!(
            message.contains("every n-gram would read the same row"),
            "{message}"
        );
    }

    let no_memory = dormouse::DormouseConfig {
        use_engram: false,
        engram_rows: 1,
        ..nano
    };
    assert!(dormouse::serving::refuse_unservable_memory(&no_memory).is_ok());
}

#[test]
fn a_training_checkpoint_is_refused_with_the_export_command_and_its_sidecar_unread() {
    let dir = tempfile::tempdir().unwrap();
    trained_export(dir.path(), 2, &["--engram-ram", "--engram-slots", "2048"]);
    // Replace the sidecar with a FIFO: a command that opened it would block, not exit.
    let sidecar = dir.path().join("checkpoints/latest.ngram");
    fs::remove_file(&sidecar).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&sidecar)
            .status()
            .unwrap()
            .success()
    );
    for message in refused_by_both(dir.path(), "checkpoints/latest.bin") {
        assert!(message.contains("TRAINING CHECKPOINT"), "{message}");
        assert!(
            message.contains(
                "dormouse export run --ckpt-dir checkpoints --ckpt-name latest --dtype bf16"
            ),
            "{message}"
        );
    }
    fs::write(
        dir.path().join("notes.txt"),
        "hello, this is a plain text file, not a model",
    )
    .unwrap();
    for message in refused_by_both(dir.path(), "notes.txt") {
        assert!(message.contains("is not a dormouse export"), "{message}");
    }
    let info = run(
        dir.path(),
        "export",
        &["info", "checkpoints/latest.ngram.absent"],
    );
    assert_eq!(info.status.code(), Some(1));
}

#[test]
fn a_fifo_is_refused_at_once_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("pipe.dmexp"))
        .status()
        .unwrap();
    assert!(made.success());
    for message in refused_by_both(dir.path(), "pipe.dmexp") {
        assert!(message.contains("a FIFO (named pipe)"), "{message}");
    }
    let out = run(dir.path(), "export", &["info", "pipe.dmexp"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a FIFO (named pipe)"),
        "{}",
        stderr(&out)
    );
}
