//! The chat page (`GET /`) in a real browser: headless Chromium, driven over
//! WebDriver by `tests/browser/chat_page.py`, loads the page, sends a message
//! and sees the reply stream in, with tokens per second shown.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/ci/browser.sh
//! installs them) and the demo model (`MINISGL_SMOLLM2_GGUF`, set by
//! scripts/test.sh). Outside CI a missing one skips the test with a notice; in
//! CI (`CI` set) it fails.

mod server_support;

use std::path::Path;
use std::time::Duration;

use server_support::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

#[test]
fn the_chat_page_streams_a_reply_in_headless_chromium() {
    let in_ci = std::env::var_os("CI").is_some();
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER].into_iter().filter(|p| !Path::new(p).exists()).collect();
    let gguf = std::env::var("MINISGL_SMOLLM2_GGUF").ok().filter(|p| Path::new(p).is_file());
    if !missing.is_empty() || gguf.is_none() {
        let why = if missing.is_empty() {
            "MINISGL_SMOLLM2_GGUF is not set (scripts/test.sh sets it)".to_owned()
        } else {
            format!("{} missing (apt-get install chromium chromium-driver; scripts/ci/browser.sh)", missing.join(", "))
        };
        assert!(!in_ci, "the chat page test must run in CI: {why}");
        eprintln!("skipping the chat page test: {why}");
        return;
    }
    let gguf = gguf.unwrap_or_default();
    let mut server = ServeProcess::start(Path::new(&gguf), &["--num-pages", "256"], Duration::from_secs(120));
    let shot = tempfile::tempdir().unwrap();
    let png = shot.path().join("chat_page.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/chat_page.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .args([CHROMIUM, CHROMEDRIVER])
        .arg(&png)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "the chat page test failed: {stdout}\n{}\nserver:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr_text()
    );
    if let Ok(dir) = std::env::var("MINISGL_SCREENSHOT_DIR") {
        let _ = std::fs::copy(&png, Path::new(&dir).join("chat_page.png"));
    }
    server.terminate(Duration::from_secs(30));
    server.assert_no_panic();
}
