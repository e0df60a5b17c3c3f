//! Tensor parallelism through real worker processes and the rendezvous (CPU):
//! every fixture at `--tp 2` and `--tp 4` generates the greedy ids of `--tp 1`
//! (the transformers reference), and its logits through the worker processes
//! are within 1e-4 relative L2 of the unsplit CPU f32 model's; a rank killed
//! mid-run stops the server with an error naming it; a wrong `--dist-init-addr`,
//! a rank that never joins and mismatched arguments fail within the timeout
//! with a message saying so.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::frontend::cli::common::{EngineArgs, ModelArgs};
use engine::frontend::cli::tp::{start_leader, TpArgs};
use kernel_runtime::{DType, Device};
use models::{
    AttnBackendKind, AttnBackendSpec, ForwardBatch, LoadFormat, LoadOptions, MoeBackendKind, SeqStep, StepLayout,
};

const ALL: [&str; 5] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "qwen3-moe-tiny"];

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minisgl"));
    c.env("MINISGL_CACHE_DIR", std::env::temp_dir().join("minisgl-cli-test-cache"));
    c
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// Case 0's prompt text and reference greedy ids.
fn reference(name: &str) -> (String, Vec<u32>) {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let greedy = st
        .tensor("case0.greedy_ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap();
    (meta["cases"][0]["text"].as_str().unwrap().to_owned(), greedy)
}

fn generate_ids(name: &str, tp: usize, max_tokens: usize, text: &str) -> Vec<u32> {
    let out = bin()
        .args(["generate", "--device", "cpu", "--json", "--raw", "--ignore-eos", "--dist-timeout", "60"])
        .args(["--tp", &tp.to_string(), "--max-tokens", &max_tokens.to_string()])
        .arg("--model")
        .arg(fixture(name))
        .arg("--prompt")
        .arg(text)
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} --tp {tp}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["output_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn generate_at_tp2_and_tp4_gives_the_reference_greedy_ids() {
    for name in ALL {
        let (text, greedy) = reference(name);
        for tp in [1, 2, 4] {
            assert_eq!(generate_ids(name, tp, greedy.len(), &text), greedy, "{name} --tp {tp}");
        }
    }
}

fn model_args(name: &str) -> ModelArgs {
    ModelArgs {
        model: fixture(name),
        device: "cpu".into(),
        dtype: "auto".into(),
        load_format: "auto".into(),
        attn: "paged".into(),
        moe: "fused".into(),
        chat_template: None,
    }
}

fn engine_args(num_pages: usize) -> EngineArgs {
    EngineArgs {
        page_size: 4,
        num_pages: Some(num_pages),
        mem_fraction: 0.85,
        max_prefill_length: 8192,
        max_running_requests: 8,
        cache: "radix".into(),
        max_model_len: None,
        cuda_graph_max_bs: 8,
        disable_cuda_graph: false,
        disable_overlap: false,
        decode_reserve: 1.0,
    }
}

fn tp_args(tp: usize) -> TpArgs {
    TpArgs { tp, dist_timeout: 60, ..TpArgs::single() }
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (f64::from(*g) - f64::from(*w)).powi(2)).sum();
    let den: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn logits_through_worker_processes_match_the_unsplit_model() {
    // Rank 0 runs here; the workers are the minisgl binary.
    std::env::set_var("MINISGL_TP_WORKER_EXE", env!("CARGO_BIN_EXE_minisgl"));
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: Some(DType::F32),
        load_format: LoadFormat::Auto,
        attn: AttnBackendSpec::single(AttnBackendKind::Paged),
        moe: MoeBackendKind::Fused,
        max_context: None,
    };
    for name in ALL {
        let (_, greedy) = reference(name);
        let prompt: Vec<u32> = (3..40).collect();
        let table: Vec<u32> = (0..(prompt.len() + greedy.len()).div_ceil(4) as u32).collect();
        let steps: Vec<StepLayout> = std::iter::once(SeqStep { new_tokens: &prompt, cached_len: 0, pages: &table })
            .chain(greedy.iter().enumerate().map(|(i, t)| SeqStep {
                new_tokens: std::slice::from_ref(t),
                cached_len: prompt.len() + i,
                pages: &table,
            }))
            .map(|s| StepLayout::from_seqs(&[s], 4).unwrap())
            .collect();
        let unsplit = models::load_model(&fixture(name), &options).unwrap();
        let kv = unsplit.new_kv_cache(table.len(), 4).unwrap();
        let want: Vec<Vec<f32>> = steps
            .iter()
            .map(|l| {
                let batch = ForwardBatch::from_layout(l, Device::Cpu).unwrap();
                unsplit.forward(&batch, &kv).unwrap().to_f32_vec().unwrap()
            })
            .collect();
        for tp in [2, 4] {
            let (mut runner, _) = start_leader(&model_args(name), &engine_args(table.len()), &tp_args(tp)).unwrap();
            for (i, (layout, want)) in steps.iter().zip(&want).enumerate() {
                let got = runner.forward_layout(layout).unwrap();
                let err = rel_l2(&got, want);
                assert!(err <= 1e-4, "{name} --tp {tp} step {i}: rel L2 {err:e}");
            }
        }
    }
}

