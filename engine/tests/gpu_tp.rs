//! The tensor-parallel path on one GPU: `--tp 1` through the worker-process
//! machinery (`--tp-force-workers`: the rendezvous, NCCL with one rank, the
//! sharded loaders, every collective called, the `TpRunner` control channel,
//! CUDA graphs captured over the NCCL calls) generates the same ids as the
//! plain path for the dense bf16 fixtures, and its decode throughput on dummy
//! Qwen3-0.6B is within 3% of the plain path's (issue 16, acceptance 2).
//! Prints `SUMMARY tp ...` lines.
//!
//! Runs only with MINISGL_GPU_TESTS=1 on a machine with a GPU (and NCCL).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the GPU tests run (MINISGL_GPU_TESTS=1, as `gpu_support::gpu_enabled`;
/// that module's model helpers are not needed here).
fn gpu_enabled() -> bool {
    if std::env::var("MINISGL_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set MINISGL_GPU_TESTS=1 on a machine with a GPU");
        return false;
    }
    true
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minisgl"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(args: &[&str], model: &Path) -> String {
    let out = bin().args(args).arg("--model").arg(model).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tp1_through_the_workers_generates_the_plain_ids() {
    if !gpu_enabled() {
        return;
    }
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny"] {
        let model = root().join("tests/fixtures").join(name);
        let common = ["generate", "--device", "cuda", "--json", "--raw", "--ignore-eos", "--max-tokens", "24"];
        let prompts = ["--prompt", "def fibonacci(n):", "--prompt", "The capital of France is"];
        let plain = run(&[&common[..], &prompts[..]].concat(), &model);
        let forced = run(&[&common[..], &prompts[..], &["--tp", "1", "--tp-force-workers"][..]].concat(), &model);
        assert_eq!(plain, forced, "{name}: --tp 1 through the workers");
        println!("SUMMARY tp {name}: --tp 1 through the worker path gives the plain ids");
    }
}

fn output_throughput(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("output throughput:"))
        .and_then(|v| v.trim().trim_end_matches("tok/s").trim().parse().ok())
        .unwrap_or_else(|| panic!("no output throughput in:\n{stdout}"))
}

#[test]
fn tp1_through_the_workers_costs_at_most_3_percent_of_decode_throughput() {
    if !gpu_enabled() {
        return;
    }
    let model = root().join("tests/configs/qwen3-0.6b");
    let bench = [
        "bench",
        "--device",
        "cuda",
        "--load-format",
        "dummy",
        "--num-requests",
        "64",
        "--min-len",
        "64",
        "--max-len",
        "512",
    ];
    // Warm the kernel cache, then measure each path.
    run(&bench, &model);
    let plain = output_throughput(&run(&bench, &model));
    let forced = output_throughput(&run(&[&bench[..], &["--tp", "1", "--tp-force-workers"][..]].concat(), &model));
    let ratio = forced / plain;
    println!("SUMMARY tp qwen3-0.6b bench: plain {plain:.0} tok/s, --tp 1 worker path {forced:.0} tok/s ({ratio:.3}x)");
    assert!(ratio >= 0.97, "the worker path costs {:.1}% of decode throughput", (1.0 - ratio) * 100.0);
}
