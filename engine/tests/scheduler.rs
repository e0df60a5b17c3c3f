//! Scheduler, KV cache and engine tests against a fake deterministic model.
//!
//! [`FakeLm`] behaves like a causal LM over the paged KV cache: the "KV" of
//! the token at position `p` is a hash of its own id and the KV at `p - 1`
//! (read back through the page table), and a row's logits hash the KV of all
//! positions it attends to. Its outputs are thus a function of each
//! sequence's full token history, and any mistake in page tables, slots,
//! chunk boundaries, prefix reuse, eviction or preemption changes them. An
//! independent oracle ([`oracle`]) computes the same function without any
//! paging; every test asserts that the engine reproduces it exactly, and
//! that the pool is whole again afterwards.

use std::collections::HashMap;

use engine::core::engine::{
    Engine, EngineConfig, EngineError, GenerateOutput, GenerateRequest, LengthLimit, ModelRunner, RunnerError,
    SampledStep,
};
use engine::core::kvcache::CacheKind;
use engine::core::req::{FinishReason, PreparedBatch, ReqId, SamplingParams};
use engine::core::sampling::logprobs::{token_logprobs, TokenLogprobs};
use engine::core::sampling::penalties::Penalties;
use engine::core::sampling::{self, Logits, SamplingRow};
use engine::core::scheduler::{SchedulePolicy, SchedulerConfig};
use kernel_runtime::ops::{self, CountKind, RowLogprobs};
use kernel_runtime::staging::Upload;
use kernel_runtime::{DType, Device, Tensor};

const VOCAB: usize = 48;
const EOS: u32 = 0;
const MAX_CONTEXT: usize = 4096;
const CHAIN_SEED: u64 = 0x5EED;

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// KV of a token given the KV of the one before it.
fn chain(prev: u64, token: u32) -> u64 {
    mix(prev ^ mix(u64::from(token) + 1))
}

