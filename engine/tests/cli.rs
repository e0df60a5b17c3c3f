//! The `minisgl` binary end to end on the fixtures (CPU): `generate --json`
//! reproduces the transformers greedy ids, `bench` runs with dummy weights and
//! draws bench.py's workload, and bad input (a GPU asked for where there is
//! none, an unknown model, a broken folder) exits with a message naming the
//! problem.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minisgl"));
    c.env("MINISGL_CACHE_DIR", std::env::temp_dir().join("minisgl-cli-test-cache"));
    c
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// The reference greedy ids of case 0, read from reference.safetensors.
fn reference(name: &str) -> (Vec<u32>, Vec<u32>, String) {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = |n: &str| -> Vec<u32> {
        st.tensor(n).unwrap().data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect()
    };
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap();
    let text = meta["cases"][0]["text"].as_str().unwrap().to_owned();
    (ids("case0.input_ids"), ids("case0.greedy_ids"), text)
}

#[test]
fn generate_json_reproduces_the_reference_greedy_ids() {
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "qwen3-moe-tiny"] {
        let (prompt_ids, greedy_ids, text) = reference(name);
        let out = bin()
            .args(["generate", "--device", "cpu", "--json", "--raw", "--ignore-eos", "--max-tokens"])
            .arg(greedy_ids.len().to_string())
            .arg("--model")
            .arg(fixture(name))
            .arg("--prompt")
            .arg(&text)
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let got =
            |k: &str| -> Vec<u32> { v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        assert_eq!(got("prompt_ids"), prompt_ids, "{name}: prompt ids");
        assert_eq!(got("output_ids"), greedy_ids, "{name}: greedy ids");
        assert!(v["text"].is_string());
    }
}

