//! Shared by the tests of the `dormouse` program: running its commands, and a trained and
//! exported nano run in a temporary folder.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `dormouse <command>`, ready for its arguments.
pub fn bin(command: &str) -> Command {
    let mut dormouse = Command::new(env!("CARGO_BIN_EXE_dormouse"));
    dormouse.arg(command);
    dormouse
}

pub fn run(dir: &Path, name: &str, args: &[&str]) -> Output {
    bin(name)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the binary")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Trains nano for `steps` on the embedded corpus in `dir` (extra `train` flags allowed) and
/// exports it as bf16; returns the export's path.
pub fn trained_export(dir: &Path, steps: u32, extra: &[&str]) -> PathBuf {
    let steps = steps.to_string();
    let mut args = vec![
        "--steps",
        &steps,
        "--batch",
        "4",
        "--seq",
        "64",
        "--eval-bytes",
        "4096",
        "--lr",
        "0.01",
    ];
    if !extra.contains(&"--config") {
        args.extend_from_slice(&["--preset", "nano"]);
    }
    args.extend_from_slice(extra);
    let out = run(dir, "train", &args);
    assert!(out.status.success(), "train: {}", stderr(&out));
    let out = run(
        dir,
        "export",
        &["run", "--ckpt-dir", "checkpoints", "--ckpt-name", "latest"],
    );
    assert!(out.status.success(), "export: {}", stderr(&out));
    let path = dir.join("checkpoints/latest.bf16.dmexp");
    assert!(fs::metadata(&path).is_ok());
    path
}

/// A `serve` process on 127.0.0.1 with a free port; killed when dropped.
pub struct Server {
    pub child: std::process::Child,
    pub base: String,
    pub log: std::sync::mpsc::Receiver<String>,
}

impl Server {
    pub fn start(dir: &Path, export: &Path, extra: &[&str]) -> Server {
        use std::io::BufRead;
        let mut child = bin("serve")
            .arg("--export")
            .arg(export)
            .args(["--port", "0"])
            .args(extra)
            .current_dir(dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start serve");
        let lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let (send, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let first = log
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("serve printed its address");
        let address = first
            .split("on http://")
            .nth(1)
            .and_then(|rest| rest.split("/v1").next())
            .unwrap_or_else(|| panic!("no address in {first:?}"));
        Server {
            child,
            base: format!("http://{address}"),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
