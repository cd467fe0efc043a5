//! The page `minirun serve` serves at `/`, used in headless Chromium as a person would: a chat
//! typed and sent with Enter streams back exactly what `minirun run --chat` prints, the
//! regenerate button gives the same greedy answer again, the memory dial shows the running
//! plan (the floor) beside what other budgets would hold, the instruments count the tokens
//! decoded, the identity says the artifact is unverified, the layout fits a phone's width, and
//! the page raises no JavaScript error. Screenshots go to `target/page-screenshots/`.

#[path = "../../http-serve/tests/browser/mod.rs"]
mod browser;
mod serving;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use browser::PageDriver;
use serde_json::Value;
use serving::Server;

const PROMPT: &str = "Tell me about clocks.";
const MAX_TOKENS: usize = 24;

fn minirun() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_minirun"));
    command.env(
        "MINIRUN_EVIDENCE_KEY",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-tests.key"),
    );
    command
}

fn succeeded(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The DeepSeek-V3 fixture (a MoE, so the dial has experts to stream) packed into `dir/tiny`.
fn packed(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../minirun-runtime/tests/data/deepseek-v3/mlx-affine4-g64");
    let out = dir.join("tiny");
    succeeded(
        minirun()
            .args(["pack", "--source"])
            .arg(&fixture)
            .arg("--out")
            .arg(&out),
    );
    out
}

/// The text of the last assistant message once it is done streaming (null before).
const LAST_REPLY_DONE: &str = "(() => {
    const replies = [...document.querySelectorAll('#messages article[data-role=assistant]')];
    const last = replies[replies.length - 1];
    return last && last.dataset.state === 'done' ? last.querySelector('.content').textContent : null;
})()";

