//! Penalties and log probabilities on the GPU, through the whole engine: a
//! batch where requests ask for repetition/frequency/presence penalties and
//! `top_logprobs` runs on the device (penalty slots, the sampled ids counted on
//! the device, log probabilities copied back with the ids) and gives the
//! tokens of the host path (logits copied to the host, `Penalties::apply`,
//! `token_logprobs`), bit for bit for greedy rows, with log probabilities
//! within f32 rounding; with overlap on and off the device path is identical.
//! Prints `SUMMARY extras ...` lines with the throughput of both paths.
//!
//! Runs only with MINISGL_GPU_TESTS=1 on a machine with a GPU.

#[allow(dead_code)] // tokens_differ serves the CPU comparison only
mod drive_support;
#[allow(dead_code)] // the fixture loader is for the other GPU tests
mod gpu_support;

use drive_support::{run, Outputs};
use engine::core::engine::{Engine, EngineConfig, GenerateRequest, ModelRunner, RunnerError, SampledStep};
use engine::core::grammar::TokenMasks;
use engine::core::kvcache::CacheKind;
use engine::core::req::{PreparedBatch, SamplingParams};
use engine::core::runner::CausalLmRunner;
use engine::core::sampling::logprobs::TokenLogprobs;
use engine::core::sampling::penalties::Penalties;
use engine::core::sampling::Logits;
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use gpu_support::{dummy, gpu_enabled};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PAGE: usize = 16;
const MAX_CONTEXT: usize = 2048;

/// The GPU runner with its device-side extras turned off: steps with
/// penalties or log probabilities take the host path, as before.
#[derive(Debug)]
struct HostExtras(CausalLmRunner);

impl ModelRunner for HostExtras {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        self.0.forward(batch)
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_context_len(&self) -> usize {
        self.0.max_context_len()
    }
    fn launch(&mut self, batch: &PreparedBatch) -> Result<bool, RunnerError> {
        self.0.launch(batch)
    }
    fn launch_masked(
        &mut self,
        batch: &PreparedBatch,
        masks: &mut dyn FnMut() -> Option<TokenMasks>,
    ) -> Result<bool, RunnerError> {
        self.0.launch_masked(batch, masks)
    }
    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        self.0.wait()
    }
}

fn config(max_batch: usize, num_pages: usize) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            page_size: PAGE,
            num_pages,
            max_prefill_length: 1 << 16,
            max_running_requests: max_batch,
            cache: CacheKind::Radix,
            policy: SchedulePolicy::PrefillFirst,
            decode_reserve: 1.0,
            eos_token_ids: vec![],
        },
    }
}

fn runner(max_batch: usize, num_pages: usize) -> CausalLmRunner {
    let model = dummy("qwen3-0.6b", MAX_CONTEXT);
    let mut runner = CausalLmRunner::new(model, num_pages, PAGE, MAX_CONTEXT).unwrap();
    runner.capture_decode_graphs(max_batch).unwrap();
    runner
}

/// Request `i`: greedy, with penalties when `i % 4` is 0 or 1, log
/// probabilities when it is 0 or 2; pairs share a prompt so that the effect of
/// the penalties shows.
fn requests(b: usize, vocab: u32, r: &mut StdRng) -> Vec<GenerateRequest> {
    let mut prompt: Vec<u32> = Vec::new();
    (0..b)
        .map(|i| {
            if i % 2 == 0 {
                prompt = (0..r.gen_range(4..=200)).map(|_| r.gen_range(0..vocab)).collect();
            }
            let mut params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(r.gen_range(16..=48)) };
            if i % 4 <= 1 {
                params.penalties = Penalties { repetition: 1.3, frequency: 0.6, presence: 0.4 };
            }
            if i % 2 == 0 {
                params.logprobs = Some([20, 5][i % 4 / 2]);
            }
            GenerateRequest { prompt_ids: prompt.clone(), params }
        })
        .collect()
}

/// Which requests of `a` and `b` differ (tokens or log probabilities).
fn differing(a: &Outputs, b: &Outputs) -> Vec<usize> {
    a.iter().zip(b).enumerate().filter(|(_, (x, y))| x != y).map(|(i, _)| i).collect()
}

#[test]
fn penalties_and_logprobs_on_the_gpu_equal_the_host_path_gpu() {
    if !gpu_enabled() {
        return;
    }
    let mut r = StdRng::seed_from_u64(23);
    let mut failures = Vec::new();
    for b in [1usize, 9, 64] {
        let num_pages = 64 * MAX_CONTEXT / PAGE + 64;
        let mut device = Engine::new(runner(b, num_pages), config(b, num_pages)).unwrap();
        let vocab = device.runner().model().vocab_size() as u32;
        // All `b` requests run at once, so that both modes run the same steps
        // (requests admitted mid-run would be admitted a step apart, and their
        // prefills batched differently, with overlap).
        let reqs = requests(b, vocab, &mut r);
        let (on_device, t_device) = run(&mut device, &reqs, false);
        let (overlapped, t_overlap) = run(&mut device, &reqs, true);
        drop(device);
        let mut host = Engine::new(HostExtras(runner(b, num_pages)), config(b, num_pages)).unwrap();
        let (on_host, t_host) = run(&mut host, &reqs, false);
        println!(
            "SUMMARY extras bs={b} differing requests: with overlap {:?}, on the host path {:?} (tokens {:?})",
            differing(&on_device, &overlapped),
            differing(&on_device, &on_host),
            on_device
                .iter()
                .zip(&on_host)
                .enumerate()
                .filter(|(_, (x, y))| x.0 != y.0)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        );
        let tokens: usize = on_device.iter().map(|o| o.0.len()).sum();
        let mut worst = 0f32;
        for (i, ((d, o), h)) in on_device.iter().zip(&overlapped).zip(&on_host).enumerate() {
            if d != o {
                failures.push(format!("bs={b}: request {i} differs with overlap"));
            }
            if d.0 != h.0 || d.1.len() != h.1.len() {
                failures.push(format!("bs={b}: request {i}'s tokens differ from the host path"));
                continue;
            }
            for (a, e) in d.1.iter().zip(&h.1) {
                let ids = |t: &TokenLogprobs| t.top.iter().map(|x| x.0).collect::<Vec<_>>();
                if (a.token, ids(a)) != (e.token, ids(e)) {
                    failures.push(format!("bs={b}: request {i}'s alternatives differ from the host path"));
                }
                for (x, y) in
                    std::iter::once((a.logprob, e.logprob)).chain(a.top.iter().zip(&e.top).map(|(x, y)| (x.1, y.1)))
                {
                    worst = worst.max((x - y).abs());
                    if (x - y).abs() > 1e-4 * (1.0 + y.abs()) {
                        failures.push(format!("bs={b}: request {i}: log probability {x} vs {y} on the host path"));
                    }
                }
            }
        }
        let pairs_differ = on_device.chunks(2).filter(|p| p.len() == 2 && p[0].0 != p[1].0).count();
        if pairs_differ == 0 && b > 1 {
            failures.push(format!("bs={b}: penalties changed no output"));
        }
        println!(
            "SUMMARY extras qwen3-0.6b bs={b}: {tokens} tokens, device path {:.0} tok/s ({:.0} overlapped), host path {:.0} tok/s; log probabilities within {worst:.1e} of the host path's",
            tokens as f64 / t_device,
            tokens as f64 / t_overlap,
            tokens as f64 / t_host
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
