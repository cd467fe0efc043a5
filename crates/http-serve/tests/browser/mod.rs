//! Headless Chromium driving a server's page as a person would: typing, pressing keys,
//! clicking, waiting for what the page shows. Shared by the page tests of both programs
//! (included with `#[path]`); it needs a Chromium on the machine (Debian's `chromium`
//! package, or the binary named by `CHROME`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headless_chrome::protocol::cdp::types::Event;
use headless_chrome::protocol::cdp::{Emulation, Page};
use headless_chrome::{Browser, LaunchOptions, Tab};
use serde_json::Value;

/// A page open in its own headless browser, with every error the page raised.
pub struct PageDriver {
    _browser: Browser,
    pub tab: Arc<Tab>,
    errors: Arc<Mutex<Vec<String>>>,
}

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROME") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
            let path = dir.join(name);
            if path.is_file() {
                return path;
            }
        }
    }
    panic!(
        "the page tests drive a real browser and found none: run the tests with tools/test.sh, which installs Chromium, or install it (apt-get install chromium), or name one in CHROME"
    );
}

impl PageDriver {
    /// Opens `url` in a fresh headless Chromium `width` x `height` CSS pixels.
    pub fn open(url: &str, (width, height): (u32, u32)) -> PageDriver {
        let options = LaunchOptions::default_builder()
            .path(Some(chromium()))
            .headless(true)
            // Root in a container has no user namespace to sandbox in.
            .sandbox(false)
            .window_size(Some((width, height)))
            .idle_browser_timeout(Duration::from_secs(600))
            .build()
            .unwrap();
        let browser = Browser::new(options).expect("start headless Chromium");
        let tab = browser.new_tab().unwrap();
        tab.set_default_timeout(Duration::from_secs(120));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let heard = errors.clone();
        tab.add_event_listener(Arc::new(move |event: &Event| {
            let error = match event {
                Event::RuntimeExceptionThrown(e) => Some(format!("{:?}", e.params.exception_details)),
                Event::RuntimeConsoleAPICalled(e)
                    if matches!(
                        e.params.Type,
                        headless_chrome::protocol::cdp::Runtime::ConsoleAPICalledEventTypeOption::Error
                            | headless_chrome::protocol::cdp::Runtime::ConsoleAPICalledEventTypeOption::Warning
                    ) =>
                {
                    Some(format!("console: {:?}", e.params.args))
                }
                Event::LogEntryAdded(e)
                    if matches!(
                        e.params.entry.level,
                        headless_chrome::protocol::cdp::Log::LogEntryLevel::Error
                    ) =>
                {
                    Some(format!("log: {} ({:?})", e.params.entry.text, e.params.entry.url))
                }
                _ => None,
            };
            if let Some(error) = error {
                heard.lock().unwrap().push(error);
            }
        }))
        .unwrap();
        tab.enable_runtime().unwrap();
        tab.enable_log().unwrap();
        tab.navigate_to(url)
            .unwrap()
            .wait_until_navigated()
            .unwrap();
        PageDriver {
            _browser: browser,
            tab,
            errors,
        }
    }

    /// What the JavaScript `expression` gives, carried as JSON.
    pub fn js(&self, expression: &str) -> Value {
        let wrapped = format!("JSON.stringify(({expression}) ?? null)");
        let result = self.tab.evaluate(&wrapped, false).unwrap();
        match result.value {
            Some(Value::String(json)) => serde_json::from_str(&json).unwrap(),
            other => panic!("{expression} gave {other:?}"),
        }
    }

    /// Waits (up to `limit`) until `expression` is truthy, and gives its value.
    pub fn wait_for(&self, what: &str, expression: &str, limit: Duration) -> Value {
        let started = Instant::now();
        loop {
            let value = self.js(expression);
            let truthy =
                !matches!(&value, Value::Null | Value::Bool(false)) && value != 0 && value != "";
            if truthy {
                return value;
            }
            assert!(
                started.elapsed() < limit,
                "waited {limit:?} for {what} ({expression}); the page's errors: {:?}",
                self.errors()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `text` into the element `selector` with key events, as a keyboard would.
    pub fn type_into(&self, selector: &str, text: &str) {
        self.tab.find_element(selector).unwrap().click().unwrap();
        self.tab.type_str(text).unwrap();
    }

    /// Replaces the value of the input `selector` by typing: select all, then the new text.
    pub fn retype(&self, selector: &str, text: &str) {
        self.js(&format!("document.querySelector('{selector}').select()"));
        self.tab.find_element(selector).unwrap().focus().unwrap();
        self.tab.press_key("Backspace").unwrap();
        self.tab.type_str(text).unwrap();
    }

    pub fn click(&self, selector: &str) {
        self.tab.find_element(selector).unwrap().click().unwrap();
    }

    pub fn press(&self, key: &str) {
        self.tab.press_key(key).unwrap();
    }

    /// Lays the page out `width` CSS pixels wide, as a phone's screen is.
    pub fn set_width(&self, width: u32, height: u32) {
        self.tab
            .call_method(Emulation::SetDeviceMetricsOverride {
                width,
                height,
                device_scale_factor: 1.0,
                mobile: true,
                scale: None,
                screen_width: None,
                screen_height: None,
                position_x: None,
                position_y: None,
                dont_set_visible_size: None,
                screen_orientation: None,
                viewport: None,
                display_feature: None,
                device_posture: None,
            })
            .unwrap();
    }

    /// A PNG of the page as it is, written to `target/page-screenshots/NAME.png` (kept after
    /// the test as its artifact); returns the path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let png = self
            .tab
            .capture_screenshot(Page::CaptureScreenshotFormatOption::Png, None, None, true)
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("..")
            .join("page-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// Every exception, console error or warning and error log entry the page raised so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}