/// Logits of a row from the KV of its last token and a digest of all its KV.
fn logits_for(last: u64, digest: u64) -> Vec<f32> {
    let key = mix(last ^ digest.rotate_left(17));
    (0..VOCAB as u64)
        .map(|v| (mix(key ^ v.wrapping_mul(0xA24B_AED4_963E_E407)) >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0)
        .collect()
}

fn digest_step(acc: u64, pos: usize, kv: u64) -> u64 {
    acc.wrapping_add(kv.rotate_left((pos % 64) as u32))
}

/// A paged "model" (see the module docs). It validates the step it is given
/// like a careful kernel launcher would.
#[derive(Debug)]
struct FakeLm {
    page_size: usize,
    kv: Vec<Option<u64>>,
    max_batch_rows: usize,
    /// Sample "on the device" (`launch`/`wait`), as the GPU runner does: with
    /// the batch's sampling rows only, so penalties and log probabilities
    /// must make the engine take the host path instead...
    device_sampling: bool,
    /// ...unless the "device" also does those (`samples_extras`), as the GPU
    /// runner does: with kernel-runtime's penalty and log-probability ops on
    /// host tensors (their CPU references) and counters kept per penalty slot.
    device_extras: bool,
    /// The "device's" penalty counters.
    counts: Option<Tensor>,
    /// Steps run through `forward` (the host path).
    host_forwards: usize,
    /// Ids of the steps launched on the "device" and not waited for.
    launched: std::collections::VecDeque<SampledStep>,
    /// For each of those steps, the pages it reads and whose they are.
    in_flight_reads: std::collections::VecDeque<HashMap<usize, ReqId>>,
    /// Pages written while a step in flight read them for another request.
    page_violations: Vec<String>,
}

impl FakeLm {
    fn new(config: &EngineConfig) -> Self {
        Self {
            page_size: config.scheduler.page_size,
            kv: vec![None; config.scheduler.num_pages * config.scheduler.page_size],
            max_batch_rows: 0,
            device_sampling: false,
            device_extras: false,
            counts: None,
            host_forwards: 0,
            launched: Default::default(),
            in_flight_reads: Default::default(),
            page_violations: Vec::new(),
        }
    }
}

impl FakeLm {
    /// Samples the step's rows with its extras, as the GPU runner's device
    /// does: penalty slots set up and applied from their counters, the sampled
    /// tokens counted, log probabilities of the raw logits.
    fn sample_with_extras(&mut self, b: &PreparedBatch, logits: &Logits) -> Result<SampledStep, RunnerError> {
        let extras = b.extras();
        let rows = logits.num_rows();
        let flat: Vec<f32> = (0..rows).flat_map(|r| logits.row(r).to_vec()).collect();
        let raw = Tensor::from_slice(&flat, &[rows, VOCAB], Device::Cpu)?;
        let work = ops::cast(&raw, DType::F32)?;
        let mut upload = Upload::new(Device::Cpu)?;
        let needed = extras.penalties.iter().map(|p| p.slot as usize + 1).max().unwrap_or(0);
        if self.counts.as_ref().is_none_or(|c| c.dim(0) < needed) {
            let grown = Tensor::zeros(&[needed.max(1), VOCAB], DType::I32, Device::Cpu)?;
            if let Some(old) = self.counts.take() {
                ops::copy(&grown.narrow(0, 0, old.dim(0))?, &old)?;
            }
            self.counts = Some(grown);
        }
        let counts = self.counts.clone().ok_or("counts")?;
        for setup in &extras.setups {
            counts.narrow(0, setup.slot as usize, 1)?.fill_zero()?;
            for (kind, tokens) in [(CountKind::Prompt, &setup.prompt), (CountKind::Output, &setup.outputs)] {
                let slots = vec![setup.slot as i32; tokens.len()];
                let tokens: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
                let (slots_t, tokens_t) = (
                    Tensor::from_slice(&slots, &[slots.len()], Device::Cpu)?,
                    Tensor::from_slice(&tokens, &[tokens.len()], Device::Cpu)?,
                );
                ops::penalty_count(&counts, &slots_t, &tokens_t, kind)?;
            }
        }
        ops::apply_penalties(&work, &counts, &extras.penalties, &mut upload)?;
        let penalised = Logits::new(work.to_vec::<f32>()?, VOCAB);
        let tokens = sampling::sample(&penalised, b.sampling());
        let sampled_ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let sampled = Tensor::from_slice(&sampled_ids, &[rows], Device::Cpu)?;
        let slots = extras.row_slots(rows);
        ops::penalty_count(&counts, &Tensor::from_slice(&slots, &[rows], Device::Cpu)?, &sampled, CountKind::Output)?;
        let mut logprobs = Vec::new();
        if !extras.logprobs.is_empty() {
            let top_n = extras.max_top_logprobs();
            let cols = ops::logprobs_cols(top_n);
            let lp_rows: Vec<u32> = extras.logprobs.iter().map(|&(r, _)| r).collect();
            let out = Tensor::zeros(&[lp_rows.len(), cols], DType::I32, Device::Cpu)?;
            ops::logprobs(&raw, &lp_rows, &sampled, top_n, &out, &mut upload)?;
            let words = out.to_vec::<i32>()?;
            for (k, &(row, n)) in extras.logprobs.iter().enumerate() {
                let RowLogprobs { token, logprob, top } =
                    RowLogprobs::decode(&words[k * cols..(k + 1) * cols], n, VOCAB);
                logprobs.push((row, TokenLogprobs { token, logprob, top }));
            }
        }
        Ok(SampledStep { tokens, logprobs })
    }

    /// The forward pass over the step `b` feeding `ids` (its input ids with
    /// the deferred ones filled in).
    fn forward_ids(&mut self, b: &PreparedBatch, ids: &[u32]) -> Result<Logits, RunnerError> {
        let ps = self.page_size;
        if b.page_size() != ps {
            return Err("page size mismatch".into());
        }
        let rows = b.num_rows();
        self.max_batch_rows = self.max_batch_rows.max(rows);
        let width = b.max_num_pages();
        let (indptr, kv_lens, q_lens) = (b.q_indptr(), b.kv_lens(), b.q_lens());
        if indptr.len() != rows + 1
            || kv_lens.len() != rows
            || q_lens.len() != rows
            || b.page_table().len() != rows * width
        {
            return Err("inconsistent batch shapes".into());
        }
        let slot_of = |row: usize, pos: usize| -> Result<usize, RunnerError> {
            if pos / ps >= width {
                return Err(format!("row {row}: position {pos} is past its page table").into());
            }
            Ok(b.page_table()[row * width + pos / ps] as usize * ps + pos % ps)
        };
        for r in 0..rows {
            let (start, end) = (indptr[r] as usize, indptr[r + 1] as usize);
            let (q_len, kv_len) = (q_lens[r] as usize, kv_lens[r] as usize);
            if end - start != q_len || q_len == 0 || kv_len < q_len {
                return Err(format!("row {r}: bad lengths").into());
            }
            #[allow(clippy::needless_range_loop)] // i indexes positions, slots and ids alike
            for i in start..end {
                let pos = b.positions()[i] as usize;
                if pos != kv_len - q_len + (i - start) {
                    return Err(format!("row {r}: token {i} at position {pos}").into());
                }
                let slot = slot_of(r, pos)?;
                if b.out_loc()[i] as usize != slot {
                    return Err(format!("row {r}: out_loc {} but page table says {slot}", b.out_loc()[i]).into());
                }
                let prev = if pos == 0 {
                    CHAIN_SEED
                } else {
                    self.kv[slot_of(r, pos - 1)?]
                        .ok_or_else(|| format!("row {r}: read of unwritten KV at {}", pos - 1))?
                };
                self.kv[slot] = Some(chain(prev, ids[i]));
            }
        }
        let mut data = Vec::with_capacity(b.logits_rows().len() * VOCAB);
        for &r in b.logits_rows() {
            let r = r as usize;
            let kv_len = kv_lens[r] as usize;
            // Attention reads every cached position: fold them all in.
            let mut digest = 0;
            let mut last = 0;
            for pos in 0..kv_len {
                last = self.kv[slot_of(r, pos)?].ok_or_else(|| format!("row {r}: read of unwritten KV at {pos}"))?;
                digest = digest_step(digest, pos, last);
            }
            data.extend(logits_for(last, digest));
        }
        Ok(Logits::new(data, VOCAB))
    }

    /// Checks, at the launch of `b`, that no page it writes is read for
    /// another request by a step launched before and not waited for (a page
    /// released and handed out again too early), then records what `b` reads.
    fn record_pages(&mut self, b: &PreparedBatch) {
        let ps = self.page_size;
        let width = b.max_num_pages();
        let ids: Vec<ReqId> = b.req_ids().collect();
        for (r, &id) in ids.iter().enumerate() {
            for i in b.q_indptr()[r]..b.q_indptr()[r + 1] {
                let page = b.out_loc()[i as usize] as usize / ps;
                for (step, reads) in self.in_flight_reads.iter().enumerate() {
                    if let Some(&owner) = reads.get(&page).filter(|&&owner| owner != id) {
                        self.page_violations.push(format!(
                            "{id} writes page {page}, which {owner} reads in the step {} launches back",
                            self.in_flight_reads.len() - step
                        ));
                    }
                }
            }
        }
        let mut reads = HashMap::new();
        for (r, &id) in ids.iter().enumerate() {
            let n = (b.kv_lens()[r] as usize).div_ceil(ps);
            for &page in &b.page_table()[r * width..r * width + n] {
                reads.insert(page as usize, id);
            }
        }
        self.in_flight_reads.push_back(reads);
    }
}

impl ModelRunner for FakeLm {
    fn forward(&mut self, b: &PreparedBatch) -> Result<Logits, RunnerError> {
        if !b.deferred().is_empty() {
            return Err("the host path got deferred tokens".into());
        }
        self.host_forwards += 1;
        self.forward_ids(b, b.input_ids())
    }

    /// "On the device": the work is done at launch, the ids come back at
    /// `wait`; deferred tokens are fed from the previous launch's ids, as the
    /// GPU runner feeds them from its device buffer.
    fn launch(&mut self, b: &PreparedBatch) -> Result<bool, RunnerError> {
        if !self.device_sampling {
            return Ok(false);
        }
        if !b.extras().is_empty() && !self.device_extras {
            return Err("extras for a runner that does not sample them".into());
        }
        let mut ids = b.input_ids().to_vec();
        for d in b.deferred() {
            let prev = self.launched.back().ok_or("deferred tokens with nothing launched")?;
            ids[d.token as usize] = prev.tokens[d.row as usize];
        }
        self.record_pages(b);
        let logits = self.forward_ids(b, &ids)?;
        let sampled = if b.extras().is_empty() {
            SampledStep::from(sampling::sample(&logits, b.sampling()))
        } else {
            self.sample_with_extras(b, &logits)?
        };
        self.launched.push_back(sampled);
        if self.launched.len() > 2 {
            return Err("more than two steps launched and not waited for".into());
        }
        Ok(true)
    }

    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        self.in_flight_reads.pop_front();
        Ok(self.launched.pop_front().ok_or("nothing launched")?)
    }

    fn samples_extras(&self) -> bool {
        self.device_sampling && self.device_extras
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn max_context_len(&self) -> usize {
        MAX_CONTEXT
    }
}

/// The expected output of one request: the fake model's function evaluated
/// directly on the token history, with the same stopping rules.
fn oracle(req: &GenerateRequest) -> (Vec<u32>, FinishReason) {
    let (out, reason, _) = oracle_with_logprobs(req);
    (out, reason)
}

/// [`oracle`] and the log probabilities of every output token (when the
/// request asks for them): penalties applied before sampling, log
/// probabilities taken from the raw logits.
fn oracle_with_logprobs(req: &GenerateRequest) -> (Vec<u32>, FinishReason, Vec<TokenLogprobs>) {
    let p = &req.params;
    let mut tokens = req.prompt_ids.clone();
    let mut out = Vec::new();
    let mut logprobs = Vec::new();
    loop {
        let mut h = CHAIN_SEED;
        let mut digest = 0;
        for (pos, &t) in tokens.iter().enumerate() {
            h = chain(h, t);
            digest = digest_step(digest, pos, h);
        }
        let row = SamplingRow {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed.expect("oracle requests are seeded"),
            step: out.len() as u64,
        };
        let raw = logits_for(h, digest);
        let mut logits = raw.clone();
        p.penalties.apply(&mut logits, &req.prompt_ids, &out);
        let token = sampling::sample_row(&logits, &row);
        if let Some(n) = p.logprobs {
            logprobs.push(token_logprobs(&raw, token, n));
        }
        tokens.push(token);
        out.push(token);
        if (!p.ignore_eos && token == EOS) || p.stop_token_ids.contains(&token) {
            return (out, FinishReason::Stop, logprobs);
        }
        if out.len() >= p.max_tokens {
            return (out, FinishReason::Length, logprobs);
        }
    }
}

fn config(
    page_size: usize,
    num_pages: usize,
    max_prefill_length: usize,
    cache: CacheKind,
    policy: SchedulePolicy,
) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            page_size,
            num_pages,
            max_prefill_length,
            max_running_requests: 16,
            cache,
            policy,
            decode_reserve: 1.0,
            eos_token_ids: vec![EOS],
        },
    }
}

