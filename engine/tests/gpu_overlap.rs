//! Overlap scheduling on the GPU: greedy ids and seeded samples are identical
//! with overlap on and off, through the whole engine (scheduler, persistent step
//! inputs, CUDA graphs of decode steps, device-resident sampled ids and the
//! gather of deferred tokens), for the dense bf16 fixtures and dummy Qwen3-0.6B
//! at batch 1, 7, 64 and 256. Prints `SUMMARY overlap ...` lines.
//!
//! Every request sets `ignore_eos` and its own `max_tokens`, so that both modes
//! run the same steps with the same rows (a step's rows decide its graph bucket,
//! hence its summation order): what is compared is the pipeline, not the
//! batch-invariance of the kernels.
//!
//! Runs only with MINISGL_GPU_TESTS=1 on a machine with a GPU.

#[path = "../../models/tests/common/mod.rs"]
mod common;
mod gpu_support;

use std::time::Instant;

use common::{cases, fixture, DENSE};
use engine::core::engine::{Engine, EngineConfig, GenerateOutput, GenerateRequest};
use engine::core::kvcache::CacheKind;
use engine::core::req::SamplingParams;
use engine::core::runner::CausalLmRunner;
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use gpu_support::{dummy, gpu_enabled, load_fixture_gpu};
use models::CausalLm;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PAGE: usize = 16;
/// Context the dummy model serves (the longest request below fits).
const MAX_CONTEXT: usize = 2048;

/// An engine over `model` with decode graphs up to `max_batch` rows.
fn engine(model: Box<dyn CausalLm>, num_pages: usize, max_context: usize, max_batch: usize) -> Engine<CausalLmRunner> {
    let mut runner = CausalLmRunner::new(model, num_pages, PAGE, max_context).unwrap();
    runner.capture_decode_graphs(max_batch.min(256)).unwrap();
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            page_size: PAGE,
            num_pages,
            max_prefill_length: 1 << 16,
            max_running_requests: max_batch.max(1),
            cache: CacheKind::Radix,
            policy: SchedulePolicy::PrefillFirst,
            decode_reserve: 1.0,
            eos_token_ids: vec![],
        },
    };
    Engine::new(runner, config).unwrap()
}

/// Half greedy, half sampled with a seed (temperature, top-k, top-p), each with
/// its own `max_tokens`.
fn params(i: usize, max_tokens: usize) -> SamplingParams {
    let mut p = if i.is_multiple_of(2) {
        SamplingParams::greedy(max_tokens)
    } else {
        SamplingParams { top_k: Some(40), top_p: 0.95, ..SamplingParams::random(max_tokens, 0.8, 1000 + i as u64) }
    };
    p.ignore_eos = true;
    p
}

/// `generate` with overlap off, then on, on the same engine: the outputs.
fn both_ways(engine: &mut Engine<CausalLmRunner>, requests: &[GenerateRequest]) -> [Vec<GenerateOutput>; 2] {
    let mut run = |overlap: bool| {
        engine.set_overlap(overlap).unwrap();
        engine.flush_cache();
        let t = Instant::now();
        let out = engine.generate(requests.to_vec()).unwrap();
        engine.check_integrity();
        assert_eq!(engine.stats().used_pages, 0);
        (out, t.elapsed().as_secs_f64())
    };
    let (plain, t_plain) = run(false);
    let (overlapped, t_overlap) = run(true);
    let tokens: usize = plain.iter().map(|o| o.output_ids.len()).sum();
    println!("  {tokens} tokens: {t_plain:.2} s without overlap, {t_overlap:.2} s with");
    [plain, overlapped]
}

fn assert_same(what: &str, [plain, overlapped]: &[Vec<GenerateOutput>; 2]) {
    assert_eq!(plain.len(), overlapped.len());
    for (i, (a, b)) in plain.iter().zip(overlapped).enumerate() {
        assert_eq!(a.output_ids, b.output_ids, "{what}: request {i} differs with overlap");
        assert_eq!(a.finish_reason, b.finish_reason, "{what}: request {i}");
    }
}

#[test]
fn overlap_equals_no_overlap_qwen3_0_6b_gpu() {
    if !gpu_enabled() {
        return;
    }
    let mut r = StdRng::seed_from_u64(17);
    for b in [1usize, 7, 64, 256] {
        let model = dummy("qwen3-0.6b", MAX_CONTEXT);
        let vocab = model.vocab_size() as u32;
        let mut engine = engine(model, 256 * 2048 / PAGE + 64, 2048, b);
        let requests: Vec<GenerateRequest> = (0..b)
            .map(|i| GenerateRequest {
                prompt_ids: (0..r.gen_range(4..=200)).map(|_| r.gen_range(0..vocab)).collect(),
                params: params(i, r.gen_range(8..=48)),
            })
            .collect();
        println!("SUMMARY overlap qwen3-0.6b bs={b}:");
        let outs = both_ways(&mut engine, &requests);
        assert_same(&format!("qwen3-0.6b bs={b}"), &outs);
        println!("SUMMARY overlap qwen3-0.6b bs={b}: greedy and seeded outputs identical with overlap on and off");
    }
}

#[test]
fn overlap_equals_no_overlap_dense_fixtures_gpu() {
    if !gpu_enabled() {
        return;
    }
    for name in DENSE {
        let model = load_fixture_gpu(&fixture(name));
        let mut engine = engine(model, 256, 512, 8);
        let requests: Vec<GenerateRequest> = cases(name)
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                let n = c.greedy_ids.len().max(4);
                [
                    GenerateRequest { prompt_ids: c.input_ids.clone(), params: params(2 * i, n) },
                    GenerateRequest { prompt_ids: c.input_ids.clone(), params: params(2 * i + 1, n + 3) },
                ]
            })
            .collect();
        println!("SUMMARY overlap {name} bf16 ({} requests):", requests.len());
        let outs = both_ways(&mut engine, &requests);
        assert_same(name, &outs);
        println!("SUMMARY overlap {name} bf16: greedy and seeded outputs identical with overlap on and off");
    }
}
