//! `dormouse train --log` draws its curves beside the log at each evaluation, and `dormouse
//! plot` draws an existing log where `--out` says; a format it cannot write, or a log that is
//! not one, is refused with what to give instead.

mod common;

use common::{run, stderr};

#[test]
fn train_draws_its_curves_beside_its_log_and_plot_redraws_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        "train",
        &[
            "--preset",
            "nano",
            "--steps",
            "20",
            "--batch",
            "2",
            "--seq",
            "32",
            "--eval-bytes",
            "2048",
            "--eval-every",
            "10",
            "--log",
            "run.jsonl",
        ],
    );
    assert!(out.status.success(), "train: {}", stderr(&out));
    assert!(
        stderr(&out).contains("curves drawn in run.svg and run.png"),
        "{}",
        stderr(&out)
    );
    let svg = std::fs::read_to_string(dir.path().join("run.svg")).unwrap();
    for label in [
        "held-out (model)",
        "training batch",
        "gzip -9: ",
        "learning rate",
    ] {
        assert!(svg.contains(label), "{label:?} is not in the chart");
    }
    let png = std::fs::read(dir.path().join("run.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let plotted = run(dir.path(), "plot", &["run.jsonl", "--out", "curves.svg"]);
    assert!(plotted.status.success(), "{}", stderr(&plotted));
    assert_eq!(
        String::from_utf8_lossy(&plotted.stdout).trim(),
        "curves.svg"
    );
    // The same log gives the same chart, whoever draws it.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("curves.svg")).unwrap(),
        svg
    );

    let refused = run(dir.path(), "plot", &["run.jsonl", "--out", "curves.pdf"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(".svg or .png"),
        "{}",
        stderr(&refused)
    );
    assert!(!dir.path().join("curves.pdf").exists());

    std::fs::write(dir.path().join("notes.jsonl"), "{\"hello\": 1}\n").unwrap();
    let refused = run(dir.path(), "plot", &["notes.jsonl"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("line 1 is not a line of a dormouse training log"),
        "{}",
        stderr(&refused)
    );
    assert!(!dir.path().join("notes.svg").exists());
}