/// A prompt that starts with `shared` tokens common to every request of the
/// same `family`, then diverges.
fn prompt(family: u32, shared: usize, own: usize, salt: u32) -> Vec<u32> {
    let common = (0..shared as u32).map(|i| 1 + (family * 7 + i * 13) % (VOCAB as u32 - 1));
    let unique = (0..own as u32).map(|i| 1 + (salt * 31 + i * 17 + 5) % (VOCAB as u32 - 1));
    common.chain(unique).collect()
}

/// Sixteen requests: prompt lengths 1..~70, outputs 1..40, greedy and
/// sampled (temperature, top-k, top-p, min-p), stop ids, ignore_eos,
/// penalties, log probabilities, and families sharing prefixes of various
/// lengths.
fn sixteen_requests() -> Vec<GenerateRequest> {
    (0..16u32)
        .map(|i| {
            let shared = [0, 5, 12, 33][(i % 4) as usize];
            let own = [1, 9, 20, 3, 37][(i % 5) as usize];
            let mut params = match i % 4 {
                0 => SamplingParams::greedy(40),
                1 => SamplingParams::random(25, 0.8, 1000 + u64::from(i)),
                2 => SamplingParams { top_k: Some(5), top_p: 0.9, ..SamplingParams::random(30, 1.3, 77) },
                _ => SamplingParams { min_p: 0.2, ..SamplingParams::random(1 + i as usize, 1.0, u64::from(i)) },
            };
            params.seed.get_or_insert(9);
            if i == 5 {
                params.stop_token_ids = std::sync::Arc::from([3, 4]);
            }
            if i == 6 || i == 11 {
                params.ignore_eos = true;
            }
            // Penalties and log probabilities on some requests: their steps
            // sample on the host, next to requests that need nothing of it.
            match i {
                7 => params.penalties.repetition = 1.7,
                9 => {
                    params.penalties.frequency = 0.9;
                    params.penalties.presence = 0.4;
                }
                10 => params.logprobs = Some(3),
                13 => {
                    params.logprobs = Some(0);
                    params.penalties.repetition = 0.8;
                    params.penalties.presence = -0.5;
                }
                _ => {}
            }
            GenerateRequest { prompt_ids: prompt(i % 3, shared, own, i), params }
        })
        .collect()
}

/// Steps `engine` until idle, checking the page accounting and limits at
/// every step. Returns the tokens streamed per request and the finish
/// records.
#[allow(clippy::type_complexity)]
fn drive(
    engine: &mut Engine<FakeLm>,
    max_running: usize,
) -> (HashMap<ReqId, Vec<u32>>, HashMap<ReqId, GenerateOutput>, HashMap<ReqId, Vec<TokenLogprobs>>) {
    let mut streamed: HashMap<ReqId, Vec<u32>> = HashMap::new();
    let mut finished = HashMap::new();
    let mut logprobs: HashMap<ReqId, Vec<TokenLogprobs>> = HashMap::new();
    let mut guard = 0;
    while engine.has_work() {
        for event in engine.step().expect("step") {
            streamed.entry(event.id).or_default().push(event.token);
            if let Some(lp) = event.logprobs {
                logprobs.entry(event.id).or_default().push(lp);
            }
            if let Some(f) = event.finished {
                finished.insert(f.id, GenerateOutput::from(f));
            }
        }
        engine.check_integrity();
        assert!(engine.stats().num_running <= max_running);
        guard += 1;
        assert!(guard < 100_000, "engine does not make progress");
    }
    (streamed, finished, logprobs)
}

/// After a run: no page in use, and every page free once the prefix cache
/// is flushed.
fn assert_pool_whole(engine: &mut Engine<FakeLm>) {
    engine.check_integrity();
    let stats = engine.stats();
    assert_eq!(stats.used_pages, 0, "{stats:?}");
    assert_eq!(stats.free_pages + stats.evictable_pages, stats.num_pages, "{stats:?}");
    engine.flush_cache();
    let stats = engine.stats();
    assert_eq!(stats.free_pages, stats.num_pages, "{stats:?}");
    assert_eq!(stats.cached_pages, 0);
}

fn new_engine(config: EngineConfig) -> Engine<FakeLm> {
    Engine::new(FakeLm::new(&config), config).expect("valid config")
}

