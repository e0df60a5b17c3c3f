//! The dense fixtures on the GPU in bf16 against the transformers references:
//! prefill logits at every position and teacher-forced decode (feeding the
//! reference greedy ids through the paged cache) within relative L2 2e-2, and the
//! argmax equal to the reference at every step whose reference top-2 gap is at
//! least 0.05.
//!
//! Runs only with MINISGL_GPU_TESTS=1 on a machine with a GPU; prints a line
//! `SUMMARY gpu-fixture <name> ...` per fixture for docs/PERF.md.

mod common;

use common::{argmax, cases, fixture, rel_l2, top2_gap};
use kernel_runtime::{DType, Device};
use models::registry::model_loader;
use models::{
    AttnBackendKind, CausalLm, ForwardBatch, KvCache, LogitRows, ModelConfig, MoeBackendKind, SeqStep, Weights,
};

fn gpu_enabled() -> bool {
    if std::env::var("MINISGL_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set MINISGL_GPU_TESTS=1 on a machine with a GPU");
        return false;
    }
    true
}

fn load_gpu(name: &str) -> Box<dyn CausalLm> {
    let dir = fixture(name);
    let mut config = ModelConfig::from_folder(&dir).unwrap();
    // The references carry rotary frequencies rounded to the checkpoint dtype
    // (see common::load).
    config.rope.inv_freq_dtype = config.torch_dtype.expect("fixture configs state their dtype");
    let weights = Weights::safetensors(&dir, DType::BF16, Device::Cuda(0)).unwrap();
    let attn = AttnBackendKind::Paged.create().unwrap();
    model_loader(&config.architecture).unwrap()(&config, &weights, attn, MoeBackendKind::Fused)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn forward(model: &dyn CausalLm, kv: &KvCache, seq: SeqStep<'_>, rows: LogitRows) -> Vec<f32> {
    let batch = ForwardBatch::new(&[seq], kv.page_size(), rows, model.device()).unwrap();
    model.forward(&batch, kv).unwrap().to_f32_vec().unwrap()
}

fn check(name: &str) {
    if !gpu_enabled() {
        return;
    }
    let model = load_gpu(name);
    let vocab = model.vocab_size();
    let page_size = 16;
    let (mut worst_prefill, mut worst_decode, mut checked_argmax) = (0f64, 0f64, 0usize);
    for (ci, case) in cases(name).iter().enumerate() {
        let total = case.input_ids.len() + case.greedy_ids.len();
        let pages: Vec<u32> = (0..total.div_ceil(page_size) as u32).rev().collect();
        let kv = model.new_kv_cache(pages.len() + 1, page_size).unwrap();
        let got = forward(
            &*model,
            &kv,
            SeqStep { new_tokens: &case.input_ids, cached_len: 0, pages: &pages },
            LogitRows::All,
        );
        let err = rel_l2(&got, &case.logits);
        worst_prefill = worst_prefill.max(err);
        assert!(err <= 2e-2, "{name} case {ci}: prefill rel L2 {err:e}");
        // Teacher-forced: step j feeds the token that produced greedy_logits[j].
        let mut fed = case.input_ids.len() - 1;
        let mut tokens = case.input_ids.clone();
        for (j, &next) in case.greedy_ids.iter().enumerate() {
            let want = &case.greedy_logits[j * vocab..(j + 1) * vocab];
            let got = if j == 0 {
                got[fed * vocab..(fed + 1) * vocab].to_vec()
            } else {
                forward(
                    &*model,
                    &kv,
                    SeqStep { new_tokens: &tokens[fed..fed + 1], cached_len: fed, pages: &pages },
                    LogitRows::All,
                )
            };
            let err = rel_l2(&got, want);
            worst_decode = worst_decode.max(err);
            assert!(err <= 2e-2, "{name} case {ci} step {j}: rel L2 {err:e}");
            if top2_gap(want) >= 0.05 {
                assert_eq!(
                    argmax(&got),
                    next as usize,
                    "{name} case {ci} step {j}: argmax differs (gap {})",
                    top2_gap(want)
                );
                checked_argmax += 1;
            }
            tokens.push(next);
            fed = tokens.len() - 1;
        }
    }
    println!(
        "SUMMARY gpu-fixture {name} bf16: prefill rel L2 max {worst_prefill:.2e}, teacher-forced max {worst_decode:.2e}, argmax equal at {checked_argmax} steps with gap >= 0.05"
    );
}

#[test]
fn llama_tiny_bf16() {
    check("llama-tiny");
}
#[test]
fn qwen2_tiny_bf16() {
    check("qwen2-tiny");
}
#[test]
fn qwen3_tiny_bf16() {
    check("qwen3-tiny");
}
#[test]
fn mistral_tiny_bf16() {
    check("mistral-tiny");
}