#[test]
fn bench_runs_with_dummy_weights_and_reports_throughput() {
    let out = bin()
        .args([
            "bench",
            "--device",
            "cpu",
            "--load-format",
            "dummy",
            "--num-requests",
            "6",
            "--min-len",
            "4",
            "--max-len",
            "24",
            "--json",
        ])
        .arg("--model")
        .arg(fixture("qwen2-tiny"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["requests"], 6);
    // CPython: `random.seed(0)`, then bench.py's draws with randint(4, 24) and
    // the tokenizer's base vocabulary of 512 ids.
    assert_eq!(json["vocab_size"], 512);
    assert_eq!(json["input_tokens"], 68);
    assert_eq!(json["output_tokens"], 100);
    assert!(json["total_tok_per_s"].as_f64().unwrap() > 0.0);
    assert!(stdout.contains("total throughput:"), "{stdout}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let run = |args: &[&str]| {
        let out = bin().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("qwen3-tiny");
    let model = model.to_str().unwrap();
    // A GPU asked for on a machine without one.
    if !kernel_runtime::cuda::driver_present() {
        let err = run(&["generate", "--model", model, "--device", "cuda", "--prompt", "x"]);
        assert!(err.contains("no CUDA driver") && err.contains("--device cpu"), "{err}");
    }
    let err = run(&["generate", "--model", model, "--device", "tpu", "--prompt", "x"]);
    assert!(err.contains("unknown device `tpu`"), "{err}");
    let err =
        run(&["generate", "--model", tmp.path().join("missing").to_str().unwrap(), "--device", "cpu", "--prompt", "x"]);
    assert!(err.contains("missing"), "{err}");
    // A context longer than the model's, or a prompt longer than the one asked for.
    let err = run(&["generate", "--model", model, "--device", "cpu", "--max-model-len", "1000000", "--prompt", "x"]);
    assert!(err.contains("the served context of 1000000 tokens must be in 1..="), "{err}");
    let err = run(&[
        "generate",
        "--model",
        model,
        "--device",
        "cpu",
        "--max-model-len",
        "4",
        "--max-tokens",
        "2",
        "--prompt",
        "one two three four five six",
    ]);
    assert!(err.contains("context") && err.contains('4'), "{err}");
    let err = run(&[
        "shell",
        "--model",
        model,
        "--device",
        "cpu",
        "--chat-template",
        tmp.path().join("none.jinja").to_str().unwrap(),
    ]);
    assert!(err.contains("none.jinja"), "{err}");
    let err = run(&["pull", "gpt-5"]);
    assert!(err.contains("unknown model `gpt-5`") && err.contains("smollm2"), "{err}");
    // A folder whose config names an architecture nobody registered.
    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "model.safetensors"] {
        std::fs::copy(fixture("qwen3-tiny").join(f), broken.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(fixture("qwen3-tiny").join("config.json"))
        .unwrap()
        .replace("Qwen3ForCausalLM", "MambaForCausalLM");
    std::fs::write(broken.join("config.json"), config).unwrap();
    let err = run(&["generate", "--model", broken.to_str().unwrap(), "--device", "cpu", "--prompt", "x"]);
    assert!(err.contains("MambaForCausalLM") && err.contains("LlamaForCausalLM"), "{err}");
}

#[test]
fn help_port_and_shutdown_texts_say_what_a_user_needs() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(help.starts_with("Serve and run LLMs"), "{help}");
    assert!(help.contains("--log-level"), "{help}");
    let out = bin().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(help.contains("as many as fit in 1 GiB") && !help.contains("4096 on the CPU"), "{help}");
    assert!(help.contains("--stats-interval") && help.contains("--pull"), "{help}");
    // A port in use is found before the model loads: at once, and with no
    // loading line.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let started = std::time::Instant::now();
    let out = bin()
        .args(["serve", "--device", "cpu", "--port", &port, "--model"])
        .arg(fixture("qwen3-tiny"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert!(err.contains(&format!("cannot listen on 127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("loading") && !err.contains("loaded"), "the model loaded first: {err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{err}");
    // --log-level is checked.
    let out = bin().args(["--log-level", "info,=x", "pull", "--list"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-level"));
}

/// Issue 14, rows 7, 8 and 10: hostile model files fail fast with an error
/// naming the file and the key, and exit code 1, never an abort or a panic.
#[test]
fn hostile_model_files_are_named_load_errors() {
    let src = fixture("qwen3-tiny");
    type Patch = fn(&mut serde_json::Value);
    let cases: Vec<(&str, Patch, &str)> = vec![
        ("huge context", (|c| c["max_position_embeddings"] = (1u64 << 40).into()) as Patch, "max_position_embeddings"),
        (
            "yarn factor",
            (|c| {
                c["rope_scaling"] =
                    serde_json::json!({"rope_type": "yarn", "factor": 1e300, "original_max_position_embeddings": 1024})
            }) as Patch,
            "factor",
        ),
        ("huge vocab", (|c| c["vocab_size"] = (1u64 << 40).into()) as Patch, "vocab_size"),
        ("nan theta", (|c| c["rope_theta"] = (-1.0).into()) as Patch, "rope_theta"),
    ];
    for (what, patch, key) in cases {
        let tmp = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, tmp.path().join(f.file_name().unwrap())).unwrap();
        }
        let path = tmp.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        patch(&mut config);
        std::fs::write(&path, config.to_string()).unwrap();
        let t = std::time::Instant::now();
        let out = bin()
            .args(["generate", "--model", tmp.path().to_str().unwrap(), "--device", "cpu", "--prompt", "x"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("config.json") && err.contains(key), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{what}: took {:?}", t.elapsed());
    }
    // A weight map that points outside the model folder.
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    std::fs::copy(src.join("model.safetensors"), tmp.path().join("shard.safetensors")).unwrap();
    let index = serde_json::json!({"weight_map": {"model.norm.weight": "../model.safetensors"}});
    std::fs::write(tmp.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let out = bin()
        .args(["generate", "--model", tmp.path().to_str().unwrap(), "--device", "cpu", "--prompt", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is not a file name in the model folder"), "{err}");
}
