//! Structured outputs, tool calls and reasoning content end to end (issue 17):
//! `minisgl serve` on the CPU, driven by the official `openai` Python client
//! (`tests/clients/structured_client.py`, which validates every output with
//! `jsonschema`), on the qwen3-tiny fixture (with a thinking, tool-aware chat
//! template and `--reasoning-parser qwen3`) and on the SmolLM2 demo model.
//!
//! The SmolLM2 case needs `MINISGL_SMOLLM2_GGUF` (scripts/test.sh pulls the
//! file and sets it); without it that case prints a notice and passes.

mod server_support;

use std::path::Path;
use std::time::Duration;

use server_support::*;

fn run_client(server: &ServeProcess, extra: &[&str]) {
    let url = format!("http://{}/v1", server.addr);
    let out = python()
        .arg(repo_root().join("tests/clients/structured_client.py"))
        .arg(&url)
        .args(extra)
        .output()
        .expect("run the structured-output client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed:\n{stdout}\n{stderr}\nserver log:\n{}", server.stderr_text());
    eprintln!("{stdout}");
}

#[test]
fn fixture_structured_outputs_tools_and_reasoning_through_the_openai_client() {
    require_openai_package();
    let template = repo_root().join("engine/tests/data/thinking_tools.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    let mut server = ServeProcess::start(
        &fixture("qwen3-tiny"),
        &["--chat-template", template, "--reasoning-parser", "qwen3"],
        Duration::from_secs(60),
    );
    run_client(&server, &["--thinking-template"]);
    server.terminate(Duration::from_secs(30));
    server.assert_no_panic();
}

#[test]
fn smollm2_structured_outputs_through_the_openai_client() {
    let Ok(gguf) = std::env::var("MINISGL_SMOLLM2_GGUF") else {
        eprintln!("MINISGL_SMOLLM2_GGUF is not set (scripts/test.sh sets it): skipping");
        return;
    };
    require_openai_package();
    let mut server = ServeProcess::start(Path::new(&gguf), &["--num-pages", "256"], Duration::from_secs(120));
    // A real model writes longer strings than the fixture: room for them,
    // and more requests at once (they batch).
    run_client(&server, &["--max-tokens", "100", "--workers", "12"]);
    server.terminate(Duration::from_secs(30));
    server.assert_no_panic();
}
