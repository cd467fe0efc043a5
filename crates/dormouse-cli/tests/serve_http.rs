//! `serve`, started for real on 127.0.0.1 and driven over HTTP: the routes, completions that
//! agree with `generate`, SSE streaming ending in `[DONE]`, OpenAI-shaped errors for bad
//! requests, concurrent requests, and a graceful shutdown on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{Server, run, stderr, trained_export};
use serde_json::{Value, json};

fn post(server: &Server, body: &str) -> Result<Value, (u16, Value)> {
    match ureq::post(&server.url("/v1/completions"))
        .set("content-type", "application/json")
        .send_string(body)
    {
        Ok(r) => Ok(r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => Err((code, r.into_json().unwrap())),
        Err(e) => panic!("transport error {e}"),
    }
}

/// The data lines of a streamed completion, in order.
fn stream(server: &Server, body: Value) -> Vec<String> {
    let response = ureq::post(&server.url("/v1/completions"))
        .send_json(body)
        .unwrap();
    assert_eq!(response.content_type(), "text/event-stream");
    BufReader::new(response.into_reader())
        .lines()
        .map(Result::unwrap)
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn streamed_text(events: &[String]) -> (String, String) {
    let mut text = String::new();
    let mut finish = String::new();
    for event in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(event).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap());
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

#[test]
fn serve_answers_like_generate_streams_refuses_bad_requests_and_shuts_down_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 40, &[]);
    let server = Server::start(dir.path(), &export, &[]);

    let health: Value = ureq::get(&server.url("/health"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(health["status"], "ok");
    let models: Value = ureq::get(&server.url("/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "latest.bf16");

    // Greedy: the server's text is what `generate` prints.
    let whole = post(
        &server,
        r#"{"model":"latest.bf16","prompt":"And God said","max_tokens":40,"temperature":0}"#,
    )
    .unwrap();
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 40);
    assert_eq!(whole["usage"]["prompt_tokens"], 12);
    let generated = run(
        dir.path(),
        "generate",
        &[
            "--export",
            export.to_str().unwrap(),
            "--prompt",
            "And God said",
            "--steps",
            "40",
        ],
    );
    assert!(generated.status.success(), "{}", stderr(&generated));
    assert_eq!(
        String::from_utf8_lossy(&generated.stdout).trim_end_matches('\n'),
        text
    );

    // Streaming gives the same text, piece by piece, then [DONE].
    let events = stream(
        &server,
        json!({"prompt": "And God said", "max_tokens": 40, "temperature": 0, "stream": true}),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(events.len() > 3, "streamed in pieces: {events:?}");
    assert_eq!(streamed_text(&events), (text.clone(), "length".to_string()));

    // A stop sequence ends the text before it.
    if let Some(cut) = text.get(5..7).filter(|s| !s.trim().is_empty()) {
        let body =
            json!({"prompt": "And God said", "max_tokens": 40, "temperature": 0, "stop": cut});
        let stopped = post(&server, &body.to_string()).unwrap();
        assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            stopped["choices"][0]["text"].as_str().unwrap(),
            &text[..text.find(cut).unwrap()]
        );
    }

    // Seeded sampling is reproducible.
    let sampled =
        r#"{"prompt":"And","max_tokens":24,"temperature":0.9,"top_p":0.9,"top_k":40,"seed":7}"#;
    assert_eq!(
        post(&server, sampled).unwrap()["choices"],
        post(&server, sampled).unwrap()["choices"]
    );

    // Bad requests: OpenAI-shaped JSON errors.
    for (body, status, param) in [
        ("{not json", 400, Value::Null),
        (
            r#"{"prompt":"x","max_tokens":100000}"#,
            400,
            json!("max_tokens"),
        ),
        (
            r#"{"prompt":"x","temperature":-2}"#,
            400,
            json!("temperature"),
        ),
        (r#"{"max_tokens":3}"#, 400, json!("prompt")),
        (r#"{"model":"gpt-4","prompt":"x"}"#, 404, json!("model")),
    ] {
        let (code, error) = post(&server, body).unwrap_err();
        assert_eq!(code, status, "{body}");
        assert_eq!(error["error"]["param"], param, "{body}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(error["error"]["type"].is_string() && error["error"]["code"].is_string());
    }
    let huge = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(100_000));
    let (status, error) = post(&server, &huge).unwrap_err();
    assert_eq!(status, 413);
    assert_eq!(error["error"]["code"], "invalid_body");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limited to")),
        "{error}"
    );
    match ureq::get(&server.url("/v2/nothing")).call() {
        Err(ureq::Error::Status(404, r)) => {
            assert_eq!(
                r.into_json::<Value>().unwrap()["error"]["code"],
                "not_found"
            )
        }
        other => panic!("{other:?}"),
    }

    // Concurrent streams all complete, and a long one does not block /health.
    let long = {
        let url = server.url("/v1/completions");
        std::thread::spawn(move || {
            let body = json!({"prompt": "x", "max_tokens": 1500, "temperature": 0.5, "seed": 1, "stream": true});
            let response = ureq::post(&url).send_json(body).unwrap();
            BufReader::new(response.into_reader()).lines().count()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    ureq::get(&server.url("/health")).call().unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "health waited {:?}",
        asked.elapsed()
    );
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let url = server.url("/v1/completions");
            std::thread::spawn(move || {
                let body = json!({"prompt": "The", "max_tokens": 16, "seed": i, "stream": true});
                let response = ureq::post(&url).send_json(body).unwrap();
                let lines: Vec<String> = BufReader::new(response.into_reader())
                    .lines()
                    .map(Result::unwrap)
                    .collect();
                lines.iter().any(|l| l == "data: [DONE]")
            })
        })
        .collect();
    for worker in workers {
        assert!(worker.join().unwrap(), "every concurrent stream completed");
    }

    // SIGTERM: requests in flight are finished, then the server exits 0.
    let mut server = server;
    let pid = server.child.id().to_string();
    sigterm(&pid);
    assert!(
        long.join().unwrap() > 10,
        "the stream in flight was finished"
    );
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // The reader thread may still be forwarding the last lines: read until it hangs up at EOF.
    let log: Vec<String> =
        std::iter::from_fn(|| server.log.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert!(log.iter().any(|l| l.contains("stopped")), "{log:?}");
}

/// Requests sent at once are decoded as one batch (the shutdown summary's mean batch is above
/// 1), and each gets exactly the text `generate` prints for it alone, greedy and sampled.
#[test]
fn requests_decoded_together_each_get_what_generate_gives_them_alone() {
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 40, &[]);
    let file = export.to_str().unwrap().to_string();
    let asks: Vec<(&str, Vec<&str>, Value)> = vec![
        ("And God said", vec![], json!({"temperature": 0})),
        ("In the", vec![], json!({"temperature": 0})),
        (
            "The",
            vec!["--temperature", "0.8", "--top-k", "40", "--seed", "3"],
            json!({"temperature": 0.8, "top_k": 40, "seed": 3}),
        ),
        (
            "x",
            vec!["--temperature", "1.0", "--top-p", "0.9", "--seed", "11"],
            json!({"temperature": 1.0, "top_p": 0.9, "seed": 11}),
        ),
        ("Once upon a time there", vec![], json!({"temperature": 0})),
        (
            "a",
            vec!["--temperature", "0.5", "--seed", "5"],
            json!({"temperature": 0.5, "seed": 5}),
        ),
    ];
    let steps = 300;
    let expected: Vec<String> = asks
        .iter()
        .map(|(prompt, flags, _)| {
            let steps = steps.to_string();
            let mut args = vec!["--export", &file, "--prompt", prompt, "--steps", &steps];
            args.extend(flags.iter().copied());
            let out = run(dir.path(), "generate", &args);
            assert!(out.status.success(), "{}", stderr(&out));
            String::from_utf8_lossy(&out.stdout)
                .trim_end_matches('\n')
                .to_string()
        })
        .collect();
    let server = Server::start(dir.path(), &export, &[]);
    let start = std::sync::Arc::new(std::sync::Barrier::new(asks.len()));
    let workers: Vec<_> = asks
        .iter()
        .map(|(prompt, _, params)| {
            let url = server.url("/v1/completions");
            let mut body = params.clone();
            body["prompt"] = json!(prompt);
            body["max_tokens"] = json!(steps);
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let answer: Value = ureq::post(&url)
                    .send_json(body)
                    .unwrap()
                    .into_json()
                    .unwrap();
                answer["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect();
    for (i, (worker, expected)) in workers.into_iter().zip(&expected).enumerate() {
        assert_eq!(&worker.join().unwrap(), expected, "request {i}");
    }
    let mut server = server;
    sigterm(&server.child.id().to_string());
    assert!(server.child.wait().unwrap().success());
    // The summary is the server's last line; the thread reading its stderr may still hold it.
    let summary = std::iter::from_fn(|| server.log.recv_timeout(Duration::from_secs(10)).ok())
        .find(|l| l.contains("(mean batch "))
        .expect("the shutdown summary line");
    let mean: f64 = summary
        .split("(mean batch ")
        .nth(1)
        .and_then(|rest| rest.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("unreadable summary: {summary}"));
    assert!(
        mean > 1.5,
        "requests sent at once ran together: mean batch {mean}"
    );
}

/// Seconds until the server closes `stream` (reads return 0), or `None` within `limit`.
fn closed_within(stream: &mut std::net::TcpStream, limit: Duration) -> Option<f64> {
    use std::io::Read;
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed().as_secs_f64()),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

#[test]
fn half_sent_requests_are_cut_off_and_a_shutdown_waits_for_them_only_so_long() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 2, &[]);
    let limits = [
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--shutdown-grace",
        "2",
    ];
    let mut server = Server::start(dir.path(), &export, &limits);
    let address = server.base.trim_start_matches("http://").to_string();

    // Headers that never end: the connection is closed after the header timeout.
    let mut slow = std::net::TcpStream::connect(&address).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let closed = closed_within(&mut slow, Duration::from_secs(10));
    assert!(closed.is_some_and(|s| s < 5.0), "closed after {closed:?} s");

    // A body that never arrives: 408 after the body timeout.
    let mut trickle = std::net::TcpStream::connect(&address).unwrap();
    trickle
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\"",
        )
        .unwrap();
    trickle
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = trickle.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"invalid_body""#), "{answer}");

    // /health still answers beside a held connection.
    let _held = {
        let mut held = std::net::TcpStream::connect(&address).unwrap();
        held.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .unwrap();
        held
    };
    let health: Value = ureq::get(&server.url("/health"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(health["status"], "ok");

    // SIGTERM with a client holding a half-sent request: the server exits within its grace.
    let mut partial = std::net::TcpStream::connect(&address).unwrap();
    partial
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = server.child.id().to_string();
    let stopped = Instant::now();
    sigterm(&pid);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(stopped.elapsed() < Duration::from_secs(8));
}

#[test]
fn health_answers_again_once_idle_connections_time_out_under_a_low_descriptor_limit() {
    use rustix::process::{Pid, Resource, Rlimit, prlimit};
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 2, &[]);
    let server = Server::start(dir.path(), &export, &["--header-timeout", "1"]);
    let pid = Pid::from_raw(server.child.id() as i32).unwrap();
    let limit = Rlimit {
        current: Some(64),
        maximum: Some(64),
    };
    prlimit(Some(pid), Resource::Nofile, limit).unwrap();
    let address = server.base.trim_start_matches("http://").to_string();

    // More half-sent requests than the server has descriptors: accepts fail until the header
    // timeout closes the connections it holds.
    let held: Vec<std::net::TcpStream> = (0..150)
        .map(|_| {
            let mut slow = std::net::TcpStream::connect(&address).unwrap();
            slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .unwrap();
            slow
        })
        .collect();
    let asked = Instant::now();
    let health: Value = ureq::get(&server.url("/health"))
        .timeout(Duration::from_secs(30))
        .call()
        .expect("/health stopped answering")
        .into_json()
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "answered after {:?}",
        asked.elapsed()
    );
    drop(held);
}

fn sigterm(pid: &str) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", pid])
        .status()
        .unwrap();
    assert!(sent.success());
}
