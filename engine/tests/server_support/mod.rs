//! Shared pieces of the server tests: a deterministic fake model, a
//! `minisgl serve` child process on a free port, and a minimal blocking
//! HTTP/1.1 client (with an incremental SSE reader) over `std::net`, so that
//! tests control exactly when a client goes away.
//!
//! Every wait here is bounded in time: reads have timeouts and polling loops
//! have deadlines.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::core::engine::{ModelRunner, RunnerError};
use engine::core::req::PreparedBatch;
use engine::core::sampling::Logits;
use serde_json::Value as Json;

/// How long any single read may block before the test fails.
pub const IO_TIMEOUT: Duration = Duration::from_secs(120);

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

// ---------------------------------------------------------------------------
// A fake model.

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stateless "model": the logits of a row are a hash of its last token and
/// position, so greedy outputs are deterministic and easy to recompute, yet
/// depend on the prompt (through its last token and length). Tokens in
/// `banned` get very low logits (e.g. to avoid EOS in long outputs).
#[derive(Clone, Debug)]
pub struct HashLm {
    pub vocab_size: usize,
    pub max_context_len: usize,
    pub banned: Vec<u32>,
    /// Sleep per forward pass, to keep requests in flight long enough.
    pub step_delay: Duration,
    /// A forward pass fed this token fails (an `Err`, like a CUDA error).
    pub fail_on: Option<u32>,
    /// A forward pass fed this token panics (a bug in the engine).
    pub panic_on: Option<u32>,
}

impl HashLm {
    pub fn logits(&self, last: u32, pos: u32) -> Vec<f32> {
        let key = mix((u64::from(last) << 32) | u64::from(pos));
        (0..self.vocab_size as u64)
            .map(|v| {
                if self.banned.contains(&(v as u32)) {
                    -1e9
                } else {
                    (mix(key ^ v.wrapping_mul(0xA24B_AED4_963E_E407)) >> 40) as f32 / (1u64 << 24) as f32
                }
            })
            .collect()
    }
}

impl ModelRunner for HashLm {
    fn forward(&mut self, b: &PreparedBatch) -> Result<Logits, RunnerError> {
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        if let Some(t) = self.fail_on.filter(|t| b.input_ids().contains(t)) {
            return Err(format!("injected failure on token {t}").into());
        }
        if let Some(t) = self.panic_on.filter(|t| b.input_ids().contains(t)) {
            panic!("injected panic on token {t}");
        }
        let mut data = Vec::with_capacity(b.logits_rows().len() * self.vocab_size);
        for &r in b.logits_rows() {
            let end = b.q_indptr()[r as usize + 1] as usize - 1;
            data.extend(self.logits(b.input_ids()[end], b.positions()[end]));
        }
        Ok(Logits::new(data, self.vocab_size))
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn max_context_len(&self) -> usize {
        self.max_context_len
    }
}

// ---------------------------------------------------------------------------
// A `minisgl serve` child process.

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port on 127.0.0.1")
}

/// A server process whose stderr is collected (to check it never panicked).
pub struct ServeProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

impl ServeProcess {
    /// Starts `minisgl serve --model DIR --device cpu ARGS...` on a free
    /// port and waits (at most `ready_within`) for `/health` to answer 200.
    pub fn start(model: &Path, extra: &[&str], ready_within: Duration) -> Self {
        let port = free_port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_minisgl"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--device", "cpu", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn minisgl serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut server = Self { child, addr, stderr, stderr_thread: Some(stderr_thread) };
        let deadline = Instant::now() + ready_within;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("minisgl serve exited early ({status}):\n{}", server.stderr_text());
            }
            if let Ok(r) = request(addr, "GET", "/health", None) {
                if r.status == 200 {
                    return server;
                }
            }
            if Instant::now() > deadline {
                let _ = server.child.kill();
                panic!("minisgl serve not ready within {ready_within:?}:\n{}", server.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Sends SIGTERM (through `kill`, no unsafe) and waits for the exit.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        self.wait(within)
    }

    pub fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                if let Some(t) = self.stderr_thread.take() {
                    let _ = t.join();
                }
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("minisgl serve did not exit within {within:?}:\n{}", self.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asserts the server's stderr shows no panic.
    pub fn assert_no_panic(&self) {
        let text = self.stderr_text();
        assert!(!text.contains("panicked"), "the server panicked:\n{text}");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// A minimal HTTP/1.1 client.

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.text()))
    }
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(stream)
}

fn write_request(
    stream: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<()> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if let Some(body) = body {
        stream.write_all(body)?;
    }
    stream.flush()
}

fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    Ok((status, headers))
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"))
}

