//! Real-size models with dummy weights on the GPU: Llama-3-8B, Qwen3-0.6B and
//! Qwen3-30B-A3B configurations load (dummy weights made on the GPU: the load
//! time is printed), prefill and decode; the time per decode step at batch 1
//! (median of warmed-up steps, the forward pass with the logits left on the GPU)
//! is printed next to the weight-bandwidth bound (weight bytes / 4.25 TB/s).
//!
//! Runs only with MINISGL_GPU_TESTS=1; prints `SUMMARY decode ...` lines.

use std::path::PathBuf;
use std::time::Instant;

use kernel_runtime::{DType, Device};
use models::{
    load_model, AttnBackendKind, AttnBackendSpec, ForwardBatch, LoadFormat, LoadOptions, LogitRows, MoeBackendKind,
    SeqStep,
};

const COPY_CEILING_BYTES_PER_S: f64 = 4.25e12;

fn run(config: &str, batch: usize) {
    if std::env::var("MINISGL_GPU_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set MINISGL_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/configs").join(config);
    let options = LoadOptions {
        device: Device::Cuda(0),
        dtype: Some(DType::BF16),
        load_format: LoadFormat::Dummy,
        attn: AttnBackendSpec::single(AttnBackendKind::Paged),
        moe: MoeBackendKind::Fused,
        max_context: None,
    };
    let started = Instant::now();
    let model = load_model(&dir, &options).unwrap();
    let load_s = started.elapsed().as_secs_f64();
    let c = model.config();
    // Parameters read per decode step: every weight once (embedding rows aside);
    // of a sparse MoE layer, the router and the experts the batch's tokens touch
    // (expected count under uniform routing: E (1 - (1 - k / E)^batch)).
    let attn = c.hidden_size * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        + c.num_attention_heads * c.head_dim * c.hidden_size;
    let mlp = match &c.moe {
        Some(m) => {
            let (e, k) = (m.num_experts as f64, m.num_experts_per_tok as f64);
            let touched = e * (1.0 - (1.0 - k / e).powi(batch as i32));
            (touched * (3 * c.hidden_size * m.moe_intermediate_size) as f64) as usize + m.num_experts * c.hidden_size
        }
        None => 3 * c.hidden_size * c.intermediate_size,
    };
    let per_layer = attn + mlp;
    let params = c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size;
    let weight_bytes = params as f64 * 2.0;

    let page_size = 16;
    let prompt_len: usize = 128;
    let steps: usize = 40;
    let pages_per_seq = (prompt_len + steps + 1).div_ceil(page_size);
    let kv = model.new_kv_cache(pages_per_seq * batch, page_size).unwrap();
    let prompts: Vec<Vec<u32>> =
        (0..batch).map(|b| (0..prompt_len as u32).map(|i| (i * 7 + b as u32) % 1000 + 1).collect()).collect();
    let pages: Vec<Vec<u32>> =
        (0..batch).map(|b| ((b * pages_per_seq) as u32..((b + 1) * pages_per_seq) as u32).collect()).collect();
    let seqs: Vec<SeqStep<'_>> =
        (0..batch).map(|b| SeqStep { new_tokens: &prompts[b], cached_len: 0, pages: &pages[b] }).collect();
    let fb = ForwardBatch::new(&seqs, page_size, LogitRows::LastOfEachSequence, model.device()).unwrap();
    let logits = model.forward(&fb, &kv).unwrap();
    assert!(logits.to_f32_vec().unwrap().iter().all(|v| v.is_finite()), "{config}: non-finite logits");

    let dev = kernel_runtime::cuda::device(0).unwrap();
    let mut times = Vec::new();
    let next = vec![[7u32]; batch];
    for s in 0..steps {
        let seqs: Vec<SeqStep<'_>> = (0..batch)
            .map(|b| SeqStep { new_tokens: &next[b], cached_len: prompt_len + s, pages: &pages[b] })
            .collect();
        dev.synchronize().unwrap();
        let t = Instant::now();
        let fb = ForwardBatch::new(&seqs, page_size, LogitRows::LastOfEachSequence, model.device()).unwrap();
        let _logits = model.forward(&fb, &kv).unwrap();
        dev.synchronize().unwrap();
        times.push(t.elapsed().as_secs_f64());
    }
    let warm = &mut times[5..];
    warm.sort_by(f64::total_cmp);
    let median_ms = warm[warm.len() / 2] * 1e3;
    let bound_ms = weight_bytes / COPY_CEILING_BYTES_PER_S * 1e3;
    println!(
        "SUMMARY decode {config} bs={batch}: {median_ms:.3} ms/step ({:.1} tok/s), weight-bandwidth bound {bound_ms:.3} ms ({:.2} GB of weights), {:.0}% of bound; load {load_s:.1}s",
        batch as f64 / (median_ms / 1e3),
        weight_bytes / 1e9,
        bound_ms / median_ms * 100.0
    );
}

#[test]
fn llama3_8b_dummy_decode_bs1() {
    run("llama3-8b", 1);
}

#[test]
fn qwen3_0_6b_dummy_decode_bs1() {
    run("qwen3-0.6b", 1);
}

#[test]
fn qwen3_0_6b_dummy_decode_bs64() {
    run("qwen3-0.6b", 64);
}

#[test]
fn llama3_8b_dummy_decode_bs64() {
    run("llama3-8b", 64);
}

#[test]
fn qwen3_30b_a3b_dummy_decode_bs1() {
    run("qwen3-30b-a3b", 1);
}

#[test]
fn qwen3_30b_a3b_dummy_decode_bs64() {
    run("qwen3-30b-a3b", 64);
}
