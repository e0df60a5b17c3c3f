//! A newcomer's first hour, on the demo model (SmolLM2-135M-Instruct GGUF, CPU):
//!
//! - `scripts/serve.sh` on a machine without a GPU installs nothing (no
//!   `.cuda/`, no `.pydeps/`, no nvcc run, no kernel build) and serves; the
//!   README's curl example answers in under 10 s; the log has the startup
//!   summary, one line per request and the periodic load line, with the
//!   numbers the responses and the model imply; `GET /` is the chat page;
//!   the shutdown message says a second Ctrl-C aborts;
//! - `render-template` reads the GGUF's template and renders what the server
//!   renders;
//! - `--model smollm2` stands for the pulled file in serve (above), generate
//!   and shell; `generate` applies the chat template and names Paris;
//!   `pull --list` lists it;
//! - `shell` in a pseudo-terminal: history recall with the Up arrow, Ctrl-C
//!   stops a reply without leaving, Ctrl-D leaves (tests/pty/shell_session.py).
//!
//! Needs `MINISGL_SMOLLM2_GGUF` (scripts/test.sh pulls the file and sets it);
//! without it the tests print a notice and pass, except in CI (`CI` set),
//! where they fail.

mod server_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use server_support::*;

/// The tests share two cores: one model at a time keeps the timings honest.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The demo model's file, or `None` (with a notice) outside CI.
fn smollm2() -> Option<PathBuf> {
    match std::env::var("MINISGL_SMOLLM2_GGUF") {
        Ok(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("MINISGL_SMOLLM2_GGUF must name the demo model's file in CI (scripts/test.sh sets it)")
        }
        _ => {
            eprintln!("MINISGL_SMOLLM2_GGUF is not set (scripts/test.sh sets it): skipping");
            None
        }
    }
}

/// A cache folder where `smollm2` is pulled: `models/` holds a link to the file.
fn cache_with_smollm2(gguf: &Path) -> tempfile::TempDir {
    let cache = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cache.path().join("models")).unwrap();
    std::os::unix::fs::symlink(gguf, cache.path().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    cache
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minisgl"))
}

/// The JSON body of the README's curl example.
fn readme_curl_body() -> Json {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let start =
        readme.find("curl http://127.0.0.1:30000/v1/chat/completions").expect("the README has the curl example");
    let rest = &readme[start..];
    let body = rest.split("-d '").nth(1).and_then(|b| b.split('\'').next()).expect("the curl example has -d '...'");
    serde_json::from_str(body).expect("the README's curl body is JSON")
}

/// Lines of a child's stderr, collected as they come.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    log
}

/// The first line of `log` containing every needle.
fn line_with<'a>(log: &'a str, needles: &[&str]) -> Option<&'a str> {
    log.lines().find(|l| needles.iter().all(|n| l.contains(n)))
}

/// The number right after `key` in `line` (`"prompt 37 tokens"`, key `"prompt "`).
fn number_after(line: &str, key: &str) -> f64 {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("no `{key}` in: {line}")) + key.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after `{key}` in: {line}"))
}

/// The number right before `key` in `line` (`"9.8 tok/s"`, key `" tok/s"`).
fn number_before(line: &str, key: &str) -> f64 {
    let head = &line[..line.find(key).unwrap_or_else(|| panic!("no `{key}` in: {line}"))];
    let start = head.rfind(|c: char| !(c.is_ascii_digit() || c == '.')).map_or(0, |i| i + 1);
    head[start..].parse().unwrap_or_else(|_| panic!("no number before `{key}` in: {line}"))
}

