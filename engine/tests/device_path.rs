//! The GPU runner's sampling path with the CPU standing in for the GPU
//! (`CausalLmRunner::set_device_path_on_cpu`): `launch` / `wait`, sampled ids
//! kept in `DeviceTokens`, deferred tokens gathered from them, penalties from
//! penalty slots counted on the "device", log probabilities copied back with the
//! ids. Over a fixture model, with prompts shared between requests (prefix cache
//! hits) and requests admitted one after another while a step is in flight,
//! its greedy tokens and log probabilities equal the host path's, with overlap
//! on and off (see the test for when overlap runs the same steps).

#[path = "../../models/tests/common/mod.rs"]
mod common;
mod drive_support;

use drive_support::{run, tokens_differ};
use engine::core::engine::{Engine, EngineConfig, GenerateRequest};
use engine::core::kvcache::CacheKind;
use engine::core::req::SamplingParams;
use engine::core::runner::CausalLmRunner;
use engine::core::sampling::penalties::Penalties;
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PAGE: usize = 4;
const NUM_PAGES: usize = 512;

fn engine(device_path: bool, max_running: usize) -> Engine<CausalLmRunner> {
    let model = common::load("qwen3-tiny");
    let mut runner = CausalLmRunner::new(model, NUM_PAGES, PAGE, 1024).unwrap();
    runner.set_device_path_on_cpu(device_path);
    let config = EngineConfig {
        scheduler: SchedulerConfig {
            page_size: PAGE,
            num_pages: NUM_PAGES,
            max_prefill_length: 64,
            max_running_requests: max_running,
            cache: CacheKind::Radix,
            policy: SchedulePolicy::PrefillFirst,
            decode_reserve: 1.0,
            eos_token_ids: vec![],
        },
    };
    Engine::new(runner, config).unwrap()
}

/// Greedy requests; pairs share a prompt; penalties on `i % 4` in {1, 3}, log
/// probabilities on `i % 4` in {2, 3}.
fn requests(n: usize, vocab: u32, r: &mut StdRng) -> Vec<GenerateRequest> {
    let mut prompt: Vec<u32> = Vec::new();
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                prompt = (0..r.gen_range(3..=40)).map(|_| r.gen_range(0..vocab)).collect();
            }
            let mut params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(r.gen_range(8..=30)) };
            if i % 4 == 1 || i % 4 == 3 {
                params.penalties = Penalties { repetition: 1.3, frequency: 0.6, presence: 0.4 };
            }
            if i % 4 >= 2 {
                params.logprobs = Some([5, 20][i % 2]);
            }
            GenerateRequest { prompt_ids: prompt.clone(), params }
        })
        .collect()
}

/// The device path equals the host path step for step (both synchronous: the
/// same steps, the same prefix hits), requests admitted one at a time or all at
/// once; with overlap too when every request runs from the first step (admitted
/// mid-run, a request would be admitted a step apart and its prefill batched
/// differently, which changes f32 rounding; the scheduler tests check the
/// overlapped bookkeeping of that case exactly, on a hash "model").
#[test]
fn device_path_on_the_cpu_equals_the_host_path() {
    let mut r = StdRng::seed_from_u64(5);
    for max_running in [1, 3, 16] {
        let reqs = requests(12, 544, &mut r);
        let (want, _) = run(&mut engine(false, max_running), &reqs, false);
        let mut device = engine(true, max_running);
        let overlaps: &[bool] = if max_running >= reqs.len() { &[false, true] } else { &[false] };
        for &overlap in overlaps {
            let (got, _) = run(&mut device, &reqs, overlap);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "max_running {max_running}, overlap {overlap}: request {i}");
            }
        }
        let pairs_differ = want.chunks(2).filter(|p| tokens_differ(&p[0].0, &p[1].0)).count();
        assert!(pairs_differ > 0, "penalties changed no output");
    }
}