/// Waits for `child` to exit within `limit`; its stderr.
fn wait_with_stderr(mut child: std::process::Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status, err);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_rank_stops_the_server_naming_it() {
    let mut server = bin()
        .args(["serve", "--device", "cpu", "--port", "0", "--tp", "2", "--dist-timeout", "30"])
        .arg("--model")
        .arg(fixture("llama-tiny"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log names each worker's pid; wait until the server is up.
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let (mut pid, mut log) = (None, String::new());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        log.push_str(&line);
        if let Some(rest) = line.split("started tp rank 1 (pid ").nth(1) {
            pid = rest.split(')').next().and_then(|p| p.parse::<u32>().ok());
        }
        if line.contains("served as") {
            break;
        }
    }
    let pid = pid.unwrap_or_else(|| panic!("no worker pid in the log:\n{log}"));
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the server kept running after rank 1 died");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    log.push_str(&rest);
    assert!(!status.success());
    assert!(log.contains("tp rank 1") && log.contains("stopping"), "{log}");
}

#[test]
fn a_wrong_dist_init_addr_fails_in_time_naming_it() {
    // Nothing listens on port 9 (discard) of the loopback: the worker gives up.
    let started = Instant::now();
    let child = bin()
        .args(["tp-worker", "--rank", "1", "--tp", "2", "--device", "cpu", "--dist-timeout", "2"])
        .args(["--dist-init-addr", "127.0.0.1:9", "--model"])
        .arg(fixture("llama-tiny"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_with_stderr(child, Duration::from_secs(30));
    assert!(!status.success());
    assert!(err.contains("tp rank 1") && err.contains("127.0.0.1:9"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_rank_that_never_joins_fails_in_time_naming_it() {
    // Two nodes, but the second is never started: rank 0 gives up after the timeout.
    let started = Instant::now();
    let child = bin()
        .args(["generate", "--device", "cpu", "--prompt", "hi", "--tp", "2", "--nnodes", "2", "--dist-timeout", "2"])
        .args(["--dist-init-addr", "127.0.0.1:0", "--model"])
        .arg(fixture("llama-tiny"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_with_stderr(child, Duration::from_secs(30));
    assert!(!status.success());
    assert!(err.contains("tp rank(s) 1 did not join the rendezvous at 127.0.0.1:"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn mismatched_arguments_are_refused_at_the_rendezvous() {
    // Rank 0 for one model (its second node never comes), a worker for another.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let addr = format!("127.0.0.1:{port}");
    let leader = bin()
        .args(["generate", "--device", "cpu", "--prompt", "hi", "--tp", "2", "--nnodes", "2", "--dist-timeout", "20"])
        .args(["--dist-init-addr", &addr, "--model"])
        .arg(fixture("llama-tiny"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worker = bin()
        .args(["tp-worker", "--rank", "1", "--tp", "2", "--nnodes", "2", "--node-rank", "1", "--device", "cpu"])
        .args(["--dist-timeout", "20", "--dist-init-addr", &addr, "--model"])
        .arg(fixture("qwen2-tiny"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_with_stderr(leader, Duration::from_secs(40));
    assert!(!status.success());
    assert!(err.contains("refused") && err.contains("the model (config.json) differs"), "{err}");
    let (status, err) = wait_with_stderr(worker, Duration::from_secs(40));
    assert!(!status.success());
    assert!(err.contains("tp rank 1: refused at the rendezvous"), "{err}");
}