#[test]
fn the_quick_start_without_a_gpu_installs_nothing_serves_and_logs_what_it_does() {
    let Some(gguf) = smollm2() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A scratch checkout holding only the scripts: whatever the quick start
    // installs or builds would land in it.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("scripts")).unwrap();
    for script in ["serve.sh", "setup.sh"] {
        std::fs::copy(repo_root().join("scripts").join(script), root.path().join("scripts").join(script)).unwrap();
    }
    // nvcc, cargo, pip and python3 (the CUDA and Python installs go through
    // `python3 -m pip`) on the PATH that leave a mark if anything runs them,
    // so a regression fails here at once instead of downloading a toolkit.
    let fake = root.path().join("fake-bin");
    std::fs::create_dir_all(&fake).unwrap();
    for tool in ["nvcc", "cargo", "pip", "pip3", "python3"] {
        let path = fake.join(tool);
        std::fs::write(&path, format!("#!/bin/sh\necho {tool} >> '{}'\nexit 1\n", root.path().join("ran").display()))
            .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let cache = cache_with_smollm2(&gguf);
    let port = free_port();
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg(root.path().join("scripts/serve.sh"))
        .arg("smollm2")
        .args(["--port", &port.to_string(), "--stats-interval", "1", "--num-pages", "512"])
        .env("MINISGL_BIN", env!("CARGO_BIN_EXE_minisgl"))
        .env("MINISGL_NO_GPU", "1")
        .env("MINISGL_CACHE_DIR", cache.path())
        .env("PATH", path)
        .env_remove("CUDA_HOME")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect_stderr(&mut child);
    let text = || log.lock().unwrap().clone();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Ends early when the script exits (a failed step), not at the timeout.
    let mut exited = false;
    let ready = wait_until(Duration::from_secs(120), || {
        exited = !matches!(child.try_wait(), Ok(None));
        exited || request(addr, "GET", "/health", None).is_ok_and(|r| r.status == 200)
    });
    assert!(ready && !exited, "the quick start did not serve:\n{}", text());

    // Nothing installed, nothing built.
    for made in [".cuda", ".pydeps", "target", "ran"] {
        assert!(!root.path().join(made).exists(), "the quick start made {made}:\n{}", text());
    }
    assert!(text().contains("no GPU"), "the quick start does not say it serves on the CPU:\n{}", text());

    // The README's curl example, within 10 s.
    let body = readme_curl_body();
    assert!(body["max_tokens"].as_u64().is_some_and(|n| n <= 256), "the README's example must bound max_tokens");
    let started = Instant::now();
    let r = post_json(addr, "/v1/chat/completions", &body);
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(took < Duration::from_secs(10), "the README's example took {took:?}");
    let answer = r.json();
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    assert!(content.contains("Paris"), "the README's example does not name Paris: {answer}");

    // A request long enough for the periodic line to see it running.
    let long = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(long.status, 200, "{}", long.text());
    let long = long.json();
    assert_eq!(long["usage"]["completion_tokens"], 40);

    // The chat page, and render-template against the server's rendering.
    let page = get(addr, "/");
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").is_some_and(|c| c.starts_with("text/html")));
    assert!(page.text().contains("/v1/chat/completions"));
    check_render_template_matches_the_server(&gguf, addr);

    // The log: summary, request lines, load line.
    let log_text = text();
    // 30 layers x 3 KV heads x 64 dims x (K and V) x 4 bytes (f32) x 16 tokens
    // = 737,280 bytes a page; --num-pages 512 sets the pool.
    let serving = format!("serving on http://127.0.0.1:{port}");
    for needles in [
        &["model:", "SmolLM2-135M-Instruct.Q4_1.gguf", "LlamaForCausalLM"][..],
        &["device: cpu", "dtype: f32", "kernels: none"][..],
        &["KV cache: 512 pages x 16 tokens = 8192 tokens", "context length 8192 tokens"][..],
        &[serving.as_str()][..],
    ] {
        assert!(line_with(&log_text, needles).is_some(), "no startup line with {needles:?}:\n{log_text}");
    }
    for (response, reason) in [(&answer, answer["choices"][0]["finish_reason"].as_str().unwrap()), (&long, "length")] {
        let id = response["id"].as_str().unwrap();
        let line = line_with(&log_text, &[&format!("request {id} finished")])
            .unwrap_or_else(|| panic!("no log line for {id}:\n{log_text}"));
        assert_eq!(number_after(line, "prompt "), response["usage"]["prompt_tokens"].as_f64().unwrap(), "{line}");
        assert_eq!(number_after(line, "output "), response["usage"]["completion_tokens"].as_f64().unwrap(), "{line}");
        assert!(line.contains(&format!("finish_reason {reason}")), "{line}");
        let ttft = number_after(line, "ttft ");
        let total = number_after(line, "tok/s, ");
        assert!(ttft > 0.0 && ttft <= total, "{line}");
        let rate = number_before(line, " tok/s");
        let expected = response["usage"]["completion_tokens"].as_f64().unwrap() / total;
        assert!((rate - expected).abs() <= 0.1 * expected + 0.1, "tok/s {rate} vs {expected}: {line}");
    }
    let load = line_with(&log_text, &["load: 1 running, 0 waiting, KV ", "/512 pages"])
        .unwrap_or_else(|| panic!("no periodic load line with the long request running:\n{log_text}"));
    assert!(number_after(load, "generation ") > 0.0, "{load}");

    // Ctrl-C: the message says a second one aborts at once.
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let stopped = wait_until(Duration::from_secs(30), || matches!(child.try_wait(), Ok(Some(_))));
    assert!(stopped, "the server did not stop on SIGINT:\n{}", text());
    std::thread::sleep(Duration::from_millis(200));
    assert!(text().contains("press Ctrl-C again to abort them at once"), "{}", text());
    assert!(!text().contains("panicked"), "{}", text());
}

/// `render-template --template model.gguf` prints what the server renders
/// for the same messages (`/tokenize` returns the rendered prompt).
fn check_render_template_matches_the_server(gguf: &Path, addr: std::net::SocketAddr) {
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("messages.json");
    std::fs::write(&file, messages.to_string()).unwrap();
    let out = bin()
        .args(["render-template", "--add-generation-prompt", "--template"])
        .arg(gguf)
        .arg("--messages")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "render-template failed: {}", String::from_utf8_lossy(&out.stderr));
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert!(rendered.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>"), "{rendered}");
    let server = post_json(addr, "/tokenize", &json!({"messages": messages, "add_generation_prompt": true}));
    assert_eq!(server.status, 200, "{}", server.text());
    assert_eq!(server.json()["prompt"].as_str().unwrap(), rendered);
}

#[test]
fn generate_with_the_model_name_answers_with_the_chat_template_and_pull_lists_it() {
    let Some(gguf) = smollm2() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache_with_smollm2(&gguf);
    let out = bin()
        .args([
            "generate",
            "--model",
            "smollm2",
            "--device",
            "cpu",
            "--chat",
            "--num-pages",
            "64",
            "--max-tokens",
            "24",
        ])
        .args(["--prompt", "What is the capital of France?", "--prompt", "Name a colour."])
        .env("MINISGL_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first = stdout.lines().find(|l| l.starts_with("output 1: ")).unwrap_or_else(|| panic!("no output 1: {stdout}"));
    assert!(first.contains("Paris"), "the answer does not name Paris: {stdout}");
    assert!(stdout.contains("prompt 1: What is the capital of France?"), "{stdout}");
    assert!(stdout.contains("prompt 2: Name a colour.") && stdout.contains("output 2: "), "{stdout}");
    assert!(!stdout.contains("<|im_end|>") && !stdout.contains("<|im_start|>"), "special tokens printed: {stdout}");

    let list = bin().args(["pull", "--list"]).env("MINISGL_CACHE_DIR", cache.path()).output().unwrap();
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.status.success());
    assert!(
        listed.lines().any(|l| l.starts_with("smollm2") && l.contains("SmolLM2-135M-Instruct.Q4_1.gguf")),
        "{listed}"
    );

    // Not pulled: the error says how to get it, and nothing is downloaded.
    let empty = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["generate", "--model", "smollm2", "--device", "cpu", "--prompt", "hi"])
        .env("MINISGL_CACHE_DIR", empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(err.contains("minisgl pull smollm2") && err.contains("--pull"), "{err}");
    assert!(!empty.path().join("models").exists(), "something was downloaded: {err}");
    let listed = bin().args(["pull", "--list"]).env("MINISGL_CACHE_DIR", empty.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("not pulled"));
}

#[test]
fn the_shell_in_a_terminal_recalls_history_and_ctrl_c_stops_a_reply() {
    let Some(gguf) = smollm2() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache_with_smollm2(&gguf);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pty/shell_session.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_minisgl"))
        .args(["shell", "--model", "smollm2", "--device", "cpu", "--num-pages", "128", "--max-tokens", "300"])
        .env("MINISGL_CACHE_DIR", cache.path())
        .env("TERM", "xterm")
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && transcript.trim_end().ends_with("OK"),
        "{transcript}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
