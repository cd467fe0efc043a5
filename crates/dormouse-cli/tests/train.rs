//! `dormouse train`, run as the real program: a short run, resume, and every bad input refused
//! with a clear message and a non-zero exit.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn train(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dormouse"))
        .arg("train")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run train")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SHORT: [&str; 8] = [
    "--preset",
    "nano",
    "--batch",
    "2",
    "--seq",
    "32",
    "--eval-bytes",
    "4096",
];

fn corpus(dir: &Path) -> String {
    let text: String = "so it goes, and so it went, and so it will go on. ".repeat(400);
    fs::write(dir.join("corpus.txt"), text).unwrap();
    "corpus.txt".to_string()
}

#[test]
fn a_short_run_saves_logs_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(dir.path());
    let out = train(
        dir.path(),
        &[
            &SHORT[..],
            &[
                "--steps",
                "6",
                "--data",
                &data,
                "--log",
                "run.jsonl",
                "--eval-every",
                "3",
            ],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("gzip -9") && err.contains("xz -9") && err.contains("zstd -19"),
        "{err}"
    );
    assert!(err.contains("held-out bits per byte"), "{err}");
    assert!(dir.path().join("checkpoints/latest.bin").is_file());
    let snapshot = fs::read_to_string(dir.path().join("checkpoints/latest.config.toml")).unwrap();
    assert_eq!(
        dormouse::DormouseConfig::from_toml(&snapshot).unwrap(),
        dormouse::DormouseConfig::preset("nano").unwrap()
    );

    let again = train(
        dir.path(),
        &[&SHORT[..], &["--steps", "6", "--data", &data]].concat(),
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("pass --resume"),
        "{}",
        stderr(&again)
    );

    let resumed = train(
        dir.path(),
        &[
            "--resume",
            "--steps",
            "9",
            "--data",
            &data,
            "--log",
            "run.jsonl",
        ],
    );
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let log = fs::read_to_string(dir.path().join("run.jsonl")).unwrap();
    let steps: Vec<u64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("step").and_then(serde_json::Value::as_u64))
        .collect();
    assert_eq!(
        steps,
        (0..9).collect::<Vec<_>>(),
        "the resumed run continues at step 6"
    );
}

#[test]
fn resume_refuses_a_changed_config_or_setting_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(dir.path());
    assert!(
        train(
            dir.path(),
            &[&SHORT[..], &["--steps", "2", "--data", &data]].concat()
        )
        .status
        .success()
    );
    let out = train(
        dir.path(),
        &["--resume", "--preset", "small", "--data", &data],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("d_model: 64 in the snapshot, 384 asked"),
        "{}",
        stderr(&out)
    );
    let out = train(dir.path(), &["--resume", "--lr", "0.5", "--data", &data]);
    assert!(
        stderr(&out).contains("--lr cannot change"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_inputs_are_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("tiny.txt"), "too short").unwrap();
    fs::write(dir.path().join("empty.txt"), "").unwrap();
    fs::write(
        dir.path().join("blocker"),
        "a file where the checkpoint folder should be",
    )
    .unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--data", "missing.txt"], "missing.txt"),
        (&["--data", "empty.txt"], "no training bytes"),
        (
            &["--data", "tiny.txt"],
            "needs at least one training window",
        ),
        (
            &["--data", "tiny.txt", "--ckpt-dir", "blocker"],
            "cannot create blocker",
        ),
        (&["--preset", "huge"], "no preset named \"huge\""),
    ];
    for (args, expected) in cases {
        let out = train(
            dir.path(),
            &[
                &["--steps", "1", "--seq", "32", "--eval-bytes", "64"][..],
                args,
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_diverging_run_stops_naming_the_step_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(dir.path());
    let ok = train(
        dir.path(),
        &[&SHORT[..], &["--steps", "2", "--data", &data]].concat(),
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let good = fs::read(dir.path().join("checkpoints/latest.bin")).unwrap();
    // A learning rate of 1e30 sends the weights to infinity on the first update.
    let fname = "diverge";
    let out = train(
        dir.path(),
        &[
            &SHORT[..],
            &[
                "--steps",
                "5",
                "--data",
                &data,
                "--lr",
                "1e30",
                "--warmup",
                "1",
                "--ckpt-name",
                fname,
                "--save-every",
                "1",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the loss became") && stderr(&out).contains("at step"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        fs::read(dir.path().join("checkpoints/latest.bin")).unwrap(),
        good,
        "another run's checkpoint is untouched"
    );
}

#[test]
fn an_engram_ram_run_saves_its_sidecar_and_resume_refuses_other_slots() {
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(dir.path());
    let first = &[&SHORT[..], &["--steps", "3", "--data", &data]].concat();
    let out = train(
        dir.path(),
        &[&first[..], &["--engram-slots", "2048"]].concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("generate` refuses it"),
        "{}",
        stderr(&out)
    );
    let ckpt = dir.path().join("checkpoints");
    let sidecar = fs::read(ckpt.join("latest.ngram")).unwrap();
    assert_eq!(&sidecar[..8], b"DMNGRAM\0");
    // nano: 2 orders x 2048 slots x 16 floats, three arrays (table, two moments).
    assert_eq!(sidecar.len(), 80 + 3 * 2 * 2048 * 16 * 4);
    let snapshot = fs::read_to_string(ckpt.join("latest.config.toml")).unwrap();
    assert!(snapshot.contains("engram_rows = 1") && snapshot.contains("engram_slots = 2048"));

    let out = train(
        dir.path(),
        &["--resume", "--engram-slots", "4096", "--data", &data],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("engram_slots: 2048 in the snapshot, 4096 asked"),
        "{}",
        stderr(&out)
    );
    let out = train(dir.path(), &["--resume", "--steps", "5", "--data", &data]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `dormouse train` runs candle's element-wise operations on the calling thread unless
/// `CANDLE_NUM_THREADS` says otherwise; the losses are the same either way, bit for bit (a
/// batch large enough that candle splits its element-wise operations when it may).
#[test]
fn the_element_wise_thread_count_leaves_the_losses_alone() {
    let losses = |elementwise_threads: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let data = corpus(dir.path());
        let mut command = Command::new(env!("CARGO_BIN_EXE_dormouse"));
        command.current_dir(dir.path()).args([
            "train",
            "--preset",
            "nano",
            "--batch",
            "8",
            "--seq",
            "256",
            "--eval-bytes",
            "4096",
            "--steps",
            "3",
            "--data",
            &data,
            "--log",
            "run.jsonl",
        ]);
        if let Some(threads) = elementwise_threads {
            command.env("CANDLE_NUM_THREADS", threads);
        }
        let out = command.output().expect("run train");
        assert!(out.status.success(), "{}", stderr(&out));
        let log = fs::read_to_string(dir.path().join("run.jsonl")).unwrap();
        let losses: Vec<String> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("loss").map(ToString::to_string))
            .collect();
        assert_eq!(losses.len(), 3, "{log}");
        losses
    };
    assert_eq!(losses(None), losses(Some("2")));
}