fn assert_matches_oracle(requests: &[GenerateRequest], outputs: &[GenerateOutput]) {
    assert_eq!(requests.len(), outputs.len());
    for (i, (req, out)) in requests.iter().zip(outputs).enumerate() {
        let (ids, reason) = oracle(req);
        assert_eq!(out.output_ids, ids, "request {i}");
        assert_eq!(out.finish_reason, reason, "request {i}");
        assert_eq!(out.prompt_tokens, req.prompt_ids.len());
    }
}

/// Runs the sixteen requests together under `config` and checks them
/// against the oracle, the stream against the final outputs, and the pool.
fn check_together(config: EngineConfig) -> Engine<FakeLm> {
    check_together_on(config, false)
}

/// [`check_together`], sampling "on the device" when `device_sampling`.
fn check_together_on(config: EngineConfig, device_sampling: bool) -> Engine<FakeLm> {
    let requests = sixteen_requests();
    let max_running = config.scheduler.max_running_requests;
    let mut engine = new_engine(config);
    engine.runner_mut().device_sampling = device_sampling;
    let ids: Vec<ReqId> = requests.iter().map(|r| engine.add_request(r.clone()).expect("valid request")).collect();
    let (streamed, finished, logprobs) = drive(&mut engine, max_running);
    let outputs: Vec<GenerateOutput> = ids.iter().map(|id| finished[id].clone()).collect();
    assert_matches_oracle(&requests, &outputs);
    for (i, (id, out)) in ids.iter().zip(&outputs).enumerate() {
        assert_eq!(streamed[id], out.output_ids, "streamed tokens of {id}");
        let want = oracle_with_logprobs(&requests[i]).2;
        assert_eq!(logprobs.get(id).cloned().unwrap_or_default(), want, "log probabilities of request {i}");
        assert_eq!(want.is_empty(), requests[i].params.logprobs.is_none());
    }
    assert_pool_whole(&mut engine);
    engine
}

macro_rules! together_cases {
    ($($name:ident: $ps:expr, $pages:expr, $prefill:expr, $cache:expr, $policy:expr;)*) => {$(
        #[test]
        fn $name() {
            check_together(config($ps, $pages, $prefill, $cache, $policy));
        }
    )*};
}

together_cases! {
    together_radix_prefill_first: 4, 512, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst;
    together_radix_mixed: 4, 512, 256, CacheKind::Radix, SchedulePolicy::Mixed;
    together_naive_prefill_first: 4, 512, 256, CacheKind::Naive, SchedulePolicy::PrefillFirst;
    together_naive_mixed: 4, 512, 256, CacheKind::Naive, SchedulePolicy::Mixed;
    together_page_size_1: 1, 2048, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst;
    together_page_size_16: 16, 128, 256, CacheKind::Radix, SchedulePolicy::Mixed;
    chunked_8_page_16: 16, 128, 8, CacheKind::Radix, SchedulePolicy::PrefillFirst;
    chunked_8_page_4_mixed: 4, 512, 8, CacheKind::Radix, SchedulePolicy::Mixed;
    chunked_5_page_4_naive: 4, 512, 5, CacheKind::Naive, SchedulePolicy::PrefillFirst;
    chunked_1_page_3: 3, 700, 1, CacheKind::Radix, SchedulePolicy::Mixed;
}

