//! A `minirun serve` process on 127.0.0.1 for the tests that drive it: started on a free port,
//! its address read from what it prints, its stderr kept, killed when dropped. Shared by the
//! serve tests (included with `mod serving;`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use serde_json::Value;

pub struct Server {
    child: Child,
    pub base: String,
    log: Receiver<String>,
}

impl Server {
    /// Runs `minirun` (the command, with its environment) as `serve ARTIFACT --port 0 EXTRA`.
    pub fn start(mut minirun: Command, artifact: &Path, extra: &[&str]) -> Server {
        let mut child = minirun
            .arg("serve")
            .arg(artifact)
            .args(["--port", "0"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start minirun serve");
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (send, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let mut header = Vec::new();
        let address = loop {
            let line = log
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("serve printed no address; it said {header:#?}"));
            if let Some(rest) = line.split("on http://").nth(1) {
                break rest.split("/v1").next().unwrap().to_string();
            }
            header.push(line);
        };
        Server {
            child,
            base: format!("http://{address}"),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str) -> Value {
        ureq::get(&self.url(path))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, (u16, Value)> {
        post(&self.url(path), body)
    }

    /// The data lines of a streamed answer, in order.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let response = ureq::post(&self.url(path)).send_json(body.clone()).unwrap();
        assert_eq!(response.content_type(), "text/event-stream");
        BufReader::new(response.into_reader())
            .lines()
            .map(Result::unwrap)
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    /// SIGTERM; the exit status and what it said from then on.
    pub fn stop(mut self) -> (Option<i32>, Vec<String>) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = self.child.wait().unwrap();
        // Read until the reader thread hangs up at EOF: it may still be forwarding the last lines.
        let said =
            std::iter::from_fn(|| self.log.recv_timeout(Duration::from_secs(10)).ok()).collect();
        (status.code(), said)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn post(url: &str, body: &Value) -> Result<Value, (u16, Value)> {
    match ureq::post(url).send_json(body.clone()) {
        Ok(r) => Ok(r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => Err((code, r.into_json().unwrap())),
        Err(e) => panic!("transport error {e}"),
    }
}
