//! `minirun serve`, started for real on 127.0.0.1 and driven over HTTP: completions and chats
//! that answer exactly what `minirun run` (and `--chat`) generates; concurrent requests,
//! decoded as batches, each answered as it is alone; SSE that joins to the whole answer; stop
//! sequences; OpenAI-shaped refusals; a verified artifact served from its evidence; a graceful
//! shutdown on SIGTERM; and the official `openai` client (pinned in
//! `tools/requirements-openai.txt`, installed into `target/openai-venv` on first use: that
//! needs Python >= 3.11 and the PyPI registry).

mod serving;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use serving::{Server, post};

fn minirun() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_minirun"));
    // This test binary's evidence key: the user's own stays untouched.
    command.env(
        "MINIRUN_EVIDENCE_KEY",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-tests.key"),
    );
    command
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DeepSeek-V3 fixture packed into `dir/name`.
fn packed(dir: &Path, name: &str) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    let out = dir.join(name);
    ok(minirun()
        .args(["pack", "--source"])
        .arg(&fixture)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    out
}

/// What `minirun run --json` generates for `prompt` (as a chat with `chat`).
fn run_json(
    artifact: &Path,
    prompt: &str,
    max_tokens: usize,
    chat: bool,
    sampling: &[&str],
) -> Value {
    let mut command = minirun();
    command
        .arg("run")
        .arg(artifact)
        .args(["--prompt", prompt, "--max-tokens", &max_tokens.to_string()])
        .args(["--unverified", "--json"])
        .args(sampling);
    if chat {
        command.arg("--chat");
    }
    serde_json::from_slice(&ok(command.output().unwrap()).stdout).unwrap()
}

fn text_of(answer: &Value) -> String {
    answer["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn serve_answers_what_run_generates_alone_and_together_streams_and_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = packed(dir.path(), "tiny");
    let server = Server::start(
        minirun(),
        &artifact,
        &["--unverified", "--max-concurrent", "8"],
    );

    let health = ureq::get(&server.url("/health")).call().unwrap();
    assert_eq!(health.into_json::<Value>().unwrap()["status"], "ok");
    let models: Value = ureq::get(&server.url("/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["verified"], false);

    // A completion is what `minirun run` generates, token counts included.
    let ran = run_json(&artifact, "The clockmaker", 12, false, &[]);
    let whole = server
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "The clockmaker", "max_tokens": 12, "temperature": 0}),
        )
        .unwrap();
    assert_eq!(text_of(&whole), ran["text"].as_str().unwrap());
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["usage"]["prompt_tokens"], ran["prompt_tokens"]);
    assert_eq!(whole["usage"]["completion_tokens"], ran["generated_tokens"]);
    assert_eq!(whole["choices"][0]["finish_reason"], "length");

    // A chat is what `minirun run --chat` generates; its stream joins to the same message.
    let ran_chat = run_json(&artifact, "Count to three.", 10, true, &[]);
    let chat_body = json!({"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 10, "temperature": 0});
    let chat = server.post("/v1/chat/completions", &chat_body).unwrap();
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    let content = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content, ran_chat["text"].as_str().unwrap());
    let mut streamed_body = chat_body.clone();
    streamed_body["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &streamed_body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, content);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        chat["choices"][0]["finish_reason"]
    );
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );

    // A stop sequence ends the text before it.
    let full = ran["text"].as_str().unwrap();
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(2).collect();
    let stopped = server
        .post(
            "/v1/completions",
            &json!({"prompt": "The clockmaker", "max_tokens": 12, "temperature": 0, "stop": stop}),
        )
        .unwrap();
    assert_eq!(text_of(&stopped), full[..full.find(&stop).unwrap()]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Requests alone, then all at once: each gets its alone answer.
    let prompts = [
        "The clockmaker",
        "Once upon",
        "A",
        "In the beginning",
        "Tick",
        "Hello there",
    ];
    let temperatures = [0.0, 0.8, 1.0];
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            json!({
                "prompt": prompts[i],
                "max_tokens": 6 + 3 * i,
                "temperature": temperatures[i % 3],
                "top_p": 0.9,
                "seed": 100 + i,
            })
        })
        .collect();
    let alone: Vec<String> = bodies
        .iter()
        .map(|b| text_of(&server.post("/v1/completions", b).unwrap()))
        .collect();
    let sampled = run_json(
        &artifact,
        "Once upon",
        9,
        false,
        &["--temperature", "0.8", "--top-p", "0.9", "--seed", "101"],
    );
    assert_eq!(
        alone[1],
        sampled["text"].as_str().unwrap(),
        "the seed names run's continuation"
    );
    let url = server.url("/v1/completions");
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| scope.spawn(|| text_of(&post(&url, b).unwrap())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);

    // Refusals name what is wrong, in OpenAI's shape.
    let refused = |path: &str, body: Value| server.post(path, &body).unwrap_err();
    let (status, error) = refused("/v1/completions", json!({"model": "other", "prompt": "x"}));
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let (status, error) = refused(
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 100000}),
    );
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let (status, error) = refused(
        "/v1/chat/completions",
        json!({"messages": [{"role": "tool", "content": "x"}]}),
    );
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (400, Some("messages"))
    );
    let (status, error) = refused("/v1/chat/completions", json!({"messages": [], "n": 2}));
    assert_eq!(status, 400, "{error}");
    let (status, error) = refused("/v1/nothing", json!({}));
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    match ureq::get(&server.url("/v1/completions")).call() {
        Err(ureq::Error::Status(405, _)) => {}
        other => panic!("GET /v1/completions: {other:?}"),
    }

    let (code, said) = server.stop();
    assert_eq!(code, Some(0), "{said:#?}");
    let summary = said
        .iter()
        .find(|l| l.contains("batched steps"))
        .unwrap_or_else(|| panic!("no summary in {said:#?}"));
    let mean: f64 = summary
        .split("mean batch ")
        .nth(1)
        .and_then(|m| m.trim_end_matches(')').parse().ok())
        .unwrap();
    assert!(
        mean > 1.0,
        "the concurrent requests shared steps: {summary}"
    );
}