#[test]
fn sixteen_together_equal_each_alone() {
    let requests = sixteen_requests();
    let cfg = config(4, 512, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    let mut engine = new_engine(cfg.clone());
    let together = engine.generate(requests.clone()).expect("generate");
    assert!(engine.runner().max_batch_rows > 1, "requests were actually batched");
    assert_pool_whole(&mut engine);
    for (i, req) in requests.into_iter().enumerate() {
        let mut alone = new_engine(cfg.clone());
        let out = alone.generate(vec![req]).expect("generate");
        assert_eq!(out[0].output_ids, together[i].output_ids, "request {i}");
        assert_eq!(out[0].finish_reason, together[i].finish_reason, "request {i}");
        assert_pool_whole(&mut alone);
    }
}

#[test]
fn chunked_prefill_equals_unchunked() {
    let requests = sixteen_requests();
    let run = |max_prefill_length| {
        let mut engine =
            new_engine(config(16, 128, max_prefill_length, CacheKind::Radix, SchedulePolicy::PrefillFirst));
        let out = engine.generate(requests.clone()).expect("generate");
        assert_pool_whole(&mut engine);
        (out, engine.stats().num_steps)
    };
    let (unchunked, steps_unchunked) = run(4096);
    let (chunked, steps_chunked) = run(8);
    assert!(steps_chunked > steps_unchunked, "chunking takes more steps");
    for (a, b) in unchunked.iter().zip(&chunked) {
        assert_eq!((&a.output_ids, a.finish_reason), (&b.output_ids, b.finish_reason));
    }
}

#[test]
fn radix_reuses_a_shared_prefix() {
    let first = GenerateRequest { prompt_ids: prompt(1, 40, 6, 1), params: SamplingParams::random(12, 0.7, 5) };
    let second = GenerateRequest { prompt_ids: prompt(1, 40, 9, 2), params: SamplingParams::random(12, 0.7, 6) };
    let mut engine = new_engine(config(4, 256, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let a = engine.generate(vec![first.clone()]).expect("generate");
    assert_eq!(engine.stats().cache_hit_tokens, 0);
    assert_eq!(a[0].cached_tokens, 0);
    let b = engine.generate(vec![second.clone()]).expect("generate");
    // 40 shared tokens: 10 whole pages are reused.
    assert_eq!(b[0].cached_tokens, 40);
    assert_eq!(engine.stats().cache_hit_tokens, 40);
    assert_matches_oracle(&[first.clone(), second.clone()], &[a[0].clone(), b[0].clone()]);

    // The same request again reuses its whole prompt but its last token.
    let again = engine.generate(vec![second.clone()]).expect("generate");
    assert_eq!(again[0].output_ids, b[0].output_ids);
    assert_eq!(again[0].cached_tokens, (second.prompt_ids.len() - 1) / 4 * 4);
    assert_pool_whole(&mut engine);

    // The naive cache gives the same tokens without reuse.
    let mut naive = new_engine(config(4, 256, 64, CacheKind::Naive, SchedulePolicy::PrefillFirst));
    let n = naive.generate(vec![first, second]).expect("generate");
    assert_eq!(n[1].output_ids, b[0].output_ids);
    assert_eq!(n[1].cached_tokens, 0);
    assert_eq!(naive.stats().cache_hit_tokens, 0);
    assert_pool_whole(&mut naive);
}

#[test]
fn radix_shares_prefixes_between_concurrent_requests() {
    // Sixteen requests, three families: later arrivals hit what earlier ones
    // cached after their prefill.
    let mut cfg = config(4, 512, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    cfg.scheduler.max_prefill_length = 40;
    let engine = check_together(cfg);
    assert!(engine.stats().cache_hit_tokens > 0);
}

#[test]
fn small_pool_queues_requests() {
    // 40 pages of 4 tokens: the largest request needs about 27, so at most
    // one or two run at a time and the rest wait their turn.
    let mut cfg = config(4, 40, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    cfg.scheduler.decode_reserve = 1.0;
    let requests = sixteen_requests();
    let mut engine = new_engine(cfg.clone());
    for r in &requests {
        engine.add_request(r.clone()).expect("valid request");
    }
    let mut max_waiting_while_running = 0;
    let mut finished = HashMap::new();
    while engine.has_work() {
        for event in engine.step().expect("step") {
            if let Some(f) = event.finished {
                finished.insert(f.id, GenerateOutput::from(f));
            }
        }
        let stats = engine.stats();
        if stats.num_running > 0 {
            max_waiting_while_running = max_waiting_while_running.max(stats.num_waiting);
        }
        engine.check_integrity();
    }
    assert!(max_waiting_while_running > 8, "requests queued for memory");
    assert_eq!(engine.stats().num_preempted, 0, "full reservation never preempts");
    let mut outputs: Vec<GenerateOutput> = finished.into_values().collect();
    outputs.sort_by_key(|o| o.id);
    assert_matches_oracle(&requests, &outputs);
    assert_pool_whole(&mut engine);
}

macro_rules! preemption_cases {
    ($($name:ident: $ps:expr, $pages:expr, $cache:expr, $policy:expr;)*) => {$(
        #[test]
        fn $name() {
            // No reservation for growth: everything is admitted at once and
            // decode runs out of pages.
            let mut cfg = config($ps, $pages, 256, $cache, $policy);
            cfg.scheduler.decode_reserve = 0.0;
            let requests = sixteen_requests();
            let mut engine = new_engine(cfg);
            let outputs = engine.generate(requests.clone()).expect("generate");
            assert!(engine.stats().num_preempted > 0, "{:?}", engine.stats());
            assert_matches_oracle(&requests, &outputs);
            assert_pool_whole(&mut engine);
        }
    )*};
}

preemption_cases! {
    preemption_radix: 4, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst;
    preemption_naive_mixed: 4, 64, CacheKind::Naive, SchedulePolicy::Mixed;
    preemption_page_size_1: 1, 120, CacheKind::Radix, SchedulePolicy::Mixed;
}

#[test]
fn max_running_requests_is_respected() {
    let mut cfg = config(4, 512, 256, CacheKind::Radix, SchedulePolicy::Mixed);
    cfg.scheduler.max_running_requests = 3;
    let requests = sixteen_requests();
    let mut engine = new_engine(cfg);
    for r in &requests {
        engine.add_request(r.clone()).expect("valid request");
    }
    drive(&mut engine, 3);
    assert!(engine.runner().max_batch_rows <= 3);
    assert_pool_whole(&mut engine);
}

#[test]
fn abort_frees_pages() {
    let mut engine = new_engine(config(4, 128, 16, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let long = |salt| GenerateRequest {
        prompt_ids: prompt(2, 0, 30, salt),
        params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(60) },
    };
    let a = engine.add_request(long(1)).expect("valid");
    let b = engine.add_request(long(2)).expect("valid");
    let c = engine.add_request(long(3)).expect("valid");
    // A mid-prefill (16 of 30 tokens), B and C still queued.
    engine.step().expect("step");
    assert!(engine.stats().used_pages > 0);
    assert!(engine.abort(a));
    assert!(!engine.abort(a), "a second abort finds nothing");
    assert_eq!(engine.stats().used_pages, 0);
    assert!(engine.abort(c));
    // B runs for a while, then is aborted mid-decode.
    for _ in 0..8 {
        engine.step().expect("step");
    }
    assert!(engine.stats().used_pages > 0);
    let done = engine.finish(b, FinishReason::Abort).expect("B is running");
    assert_eq!(done.reason, FinishReason::Abort);
    assert!(!done.output_ids.is_empty());
    assert!(!engine.has_work());
    assert!(engine.step().expect("idle step").is_empty());
    assert_pool_whole(&mut engine);
    assert!(!engine.abort(ReqId::new(999)));
}

#[test]
fn finish_from_outside_reports_its_reason() {
    // A stop string matched by the detokenizer ends a request with `Stop`.
    let mut engine = new_engine(config(4, 128, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let id = engine
        .add_request(GenerateRequest {
            prompt_ids: prompt(0, 3, 3, 0),
            params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(50) },
        })
        .expect("valid");
    let mut streamed = Vec::new();
    for _ in 0..4 {
        streamed.extend(engine.step().expect("step").into_iter().map(|e| e.token));
    }
    let done = engine.finish(id, FinishReason::Stop).expect("running");
    assert_eq!(done.reason, FinishReason::Stop);
    assert_eq!(done.output_ids, streamed);
    assert_pool_whole(&mut engine);
}

#[test]
fn invalid_requests_are_rejected_at_submission() {
    let mut engine = new_engine(config(4, 16, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let req = |prompt_ids: Vec<u32>, params| GenerateRequest { prompt_ids, params };
    let err = |r: Result<ReqId, EngineError>| r.expect_err("must be rejected");

    match err(engine.add_request(req(vec![], SamplingParams::greedy(4)))) {
        EngineError::InvalidRequest { field, .. } => assert_eq!(field, "prompt_ids"),
        e => panic!("unexpected {e}"),
    }
    match err(engine.add_request(req(vec![1, VOCAB as u32], SamplingParams::greedy(4)))) {
        EngineError::InvalidRequest { field, reason } => {
            assert_eq!(field, "prompt_ids");
            assert!(reason.contains("index 1"), "{reason}");
        }
        e => panic!("unexpected {e}"),
    }
    let bad_params = [
        ("max_tokens", SamplingParams::greedy(0)),
        ("temperature", SamplingParams { temperature: -1.0, ..SamplingParams::greedy(4) }),
        ("temperature", SamplingParams { temperature: f32::NAN, ..SamplingParams::greedy(4) }),
        ("top_k", SamplingParams { top_k: Some(0), ..SamplingParams::greedy(4) }),
        ("top_p", SamplingParams { top_p: 0.0, ..SamplingParams::greedy(4) }),
        ("top_p", SamplingParams { top_p: 1.5, ..SamplingParams::greedy(4) }),
        ("min_p", SamplingParams { min_p: -0.1, ..SamplingParams::greedy(4) }),
        (
            "repetition_penalty",
            SamplingParams { penalties: Penalties { repetition: 0.0, ..Penalties::NONE }, ..SamplingParams::greedy(4) },
        ),
        (
            "frequency_penalty",
            SamplingParams { penalties: Penalties { frequency: 2.5, ..Penalties::NONE }, ..SamplingParams::greedy(4) },
        ),
        (
            "presence_penalty",
            SamplingParams {
                penalties: Penalties { presence: f32::NAN, ..Penalties::NONE },
                ..SamplingParams::greedy(4)
            },
        ),
        ("top_logprobs", SamplingParams { logprobs: Some(21), ..SamplingParams::greedy(4) }),
    ];
    for (expected, params) in bad_params {
        match err(engine.add_request(req(vec![1, 2], params))) {
            EngineError::InvalidRequest { field, .. } => assert_eq!(field, expected),
            e => panic!("unexpected {e}"),
        }
    }

    // 64 KV slots: 60 + 5 tokens need 64 slots (the last output is never
    // fed) and fit; 60 + 6 do not.
    engine.add_request(req(vec![1; 60], SamplingParams::greedy(5))).expect("fits the pool exactly");
    match err(engine.add_request(req(vec![1; 60], SamplingParams::greedy(6)))) {
        e @ EngineError::TooLong { limit: LengthLimit::KvPool, .. } => {
            assert!(e.to_string().contains("KV cache pool"), "{e}");
        }
        e => panic!("unexpected {e}"),
    }
    let mut big = new_engine(config(4, 4096, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    match err(big.add_request(req(vec![1; MAX_CONTEXT], SamplingParams::greedy(1)))) {
        e @ EngineError::TooLong { limit: LengthLimit::Context, .. } => {
            assert!(e.to_string().contains("model context of 4096"), "{e}");
        }
        e => panic!("unexpected {e}"),
    }

    // A batch with one bad request queues none of them.
    let outcome =
        big.generate(vec![req(vec![1, 2], SamplingParams::greedy(3)), req(vec![], SamplingParams::greedy(3))]);
    assert!(outcome.is_err());
    assert!(!big.has_work());

    // The request that fitted the pool exactly runs to completion.
    let (_, finished, _) = drive(&mut engine, 16);
    assert_eq!(finished.len(), 1);
    assert_pool_whole(&mut engine);
}

#[test]
fn invalid_configs_are_rejected() {
    let good = config(4, 16, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    type Edit = fn(&mut EngineConfig);
    let cases: [(&str, Edit); 6] = [
        ("page_size", |c| c.scheduler.page_size = 0),
        ("num_pages", |c| c.scheduler.num_pages = 0),
        ("max_prefill_length", |c| c.scheduler.max_prefill_length = 0),
        ("max_running_requests", |c| c.scheduler.max_running_requests = 0),
        ("decode_reserve", |c| c.scheduler.decode_reserve = 1.5),
        ("eos_token_ids", |c| c.scheduler.eos_token_ids = vec![VOCAB as u32]),
    ];
    for (expected, edit) in cases {
        let mut cfg = good.clone();
        edit(&mut cfg);
        match Engine::new(FakeLm::new(&good), cfg) {
            Err(EngineError::Config { field, .. }) => assert_eq!(field, expected),
            other => panic!("{expected}: unexpected {:?}", other.map(|_| ())),
        }
    }
}

/// A runner that fails, or returns logits of the wrong shape.
#[derive(Debug)]
struct BrokenLm {
    wrong_shape: bool,
}

impl ModelRunner for BrokenLm {
    fn forward(&mut self, b: &PreparedBatch) -> Result<Logits, RunnerError> {
        if self.wrong_shape {
            Ok(Logits::new(vec![0.0; (b.logits_rows().len() + 1) * VOCAB], VOCAB))
        } else {
            Err("device lost".into())
        }
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn max_context_len(&self) -> usize {
        MAX_CONTEXT
    }
}

#[test]
fn runner_errors_surface_and_leave_a_consistent_engine() {
    for wrong_shape in [false, true] {
        let cfg = config(4, 64, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
        let mut engine = Engine::new(BrokenLm { wrong_shape }, cfg).expect("valid config");
        let req = GenerateRequest { prompt_ids: vec![1, 2, 3, 4, 5], params: SamplingParams::greedy(3) };
        let err = engine.generate(vec![req.clone()]).expect_err("runner is broken");
        match (wrong_shape, &err) {
            (false, EngineError::Runner(source)) => assert_eq!(source.to_string(), "device lost"),
            (true, EngineError::LogitsShape { rows: 1, got_rows: 2, .. }) => {}
            _ => panic!("unexpected {err}"),
        }
        // generate aborted its requests: nothing is left holding pages.
        assert!(!engine.has_work());
        engine.check_integrity();
        assert_eq!(engine.stats().used_pages, 0);

        // Step-wise, a failed step can be retried and the request aborted.
        let id = engine.add_request(req).expect("valid");
        assert!(engine.step().is_err());
        assert!(engine.step().is_err());
        engine.check_integrity();
        assert!(engine.abort(id));
        assert_eq!(engine.stats().used_pages, 0);
    }
}

#[test]
fn generate_needs_an_idle_engine() {
    let mut engine = new_engine(config(4, 64, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let req = GenerateRequest { prompt_ids: vec![1, 2, 3], params: SamplingParams::greedy(3) };
    let id = engine.add_request(req.clone()).expect("valid");
    assert!(matches!(engine.generate(vec![req]), Err(EngineError::Busy { num_requests: 1 })));
    assert!(engine.abort(id));
}

#[test]
fn penalties_and_logprobs_take_the_host_path_next_to_device_sampling() {
    let engine = check_together_on(config(4, 512, 256, CacheKind::Radix, SchedulePolicy::Mixed), true);
    assert!(engine.runner().host_forwards > 0);
}

/// Penalties and log probabilities on a "device" that does them, without
/// overlap, and with slots handed out again: more penalised requests over
/// time than run at once, in a pool small enough to preempt.
#[test]
fn penalties_and_logprobs_on_the_device_equal_the_host_path() {
    for (pages, max_running) in [(512, 64), (64, 2)] {
        let mut cfg = config(4, pages, 256, CacheKind::Radix, SchedulePolicy::Mixed);
        cfg.scheduler.max_running_requests = max_running;
        let requests = sixteen_requests();
        let mut engine = new_engine(cfg);
        engine.runner_mut().device_sampling = true;
        engine.runner_mut().device_extras = true;
        let ids: Vec<ReqId> = requests.iter().map(|r| engine.add_request(r.clone()).expect("valid")).collect();
        let (_, finished, logprobs) = drive(&mut engine, max_running);
        let outputs: Vec<GenerateOutput> = ids.iter().map(|id| finished[id].clone()).collect();
        assert_matches_oracle(&requests, &outputs);
        for (i, id) in ids.iter().enumerate() {
            let want = oracle_with_logprobs(&requests[i]).2;
            assert_eq!(logprobs.get(id).cloned().unwrap_or_default(), want, "log probabilities of request {i}");
        }
        assert_pool_whole(&mut engine);
        // Not one step went to the host path: the penalised requests and those
        // reporting log probabilities did not take their batches there.
        assert_eq!(engine.runner().host_forwards, 0);
        let penalised = requests.iter().filter(|r| !r.params.penalties.is_neutral()).count();
        let slots = engine.runner().counts.as_ref().map_or(0, |c| c.dim(0));
        assert!(penalised > 0 && slots > 0, "no request had penalties");
        if max_running < penalised {
            assert!(slots <= max_running, "{slots} slots for at most {max_running} running requests");
        }
    }
}

#[test]
fn penalties_change_what_is_sampled() {
    // Greedy with a strong repetition penalty never picks a token twice when
    // a fresh one has a positive logit: the oracle checks the arithmetic, this
    // checks that the penalty is applied at all.
    let plain = GenerateRequest {
        prompt_ids: prompt(1, 0, 6, 3),
        params: SamplingParams { ignore_eos: true, seed: Some(1), ..SamplingParams::greedy(30) },
    };
    let mut penalised = plain.clone();
    penalised.params.penalties = Penalties { frequency: 2.0, presence: 2.0, ..Penalties::NONE };
    let mut engine = new_engine(config(4, 512, 256, CacheKind::Radix, SchedulePolicy::Mixed));
    let out = engine.generate(vec![plain.clone(), penalised.clone()]).expect("generate");
    assert_matches_oracle(&[plain, penalised], &out);
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::HashSet<_>>().len();
    assert!(
        distinct(&out[1].output_ids) > distinct(&out[0].output_ids),
        "penalised output {:?} repeats as much as {:?}",
        out[1].output_ids,
        out[0].output_ids
    );
}

#[test]
fn unseeded_requests_still_run() {
    let mut engine = new_engine(config(4, 64, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst));
    let params = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(5) };
    let out = engine.generate(vec![GenerateRequest { prompt_ids: vec![1, 2, 3], params }]).expect("generate");
    assert!(!out[0].output_ids.is_empty() && out[0].output_ids.len() <= 5);
    assert_pool_whole(&mut engine);
}

#[test]
fn boxed_runner_chosen_at_run_time() {
    let cfg = config(4, 64, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    let runner: Box<dyn ModelRunner> = Box::new(FakeLm::new(&cfg));
    let mut engine = Engine::new(runner, cfg).expect("valid config");
    let req = GenerateRequest { prompt_ids: vec![1, 2, 3], params: SamplingParams::random(6, 0.9, 4) };
    let out = engine.generate(vec![req.clone()]).expect("generate");
    assert_matches_oracle(&[req], &out);
}

// ---------------------------------------------------------------------------
// Overlap scheduling: step n+1 is launched before step n's tokens are known.

/// Requests that need nothing of the host (no penalties, no log
/// probabilities), so that every step of a device-sampling runner is launched
/// behind the one in flight; stop ids, EOS, `ignore_eos` and prefix sharing
/// included.
fn device_requests() -> Vec<GenerateRequest> {
    sixteen_requests()
        .into_iter()
        .map(|mut r| {
            r.params.penalties = Penalties::NONE;
            r.params.logprobs = None;
            r
        })
        .collect()
}

/// Runs `requests` with overlap on, checks them against the oracle (what the
/// non-overlapped engine produces: every other test checks that), the stream
/// against the reports, the fake device's page records, and the pool.
fn check_overlapped(cfg: EngineConfig, requests: &[GenerateRequest], device_sampling: bool) -> Engine<FakeLm> {
    check_overlapped_on(cfg, requests, device_sampling, false)
}

/// [`check_overlapped`] on a "device" that applies penalties and computes log
/// probabilities itself: no step waits for the one in flight.
fn check_overlapped_extras(cfg: EngineConfig, requests: &[GenerateRequest]) -> Engine<FakeLm> {
    let engine = check_overlapped_on(cfg, requests, true, true);
    assert_eq!(engine.runner().host_forwards, 0, "a step took the host path");
    engine
}

fn check_overlapped_on(
    cfg: EngineConfig,
    requests: &[GenerateRequest],
    device_sampling: bool,
    device_extras: bool,
) -> Engine<FakeLm> {
    let max_running = cfg.scheduler.max_running_requests;
    let mut engine = new_engine(cfg);
    engine.runner_mut().device_sampling = device_sampling;
    engine.runner_mut().device_extras = device_extras;
    engine.set_overlap(true).expect("idle");
    let ids: Vec<ReqId> = requests.iter().map(|r| engine.add_request(r.clone()).expect("valid request")).collect();
    let (streamed, finished, logprobs) = drive(&mut engine, max_running);
    let outputs: Vec<GenerateOutput> = ids.iter().map(|id| finished[id].clone()).collect();
    assert_matches_oracle(requests, &outputs);
    for (i, (id, out)) in ids.iter().zip(&outputs).enumerate() {
        assert_eq!(streamed[id], out.output_ids, "streamed tokens of {id}");
        let want = oracle_with_logprobs(&requests[i]).2;
        assert_eq!(logprobs.get(id).cloned().unwrap_or_default(), want, "log probabilities of request {i}");
    }
    assert!(engine.runner().page_violations.is_empty(), "{:?}", engine.runner().page_violations);
    assert_pool_whole(&mut engine);
    engine
}

macro_rules! overlap_cases {
    ($($name:ident: $ps:expr, $pages:expr, $prefill:expr, $cache:expr, $policy:expr, $reserve:expr;)*) => {$(
        #[test]
        fn $name() {
            let mut cfg = config($ps, $pages, $prefill, $cache, $policy);
            cfg.scheduler.decode_reserve = $reserve;
            // On the "device": every step launched behind the one in flight.
            let engine = check_overlapped(cfg.clone(), &device_requests(), true);
            assert!(engine.stats().num_steps > 0);
            // With penalties and log probabilities: those steps wait for the
            // one in flight and sample on the host...
            check_overlapped(cfg.clone(), &sixteen_requests(), true);
            // ...or, on a "device" that does them, are launched behind it too.
            check_overlapped_extras(cfg.clone(), &sixteen_requests());
            // A host-sampling runner (the CPU path), overlapped all the same.
            check_overlapped(cfg, &sixteen_requests(), false);
        }
    )*};
}

overlap_cases! {
    overlap_radix_prefill_first: 4, 512, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst, 1.0;
    overlap_radix_mixed: 4, 512, 256, CacheKind::Radix, SchedulePolicy::Mixed, 1.0;
    overlap_naive_mixed: 4, 512, 256, CacheKind::Naive, SchedulePolicy::Mixed, 1.0;
    overlap_page_size_1: 1, 2048, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst, 1.0;
    overlap_chunked_8_page_16: 16, 128, 8, CacheKind::Radix, SchedulePolicy::PrefillFirst, 1.0;
    overlap_chunked_1_page_3_mixed: 3, 700, 1, CacheKind::Radix, SchedulePolicy::Mixed, 1.0;
    // Small pools: pages are released and handed out again all the time,
    // requests are preempted (after the step in flight is resolved).
    overlap_small_pool_radix: 4, 64, 256, CacheKind::Radix, SchedulePolicy::PrefillFirst, 0.0;
    overlap_small_pool_naive_mixed: 4, 64, 256, CacheKind::Naive, SchedulePolicy::Mixed, 0.0;
    overlap_small_pool_page_size_1: 1, 120, 256, CacheKind::Radix, SchedulePolicy::Mixed, 0.0;
}

#[test]
fn overlap_generate_equals_the_non_overlapped_engine() {
    let requests = device_requests();
    let cfg = config(4, 96, 16, CacheKind::Radix, SchedulePolicy::Mixed);
    let run = |overlap: bool, device_sampling: bool| {
        let mut engine = new_engine(cfg.clone());
        engine.runner_mut().device_sampling = device_sampling;
        engine.set_overlap(overlap).expect("idle");
        let out = engine.generate(requests.clone()).expect("generate");
        assert!(engine.runner().page_violations.is_empty(), "{:?}", engine.runner().page_violations);
        assert_pool_whole(&mut engine);
        // generate leaves nothing in flight: the engine takes the next batch.
        assert!(!engine.has_work());
        out
    };
    let plain = run(false, true);
    assert_eq!(run(true, true), plain);
    assert_eq!(run(true, false), plain);
}

/// Aborts and stop strings (`finish` from outside) while a step is in flight:
/// the report has the tokens streamed so far, the token the step in flight
/// samples for the request is never streamed, its pages come back once that
/// step is resolved, and the other requests' outputs are untouched. The same
/// script run without overlap gives the same reports.
#[test]
fn overlap_finish_from_outside_while_a_step_is_in_flight() {
    let requests = device_requests();
    let script = |overlap: bool| {
        let cfg = config(4, 96, 16, CacheKind::Radix, SchedulePolicy::Mixed);
        let mut engine = new_engine(cfg);
        engine.runner_mut().device_sampling = true;
        engine.set_overlap(overlap).expect("idle");
        let ids: Vec<ReqId> = requests.iter().map(|r| engine.add_request(r.clone()).expect("valid")).collect();
        let mut streamed: HashMap<ReqId, Vec<u32>> = HashMap::new();
        let mut reports: HashMap<ReqId, GenerateOutput> = HashMap::new();
        let mut guard = 0;
        while engine.has_work() {
            for event in engine.step().expect("step") {
                assert!(!reports.contains_key(&event.id), "a token of {} after its end", event.id);
                streamed.entry(event.id).or_default().push(event.token);
                if let Some(f) = event.finished {
                    reports.insert(f.id, GenerateOutput::from(f));
                }
            }
            // After its third token, request 4 is aborted; after its fourth,
            // request 8 is stopped (as by a stop string).
            for (which, after, reason) in [(4, 3, FinishReason::Abort), (8, 4, FinishReason::Stop)] {
                let id = ids[which];
                if !reports.contains_key(&id) && streamed.get(&id).is_some_and(|s| s.len() >= after) {
                    let done = engine.finish(id, reason).expect("still running");
                    assert_eq!(done.output_ids, streamed[&id], "the report has what was streamed");
                    reports.insert(id, GenerateOutput::from(done));
                }
            }
            engine.check_integrity();
            guard += 1;
            assert!(guard < 10_000);
        }
        assert!(engine.runner().page_violations.is_empty(), "{:?}", engine.runner().page_violations);
        assert_pool_whole(&mut engine);
        let out: Vec<GenerateOutput> = ids.iter().map(|id| reports[id].clone()).collect();
        for (i, o) in out.iter().enumerate() {
            if i != 4 && i != 8 {
                assert_eq!(o.output_ids, oracle(&requests[i]).0, "request {i}");
            }
        }
        assert_eq!((out[4].output_ids.len(), out[4].finish_reason), (3, FinishReason::Abort));
        assert_eq!((out[8].output_ids.len(), out[8].finish_reason), (4, FinishReason::Stop));
        out
    };
    assert_eq!(script(true), script(false));
}

/// A runner whose device fails under a launched step: the error surfaces, the
/// step's requests end, and nothing is left holding pages.
#[test]
fn overlap_device_failure_leaves_a_consistent_engine() {
    let cfg = config(4, 64, 64, CacheKind::Radix, SchedulePolicy::PrefillFirst);
    let mut engine = new_engine(cfg);
    engine.runner_mut().device_sampling = true;
    engine.set_overlap(true).expect("idle");
    let req = GenerateRequest { prompt_ids: vec![1, 2, 3], params: SamplingParams::greedy(30) };
    let id = engine
        .add_request(GenerateRequest { params: SamplingParams { ignore_eos: true, ..req.params.clone() }, ..req })
        .expect("valid");
    engine.step().expect("step");
    engine.step().expect("step");
    engine.runner_mut().launched.clear();
    assert!(engine.step().is_err(), "the lost ids surface as an error");
    // What the server's engine loop does on an error: abort what is in flight.
    engine.abort(id);
    let mut guard = 0;
    while engine.has_work() {
        let _ = engine.step();
        guard += 1;
        assert!(guard < 10, "the engine does not settle after a failure");
    }
    assert!(!engine.abort(id));
    engine.check_integrity();
    assert_eq!(engine.stats().used_pages, 0);
}
