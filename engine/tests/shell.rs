//! `minisgl shell` driven through piped stdin, against replies computed
//! offline with the engine's library API on the same conversations.
//!
//! The history check is built so that it can fail: a shell that forgot the
//! conversation would answer the second question like the first, and a
//! shell whose `/reset` kept it would answer the third differently from the
//! first (both differences are asserted to exist for the chosen question).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::core::engine::GenerateRequest;
use engine::core::req::SamplingParams;
use engine::frontend::cli::common::{load_model, EngineArgs, LoadedModel, ModelArgs};
use engine::text::chat_template::{ChatTemplate, RenderOptions};
use serde_json::{json, Value as Json};

const MODEL: &str = "qwen3-tiny";
const MAX_TOKENS: usize = 24;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn load(name: &str) -> LoadedModel {
    load_model(
        &ModelArgs {
            model: fixture(name),
            device: "cpu".into(),
            dtype: "auto".into(),
            load_format: "auto".into(),
            attn: "paged".into(),
            moe: "fused".into(),
            chat_template: None,
        },
        &EngineArgs {
            page_size: 16,
            num_pages: Some(256),
            mem_fraction: 0.85,
            max_prefill_length: 8192,
            max_running_requests: 16,
            cache: "radix".into(),
            max_model_len: None,
            cuda_graph_max_bs: 256,
            disable_cuda_graph: false,
            disable_overlap: false,
            decode_reserve: 1.0,
        },
    )
    .unwrap_or_else(|e| panic!("load {name}: {e:#}"))
}

#[test]
fn chat_template_and_max_model_len_options_apply() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("plain.jinja");
    std::fs::write(&template, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:").unwrap();
    let m = load_model(
        &ModelArgs {
            model: fixture(MODEL),
            device: "cpu".into(),
            dtype: "auto".into(),
            load_format: "auto".into(),
            attn: "paged".into(),
            moe: "fused".into(),
            chat_template: Some(template.clone()),
        },
        &EngineArgs {
            page_size: 16,
            num_pages: Some(64),
            mem_fraction: 0.85,
            max_prefill_length: 8192,
            max_running_requests: 16,
            cache: "radix".into(),
            max_model_len: Some(48),
            cuda_graph_max_bs: 256,
            disable_cuda_graph: false,
            disable_overlap: false,
            decode_reserve: 1.0,
        },
    )
    .unwrap();
    assert_eq!(m.chat.chat_template.as_deref(), Some(std::fs::read_to_string(&template).unwrap().as_str()));
    assert_eq!(m.engine.runner().max_context_len(), 48);
}

/// The greedy reply to a conversation, as the shell renders and decodes it.
fn reply(m: &mut LoadedModel, conversation: &[(&str, &str)]) -> String {
    let messages: Vec<Json> =
        conversation.iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    let template = ChatTemplate::new(m.chat.chat_template.as_deref().unwrap()).unwrap();
    let prompt = template.render(&messages, &RenderOptions::new(true, m.chat.special_tokens.clone())).unwrap();
    let prompt_ids = m.tokenizer.encode(&prompt, false).unwrap();
    let out = m
        .engine
        .generate(vec![GenerateRequest { prompt_ids, params: SamplingParams::greedy(MAX_TOKENS) }])
        .unwrap()
        .remove(0);
    m.tokenizer.decode(&out.output_ids, true).unwrap()
}

/// Runs `minisgl shell` with `input` on stdin; returns (status, stdout, stderr).
fn run_shell(input: &str) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minisgl"))
        .arg("shell")
        .arg("--model")
        .arg(fixture(MODEL))
        .args(["--device", "cpu", "--num-pages", "256", "--max-tokens"])
        .arg(MAX_TOKENS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn minisgl shell");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("minisgl shell did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("shell output");
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn piped_shell_keeps_the_conversation_and_reset_clears_it() {
    let q = "Name a prime number.";
    let mut m = load(MODEL);
    let a1 = reply(&mut m, &[("user", q)]);
    let a2 = reply(&mut m, &[("user", q), ("assistant", &a1), ("user", q)]);
    let without_reset = reply(&mut m, &[("user", q), ("assistant", &a1), ("user", q), ("assistant", &a2), ("user", q)]);
    assert!(!a1.is_empty());
    assert_ne!(a2, a1, "the question must have a history-dependent answer");
    assert_ne!(without_reset, a1, "the question must have a history-dependent answer");

    let (status, stdout, stderr) = run_shell(&format!("{q}\n{q}\n/reset\n{q}\n/exit\nnever read\n"));
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(stdout, format!("{a1}\n{a2}\n{a1}\n"), "stderr: {stderr}");
    assert!(stderr.contains("(conversation cleared)"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn piped_shell_ends_at_eof_and_reports_unknown_commands() {
    let q = "hi";
    let mut m = load(MODEL);
    let a1 = reply(&mut m, &[("user", q)]);
    // No /exit: end of input quits; blank lines are skipped.
    let (status, stdout, stderr) = run_shell(&format!("/bogus\n\n{q}\n"));
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(stdout, format!("{a1}\n"));
    assert!(stderr.contains("unknown command /bogus"), "{stderr}");
    // Empty input: nothing to say.
    let (status, stdout, _) = run_shell("");
    assert!(status.success());
    assert_eq!(stdout, "");
}
