//! The page `dormouse serve` serves at `/` (the same page as `minirun serve`'s, from the
//! shared HTTP crate), used in headless Chromium: the byte-level model has no chat template,
//! so the page says it continues text, and a prompt typed and sent with Enter streams back
//! exactly what `dormouse generate` prints; there is no memory dial and no instruments, the
//! identity says no publisher vouches for the export, and the page raises no JavaScript error.

#[path = "../../http-serve/tests/browser/mod.rs"]
mod browser;
mod common;

use std::time::Duration;

use browser::PageDriver;
use common::{Server, run, stderr, trained_export};

#[test]
fn the_page_continues_a_prompt_like_generate_and_shows_no_dial() {
    let dir = tempfile::tempdir().unwrap();
    let export = trained_export(dir.path(), 40, &[]);
    let generated = run(
        dir.path(),
        "generate",
        &[
            "--export",
            export.to_str().unwrap(),
            "--prompt",
            "And God said",
            "--max-tokens",
            "40",
        ],
    );
    assert!(generated.status.success(), "{}", stderr(&generated));
    let expected = String::from_utf8_lossy(&generated.stdout)
        .trim_end_matches('\n')
        .to_string();

    let server = Server::start(dir.path(), &export, &[]);
    let page = PageDriver::open(&server.url("/"), (1280, 900));
    let long = Duration::from_secs(120);
    page.wait_for(
        "the model's name",
        "document.querySelector('#model-name').textContent === 'latest.bf16'",
        long,
    );
    assert_eq!(
        page.js("document.querySelector('#identity').dataset.verified"),
        "false"
    );
    assert_eq!(page.js("document.querySelector('#dial').hidden"), true);
    assert_eq!(
        page.js("document.querySelector('#instruments').hidden"),
        true
    );
    let note = page.js("document.querySelector('#mode-note').textContent");
    assert!(note.as_str().unwrap().contains("chat template"), "{note}");

    page.retype("#max-tokens", "40");
    page.type_into("#prompt", "And God said");
    page.press("Enter");
    let reply = page.wait_for(
        "the streamed continuation",
        "(() => {
            const a = document.querySelector('#messages article[data-role=assistant]');
            return a && a.dataset.state === 'done' ? a.querySelector('.content').textContent : null;
        })()",
        long,
    );
    assert_eq!(reply, expected);
    page.screenshot("dormouse-serve");
    assert!(
        page.errors().is_empty(),
        "the page raised errors: {:#?}",
        page.errors()
    );
}