#[test]
fn the_page_chats_like_run_shows_the_dial_and_the_instruments_and_raises_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = packed(dir.path());
    let ran: Value = serde_json::from_slice(&succeeded(
        minirun()
            .arg("run")
            .arg(&artifact)
            .args(["--prompt", PROMPT, "--max-tokens", &MAX_TOKENS.to_string()])
            .args(["--chat", "--unverified", "--json"]),
    ))
    .unwrap();
    let expected = ran["text"].as_str().unwrap();
    let generated = ran["generated_tokens"].as_u64().unwrap();
    assert!(!expected.is_empty(), "the fixture's reply is empty: {ran}");

    let server = Server::start(minirun(), &artifact, &["--unverified", "--budget", "floor"]);
    // The page's files come from the binary, and may load nothing from anywhere else.
    for (path, kind) in [
        ("/", "text/html"),
        ("/page/app.js", "text/javascript"),
        ("/page/style.css", "text/css"),
    ] {
        let response = ureq::get(&server.url(path)).call().unwrap();
        assert!(
            response.content_type().starts_with(kind),
            "{path}: {}",
            response.content_type()
        );
        let policy = response
            .header("content-security-policy")
            .unwrap_or_default();
        assert!(
            policy.contains("default-src 'self'") && policy.contains("script-src 'self'"),
            "{path}: {policy}"
        );
    }
    let about = server.get("/api/about");
    // The fixture's max_position_embeddings (256) is below the default context of 4096.
    assert_eq!(
        (about["mode"].as_str(), about["context"].as_u64()),
        (Some("chat"), Some(256))
    );
    let page = PageDriver::open(&server.url("/"), (1280, 1700));
    let long = Duration::from_secs(120);

    // Who is served, and that nobody vouches for its bytes.
    page.wait_for(
        "the model's name",
        "document.querySelector('#model-name').textContent === 'tiny'",
        long,
    );
    assert_eq!(
        page.js("document.querySelector('#identity').dataset.verified"),
        "false"
    );
    let provenance = page.js("document.querySelector('#provenance').textContent");
    assert!(
        provenance.as_str().unwrap().contains("--unverified"),
        "{provenance}"
    );

    // The dial stands at the running plan, the floor, and knows the other budgets.
    let memory = server.get("/api/memory");
    let plans = memory["plans"].as_array().unwrap();
    let running = plans.iter().position(|p| p["running"] == true).unwrap();
    // A client learns the artifact's name, not where it lies on the server's machine.
    let folder = dir.path().display().to_string();
    for (route, answer) in [("/api/about", &about), ("/api/memory", &memory)] {
        assert!(
            !answer.to_string().contains(&folder),
            "{route} shows the artifact's path: {answer}"
        );
        assert!(answer.to_string().contains("tiny"), "{route}: {answer}");
    }
    assert_eq!(plans[running]["budget"], memory["floor"]);
    assert!(plans.len() >= 2, "{memory}");
    page.wait_for(
        "the dial",
        "!document.querySelector('#dial').hidden && document.querySelector('#dial-budget').max !== ''",
        long,
    );
    assert_eq!(
        page.js("Number(document.querySelector('#dial-budget').value)"),
        running
    );
    assert_eq!(
        page.js("Number(document.querySelector('#dial-budget').max)"),
        plans.len() - 1
    );
    let dial_text = page.js("document.querySelector('#dial').textContent");
    assert!(
        dial_text.as_str().unwrap().contains("running now"),
        "{dial_text}"
    );

    // The instruments poll before anything is asked.
    page.wait_for(
        "the instruments' first reading",
        "Number(document.querySelector('#instruments').dataset.updates) >= 1",
        long,
    );

    // A chat typed and sent with Enter streams back what `minirun run --chat` prints.
    page.retype("#max-tokens", &MAX_TOKENS.to_string());
    page.type_into("#prompt", PROMPT);
    page.press("Enter");
    let reply = page.wait_for("the streamed reply", LAST_REPLY_DONE, long);
    assert_eq!(reply, expected);
    assert_eq!(
        page.js("document.querySelector('#messages article[data-role=user] .content').textContent"),
        PROMPT
    );
    page.wait_for(
        "the instruments to count the reply",
        &format!(
            "Number(document.querySelector('#instruments').dataset.totalTokens) >= {generated}"
        ),
        long,
    );
    let instruments = server.get("/api/instruments");
    assert_eq!(instruments["totals"]["tokens"], generated);
    assert!(
        instruments["totals"]["read_bytes"].as_u64().unwrap() > 0,
        "the floor streams: {instruments}"
    );

    // Regenerate: the reply is replaced by the same greedy answer.
    page.click("#regenerate");
    page.wait_for(
        "the regenerated reply",
        &format!(
            "Number(document.querySelector('#instruments').dataset.totalTokens) >= {}",
            2 * generated
        ),
        long,
    );
    let again = page.wait_for("the regenerated reply to finish", LAST_REPLY_DONE, long);
    assert_eq!(again, expected);
    assert_eq!(
        page.js("document.querySelectorAll('#messages article').length"),
        2
    );

    page.screenshot("minirun-serve");
    page.set_width(390, 844);
    assert_eq!(
        page.js("document.documentElement.scrollWidth <= window.innerWidth"),
        true,
        "the page scrolls sideways at a phone's width"
    );
    page.screenshot("minirun-serve-phone");

    // Clear, then Stop: a long reply stopped while it streams is marked so, and the server lets
    // it go. (The conversation is cleared first: with it, 200 more tokens would not fit the
    // fixture's context of 256.)
    page.click("#clear");
    assert_eq!(
        page.js("document.querySelectorAll('#messages article').length"),
        0
    );
    page.retype("#max-tokens", "200");
    page.type_into("#prompt", "And again, at length.");
    page.press("Enter");
    page.wait_for(
        "the long reply to start",
        "(() => {
            const replies = [...document.querySelectorAll('#messages article[data-role=assistant]')];
            const last = replies[replies.length - 1];
            return replies.length === 1 && last.dataset.state === 'streaming'
                && last.querySelector('.content').textContent.length > 0;
        })()",
        long,
    );
    page.click("#stop");
    page.wait_for(
        "the reply to show it was stopped",
        "[...document.querySelectorAll('#messages article[data-role=assistant]')].pop().dataset.state === 'stopped'",
        long,
    );
    let started = std::time::Instant::now();
    while server.get("/api/instruments")["batch"] != 0 {
        assert!(
            started.elapsed() < long,
            "the server kept decoding a stopped reply"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let tokens = server.get("/api/instruments")["totals"]["tokens"]
        .as_u64()
        .unwrap();
    assert!(
        tokens < 2 * generated + 200,
        "the stopped reply ran to its end"
    );
    assert!(
        page.errors().is_empty(),
        "the page raised errors: {:#?}",
        page.errors()
    );
}