/// Kimi K3's tiny fixture packed into `dir/k3`, its tokenizer K3's own kind: a
/// `tiktoken.model` (the 256 single bytes; with the 256 reserved ids, the model's 512).
fn packed_k3_with_tiktoken(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/kimi-k3/mlx-k3mix");
    let out = dir.join("k3");
    ok(minirun()
        .args(["pack", "--source"])
        .arg(&fixture)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::remove_file(out.join(name)).unwrap();
    }
    use base64::Engine;
    let bytes_only: String = (0..=255u8)
        .map(|b| {
            let token = base64::engine::general_purpose::STANDARD.encode([b]);
            format!("{token} {b}\n")
        })
        .collect();
    std::fs::write(out.join("tiktoken.model"), bytes_only).unwrap();
    out
}

/// A mebibyte prompt is refused by its length in bytes, before it is tokenized and away from
/// the decode thread, while another request decodes on to exactly what it gets alone.
#[test]
fn a_prompt_too_long_in_bytes_is_refused_while_others_decode() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = packed_k3_with_tiktoken(dir.path());
    let ran = run_json(&artifact, "The clockmaker", 24, false, &[]);
    let server = Server::start(
        minirun(),
        &artifact,
        &["--unverified", "--max-concurrent", "2"],
    );
    let url = server.url("/v1/completions");
    let body = json!({"prompt": "The clockmaker", "max_tokens": 24, "temperature": 0});
    let word = "lock".repeat(250_000);
    std::thread::scope(|scope| {
        let decoding = scope.spawn(|| text_of(&post(&url, &body).unwrap()));
        let (status, error) = server
            .post("/v1/completions", &json!({"prompt": word, "max_tokens": 1}))
            .unwrap_err();
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (400, Some("context_length_exceeded"))
        );
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("1000000 bytes"), "{message}");
        let chat = json!({"messages": [{"role": "user", "content": word}]});
        let (status, error) = server.post("/v1/chat/completions", &chat).unwrap_err();
        assert_eq!(
            (status, error["error"]["code"].as_str()),
            (400, Some("context_length_exceeded"))
        );
        assert_eq!(decoding.join().unwrap(), ran["text"].as_str().unwrap());
    });
}

#[test]
fn a_verified_artifact_is_served_from_its_evidence_and_one_without_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = packed(dir.path(), "tiny");
    let out = minirun()
        .arg("serve")
        .arg(&artifact)
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no verification evidence") && err.contains("minirun verify"),
        "{err}"
    );

    ok(minirun().arg("verify").arg(&artifact).output().unwrap());
    let server = Server::start(minirun(), &artifact, &[]);
    let models: Value = ureq::get(&server.url("/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(models["data"][0]["verified"], true);
    let answer = server
        .post(
            "/v1/completions",
            &json!({"prompt": "The clockmaker", "max_tokens": 4, "temperature": 0}),
        )
        .unwrap();
    let ran = run_json(&artifact, "The clockmaker", 4, false, &[]);
    assert_eq!(text_of(&answer), ran["text"].as_str().unwrap());

    let out = minirun()
        .arg("serve")
        .arg(&artifact)
        .args(["--port", "0", "--budget", "1KiB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("floor"),
        "a budget below the floor is refused"
    );
}

/// The python of the project's `openai` environment (`tools/python-venv.sh openai`, made on
/// first use; that needs python3 and the PyPI registry).
fn client_python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/python-venv.sh");
    let out = Command::new(script)
        .arg("openai")
        .output()
        .expect("tools/python-venv.sh runs");
    assert!(
        out.status.success(),
        "tools/python-venv.sh openai failed (it needs python3 and the PyPI registry): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn the_official_openai_client_chats_streams_and_completes() {
    let python = client_python();
    let dir = tempfile::tempdir().unwrap();
    let artifact = packed(dir.path(), "tiny");
    let server = Server::start(minirun(), &artifact, &["--unverified"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/openai_chat_check.py");
    let out = Command::new(python)
        .arg(script)
        .args([&server.url("/v1"), "tiny", "Count to three.", "10"])
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&ok(out).stdout).unwrap();
    let chat = run_json(&artifact, "Count to three.", 10, true, &[]);
    assert_eq!(result["chat"], chat["text"]);
    assert_eq!(result["usage"]["prompt_tokens"], chat["prompt_tokens"]);
    let completion = run_json(&artifact, "Count to three.", 10, false, &[]);
    assert_eq!(result["completion"], completion["text"]);
}