/// Reads one chunk of a chunked body; `None` at the last (empty) chunk.
fn read_chunk(reader: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let size_text = line.trim().split(';').next().unwrap_or("");
    let size = usize::from_str_radix(size_text, 16)
        .map_err(|_| std::io::Error::other(format!("bad chunk size line {line:?}")))?;
    if size == 0 {
        return Ok(None);
    }
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk)?;
    let mut crlf = [0; 2];
    reader.read_exact(&mut crlf)?;
    Ok(Some(chunk))
}

/// One request on a fresh connection; reads the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<HttpResponse> {
    request_with_headers(addr, method, path, &[], body)
}

/// [`request`] with extra headers.
pub fn request_with_headers(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<HttpResponse> {
    let mut stream = connect(addr)?;
    write_request(&mut stream, addr, method, path, headers, body)?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader)?;
    let mut body = Vec::new();
    if is_chunked(&headers) {
        while let Some(chunk) = read_chunk(&mut reader)? {
            body.extend(chunk);
        }
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.resize(len, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(HttpResponse { status, headers, body })
}

pub fn post_json(addr: SocketAddr, path: &str, body: &Json) -> HttpResponse {
    request(addr, "POST", path, Some(body.to_string().as_bytes())).unwrap_or_else(|e| panic!("POST {path} failed: {e}"))
}

pub fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    request(addr, "GET", path, None).unwrap_or_else(|e| panic!("GET {path} failed: {e}"))
}

/// A streaming response, read event by event.
pub struct SseStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    buf: String,
    ended: bool,
}

impl SseStream {
    pub fn open(addr: SocketAddr, path: &str, body: &Json) -> std::io::Result<Self> {
        let mut stream = connect(addr)?;
        write_request(&mut stream, addr, "POST", path, &[], Some(body.to_string().as_bytes()))?;
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader)?;
        Ok(Self { status, headers, reader, buf: String::new(), ended: false })
    }

    /// The next `data:` payload; `None` at the end of the body.
    pub fn next_data(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..pos + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // A comment or keep-alive.
                }
                return Ok(Some(data.join("\n")));
            }
            if self.ended {
                return Ok(None);
            }
            match read_chunk(&mut self.reader)? {
                Some(chunk) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                None => self.ended = true,
            }
        }
    }

    /// Reads to the end: every payload, `[DONE]` included.
    pub fn collect(mut self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        while let Some(d) = self.next_data()? {
            out.push(d);
        }
        Ok(out)
    }

    /// Closes the connection now, as a client that goes away.
    pub fn disconnect(self) {
        let _ = self.reader.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// The concatenated text of a stream's chunks (chat `delta.content` or
/// completion `text`), its finish reason and its usage chunk, if any.
pub struct StreamSummary {
    pub text: String,
    pub finish_reason: Option<String>,
    pub usage: Option<Json>,
    pub done: bool,
    pub errors: Vec<Json>,
}

pub fn summarize(payloads: &[String]) -> StreamSummary {
    let mut s =
        StreamSummary { text: String::new(), finish_reason: None, usage: None, done: false, errors: Vec::new() };
    for p in payloads {
        if p == "[DONE]" {
            s.done = true;
            continue;
        }
        let v: Json = serde_json::from_str(p).unwrap_or_else(|e| panic!("bad chunk {p}: {e}"));
        if v.get("error").is_some() {
            s.errors.push(v);
            continue;
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            s.usage = Some(u.clone());
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["delta"]["content"].as_str() {
                s.text.push_str(t);
            }
            if let Some(t) = c["text"].as_str() {
                s.text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                s.finish_reason = Some(r.to_owned());
            }
        }
    }
    s
}

/// Reads one sample of a Prometheus exposition.
pub fn metric(exposition: &str, name: &str) -> f64 {
    engine::frontend::server::metrics::parse_sample(exposition, name)
        .unwrap_or_else(|| panic!("metric {name} missing from:\n{exposition}"))
}

/// Polls `f` until it is true or `within` passes.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// The Python clients.

/// `python3` with the packages scripts/env.sh installs (`.pydeps`) on its path.
pub fn python() -> Command {
    let mut cmd = Command::new("python3");
    // What scripts/env.sh puts on the path.
    let pydeps = repo_root().join(".pydeps");
    let path = match std::env::var_os("PYTHONPATH") {
        Some(p) if !p.is_empty() => {
            let mut all = pydeps.into_os_string();
            all.push(":");
            all.push(p);
            all
        }
        _ => pydeps.into_os_string(),
    };
    cmd.env("PYTHONPATH", path);
    cmd
}

/// Fails the test with a clear message when the `openai` package is missing.
pub fn require_openai_package() {
    let out = python().args(["-c", "import openai; print(openai.__version__)"]).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "the `openai` Python package is not importable ({}); run `source scripts/env.sh` \
             (it installs the Python test clients into .pydeps) and run the tests again",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => {
            panic!("cannot run python3 ({e}); install Python 3 and run `source scripts/env.sh`")
        }
    }
}
