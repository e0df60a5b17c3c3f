//! The engine's library API: submit token-id requests, step the scheduler
//! and the model, get tokens back.
//!
//! [`Engine`] ties a [`Scheduler`] (requests, KV pages, prefix cache) to a
//! [`ModelRunner`] (the forward pass) and the sampler. Two ways to drive it:
//!
//! - [`Engine::generate`]: blocking, runs a set of requests to completion
//!   (offline generation, benchmarks, tests);
//! - [`Engine::add_request`] / [`Engine::step`] / [`Engine::abort`]: the
//!   step-wise interface a server loop uses to stream tokens as they come.
//!
//! Everything here works on token ids; text, chat templates and stop
//! strings belong to the layers above, which end a request early with
//! [`Engine::finish`].
//!
//! A request may carry a [`Grammar`] ([`Engine::set_grammar`], constrained
//! decoding): each step that samples for it first computes its token mask
//! ([`Engine::token_masks`]) and afterwards feeds it the sampled token
//! ([`Engine::advance_grammars`]). With no grammar in flight neither runs.
//!
//! User input is validated once, in [`Engine::add_request`] (and
//! [`Engine::new`] for the configuration): bad input is an [`EngineError`],
//! never a panic, and nothing below this point re-checks it.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use kernel_runtime::ops::PenaltyRow;
use rayon::prelude::*;

use crate::core::grammar::{apply_token_mask, Grammar, TokenMasks};
use crate::core::req::{FinishReason, FinishedReq, PendingReq, PreparedBatch, ReqId, SamplingParams, TokenEvent};
use crate::core::sampling::extras::{SlotSetup, StepExtras};
use crate::core::sampling::logprobs::{token_logprobs, TokenLogprobs};
use crate::core::sampling::penalty_slots::PenaltySlots;
use crate::core::sampling::{self, Logits};
use crate::core::scheduler::{LaunchedStep, Scheduled, Scheduler, SchedulerConfig};

/// The most alternatives a request may ask log probabilities of (OpenAI's
/// limit for `top_logprobs`; vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Whatever went wrong inside a model runner.
pub type RunnerError = Box<dyn std::error::Error + Send + Sync>;

/// What the engine needs from a model: one forward pass over a prepared
/// step. The runner owns the weights and the KV cache tensors, which must
/// have the geometry of the engine's pool (`num_pages` pages of `page_size`
/// tokens, per layer); it keeps no per-request state.
///
/// Two ways to run a step:
///
/// - [`ModelRunner::forward`]: the logits on the host, sampled by the engine
///   (the CPU path, and any step that needs host logits: penalties, log
///   probabilities);
/// - [`ModelRunner::launch`] then [`ModelRunner::wait`]: the runner samples
///   on its own device, keeps the ids there and hands them back later. With
///   overlap scheduling the engine launches step n+1 before it waits for step
///   n, so `launch` must not wait for the device (a CPU runner may do all the
///   work in `launch` and return the ids from `wait`).
pub trait ModelRunner {
    /// Runs the step: writes the KV of every fed token at its `out_loc`
    /// slot, attends through the page table, and returns the logits of the
    /// last token of each row in `batch.logits_rows()`, in that order
    /// (`[logits_rows.len(), vocab_size]`, f32, on the host). The engine
    /// resolves `batch.deferred()` before calling it (it is empty).
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError>;

    /// Width of the logits (token ids are `0..vocab_size`).
    fn vocab_size(&self) -> usize;

    /// Longest sequence (prompt plus outputs) the model supports.
    fn max_context_len(&self) -> usize;

    /// Enqueues the step and its sampling on the runner's own device: one
    /// token per entry of `batch.logits_rows()`, drawn by the rules of
    /// [`sampling`](crate::core::sampling) with the uniform numbers of
    /// [`sampling::uniform`] (so that seeds reproduce). The ids stay on the
    /// device: the tokens of `batch.deferred()` are the ids sampled by the
    /// step launched just before this one, which its `wait` may not have
    /// returned yet. At most two steps are launched and not waited for.
    ///
    /// `false` (the default) means "this runner samples on the host": nothing
    /// was done, and the engine calls [`ModelRunner::forward`] instead.
    fn launch(&mut self, _batch: &PreparedBatch) -> Result<bool, RunnerError> {
        Ok(false)
    }

    /// Waits for the oldest launched step not waited for yet and returns its
    /// sampled ids, in the order of its `logits_rows`, with the log
    /// probabilities of its `extras().logprobs` rows.
    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        Err("no step was launched on the device".into())
    }

    /// Whether [`ModelRunner::launch`] also applies penalties and computes log
    /// probabilities on the device ([`PreparedBatch::extras`]); `false` (the
    /// default) sends steps that need them to [`ModelRunner::forward`].
    fn samples_extras(&self) -> bool {
        false
    }

    /// [`ModelRunner::launch`] for a step with constrained rows: once the
    /// forward pass is under way, `masks` computes the step's token masks (host
    /// work the device overlaps), and the logits of their rows are set to -inf
    /// where the mask disallows the token before sampling. `false` (the default,
    /// `masks` not called) means "call [`ModelRunner::forward`]"; the engine then
    /// masks on the host.
    fn launch_masked(
        &mut self,
        _batch: &PreparedBatch,
        _masks: &mut dyn FnMut() -> Option<TokenMasks>,
    ) -> Result<bool, RunnerError> {
        Ok(false)
    }
}

/// Lets a server pick its model at run time (`Engine<Box<dyn ModelRunner>>`).
impl<R: ModelRunner + ?Sized> ModelRunner for Box<R> {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        (**self).forward(batch)
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn max_context_len(&self) -> usize {
        (**self).max_context_len()
    }

    fn launch(&mut self, batch: &PreparedBatch) -> Result<bool, RunnerError> {
        (**self).launch(batch)
    }

    fn launch_masked(
        &mut self,
        batch: &PreparedBatch,
        masks: &mut dyn FnMut() -> Option<TokenMasks>,
    ) -> Result<bool, RunnerError> {
        (**self).launch_masked(batch, masks)
    }

    fn wait(&mut self) -> Result<SampledStep, RunnerError> {
        (**self).wait()
    }

    fn samples_extras(&self) -> bool {
        (**self).samples_extras()
    }
}

/// What a launched step sampled on the runner's device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledStep {
    /// One token per sampling row.
    pub tokens: Vec<u32>,
    /// `(sampling row, log probabilities)` of the step's `extras().logprobs`
    /// rows, in that order.
    pub logprobs: Vec<(u32, TokenLogprobs)>,
}

impl From<Vec<u32>> for SampledStep {
    fn from(tokens: Vec<u32>) -> Self {
        SampledStep { tokens, logprobs: Vec::new() }
    }
}

/// Whether `MINISGL_DISABLE_OVERLAP=1` asks for steps that wait for the GPU.
pub fn overlap_disabled_by_env() -> bool {
    std::env::var("MINISGL_DISABLE_OVERLAP").is_ok_and(|v| v == "1")
}

/// Engine knobs. No `Default`: the command line (or the test) decides.
///
/// Today they are the scheduler's knobs (page size and count, prefill chunk,
/// running limit, prefix cache, policy, decode reserve, end-of-sequence ids),
/// checked by [`Engine::new`] before the scheduler asserts them.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
}

/// One request for [`Engine::generate`] / [`Engine::add_request`].
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
}

/// The result of one request of [`Engine::generate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerateOutput {
    pub id: ReqId,
    pub output_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

impl From<FinishedReq> for GenerateOutput {
    fn from(f: FinishedReq) -> Self {
        Self {
            id: f.id,
            output_ids: f.output_ids,
            finish_reason: f.reason,
            prompt_tokens: f.prompt_len,
            cached_tokens: f.cached_tokens,
        }
    }
}

/// A snapshot of the engine's load, for logs and `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub num_waiting: usize,
    /// Requests admitted (prefilling or decoding).
    pub num_running: usize,
    pub num_pages: usize,
    /// Pages held by running requests (owned or locked in the cache).
    pub used_pages: usize,
    /// Pages in the free list.
    pub free_pages: usize,
    /// Pages held by the prefix cache (locked or not).
    pub cached_pages: usize,
    /// Cached pages no request uses, reclaimable on demand.
    pub evictable_pages: usize,
    /// Prompt tokens served from the prefix cache since start.
    pub cache_hit_tokens: u64,
    pub num_steps: u64,
    pub num_preempted: u64,
    pub num_finished: u64,
    /// Wall time inside the model runner since start (the forward pass and
    /// sampling, waiting for the GPU's token ids).
    pub forward_time: Duration,
    /// Wall time of the rest of the steps (scheduling, preparing, completing).
    pub host_time: Duration,
    /// Rows (requests) of the last step.
    pub last_step_rows: usize,
    /// Tokens of the last step (more than its rows when it prefilled).
    pub last_step_tokens: usize,
}

/// Which limit a request exceeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthLimit {
    /// The model's maximum context length.
    Context,
    /// The whole KV page pool: the request could never fit, even alone.
    KvPool,
}

impl fmt::Display for LengthLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LengthLimit::Context => "model context",
            LengthLimit::KvPool => "KV cache pool",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid engine config: `{field}` {reason}")]
    Config { field: &'static str, reason: String },
    #[error("invalid request: `{field}` {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    #[error("request too long: {prompt_len} prompt tokens + max_tokens {max_tokens} exceed the {limit} of {limit_tokens} tokens")]
    TooLong { prompt_len: usize, max_tokens: usize, limit: LengthLimit, limit_tokens: usize },
    #[error("generate needs an idle engine, {num_requests} requests are in flight")]
    Busy { num_requests: usize },
    #[error("model runner returned logits of shape [{got_rows}, {got_vocab}], expected [{rows}, {vocab}]")]
    LogitsShape { rows: usize, vocab: usize, got_rows: usize, got_vocab: usize },
    #[error("model runner failed")]
    Runner(#[source] RunnerError),
}

/// Tokens sampled on the host, with the log probabilities of the rows that
/// asked for them.
type HostSamples = (Vec<u32>, Vec<(ReqId, Option<TokenLogprobs>)>);

/// A step handed to the runner, not resolved yet.
#[derive(Debug)]
struct InFlight {
    launched: LaunchedStep,
    /// The requests of the step's sampled rows, in row order, when any had a
    /// grammar (their grammars advance with the tokens).
    grammar_rows: Option<Vec<ReqId>>,
    /// Tokens and log probabilities of a step sampled on the host (known at
    /// launch); `None`: the runner's `wait` returns the tokens.
    host: Option<HostSamples>,
    /// The requests of the rows whose log probabilities the device computes,
    /// in the order of `PreparedBatch::extras().logprobs`.
    device_logprobs: Vec<ReqId>,
}

/// The serving core: scheduler, prefix cache, model runner and sampler.
pub struct Engine<R> {
    runner: R,
    scheduler: Scheduler,
    /// Overlap scheduling: launch step n+1 before waiting for step n.
    overlap: bool,
    /// The launched step the next [`Engine::step`] resolves (overlap only).
    in_flight: Option<InFlight>,
    /// The last step whose tokens are known on the host, and those tokens:
    /// what a later step's deferred tokens are filled from when it runs on
    /// the host path.
    host_tokens: Option<(u64, Vec<u32>)>,
    vocab_size: usize,
    max_context_len: usize,
    next_id: u64,
    num_steps: u64,
    forward_time: Duration,
    host_time: Duration,
    last_step_rows: usize,
    last_step_tokens: usize,
    /// The grammars of the requests in flight that have one.
    grammars: HashMap<ReqId, Grammar>,
    /// The penalty slots of requests with penalties, on a runner that applies
    /// them on its device.
    penalty_slots: PenaltySlots,
}

impl<R: fmt::Debug> fmt::Debug for Engine<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("runner", &self.runner)
            .field("scheduler", &self.scheduler)
            .finish_non_exhaustive()
    }
}

impl<R: ModelRunner> Engine<R> {
    pub fn new(runner: R, config: EngineConfig) -> Result<Self, EngineError> {
        let config = config.scheduler;
        let vocab_size = runner.vocab_size();
        let max_context_len = runner.max_context_len();
        let bad = |field, reason: &str| Err(EngineError::Config { field, reason: reason.to_owned() });
        if config.page_size == 0 {
            return bad("page_size", "must be at least 1");
        }
        if config.num_pages == 0 {
            return bad("num_pages", "must be at least 1");
        }
        if config.num_pages.checked_mul(config.page_size).is_none_or(|slots| slots > u32::MAX as usize) {
            return bad("num_pages", "times page_size must fit in 32-bit KV slot indices");
        }
        if config.max_prefill_length == 0 {
            return bad("max_prefill_length", "must be at least 1");
        }
        if config.max_running_requests == 0 {
            return bad("max_running_requests", "must be at least 1");
        }
        if !(0.0..=1.0).contains(&config.decode_reserve) {
            return bad("decode_reserve", "must be between 0 and 1");
        }
        if vocab_size == 0 || vocab_size > u32::MAX as usize {
            return bad("vocab_size", "of the model runner must be in 1..=u32::MAX");
        }
        if let Some(&t) = config.eos_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(EngineError::Config {
                field: "eos_token_ids",
                reason: format!("token {t} is outside the vocabulary of {vocab_size}"),
            });
        }
        let scheduler = Scheduler::new(config);
        Ok(Self {
            runner,
            scheduler,
            overlap: false,
            in_flight: None,
            host_tokens: None,
            vocab_size,
            max_context_len,
            next_id: 0,
            num_steps: 0,
            forward_time: Duration::ZERO,
            host_time: Duration::ZERO,
            last_step_rows: 0,
            last_step_tokens: 0,
            grammars: HashMap::new(),
            penalty_slots: PenaltySlots::default(),
        })
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// Turns overlap scheduling on or off (off by default; the command line
    /// turns it on unless `--disable-overlap` or `MINISGL_DISABLE_OVERLAP=1`).
    /// With overlap, [`Self::step`] launches the next step before it waits for
    /// the one in flight, and returns the tokens of that one: one step behind.
    /// Turning it off resolves the step in flight first.
    pub fn set_overlap(&mut self, overlap: bool) -> Result<Vec<TokenEvent>, EngineError> {
        let events = if overlap { Vec::new() } else { self.drain()? };
        self.overlap = overlap;
        Ok(events)
    }

    /// `(rows, tokens)` of the step launched last (cheaper than [`Engine::stats`]).
    pub fn last_step_shape(&self) -> (usize, usize) {
        (self.last_step_rows, self.last_step_tokens)
    }

    /// Whether overlap scheduling is on.
    pub fn overlap(&self) -> bool {
        self.overlap
    }

    /// Resolves the step in flight, if any, and returns its tokens.
    pub fn drain(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        match self.in_flight.take() {
            Some(f) => self.resolve(f),
            None => Ok(Vec::new()),
        }
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Validates and queues a request; its tokens come out of [`Self::step`].
    pub fn add_request(&mut self, req: GenerateRequest) -> Result<ReqId, EngineError> {
        self.validate(&req)?;
        let id = ReqId::new(self.next_id);
        self.next_id += 1;
        let seed = req.params.seed.unwrap_or_else(rand::random);
        self.scheduler.add(PendingReq::new(id, req.prompt_ids, req.params, seed));
        Ok(id)
    }

    /// Runs one step: schedule, forward, sample, advance. Returns the tokens
    /// it produced (none when idle); with overlap, the tokens of the step
    /// launched by the previous call, while the one launched now runs. On a
    /// runner error at launch nothing advances and the requests keep their
    /// state, so the step can be retried or the requests aborted; a step that
    /// fails on the device ends its requests (aborted, not reported).
    pub fn step(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        let started = Instant::now();
        let forward_before = self.forward_time;
        let result = if self.overlap { self.step_overlapped() } else { self.step_sync() };
        let runner_time = self.forward_time - forward_before;
        self.host_time += started.elapsed().saturating_sub(runner_time);
        result
    }

    fn step_sync(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        let events = self.drain()?;
        if !events.is_empty() {
            return Ok(events);
        }
        let Some(batch) = self.scheduler.schedule().batch() else {
            return Ok(Vec::new());
        };
        let prepared = self.scheduler.prepare(batch);
        let launched = self.launch(prepared)?;
        self.resolve(launched)
    }

    /// One overlapped step: the step in flight (launched by the previous call,
    /// or now when there is none) runs on the device while the host schedules,
    /// prepares and launches the next one behind it; then the step in flight is
    /// resolved and the new one stays in flight.
    fn step_overlapped(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        let in_flight = match self.in_flight.take() {
            Some(f) => f,
            None => match self.scheduler.schedule() {
                Scheduled::Batch(batch) => {
                    let prepared = self.scheduler.prepare(batch);
                    self.launch(prepared)?
                }
                Scheduled::Idle | Scheduled::WaitForInFlight => return Ok(Vec::new()),
            },
        };
        let batch = match self.scheduler.schedule() {
            Scheduled::Batch(batch) => batch,
            // Nothing else to run, or the next step needs what the one in
            // flight holds: resolve it first.
            Scheduled::Idle | Scheduled::WaitForInFlight => return self.resolve(in_flight),
        };
        let prepared = self.scheduler.prepare(batch);
        if self.on_host_path(&prepared) || !self.grammars.is_empty() {
            // On the host path penalties and log probabilities are computed from
            // the request's known tokens, and a grammar's mask needs the token the
            // step in flight samples: such a step waits for the one in flight, and
            // runs at once.
            let events = self.resolve(in_flight)?;
            self.in_flight = Some(self.launch(prepared)?);
            return Ok(events);
        }
        let next = match self.launch(prepared) {
            Ok(next) => next,
            Err(err) => {
                self.in_flight = Some(in_flight);
                return Err(err);
            }
        };
        match self.resolve(in_flight) {
            Ok(events) => {
                self.in_flight = Some(next);
                Ok(events)
            }
            Err(err) => {
                // The device failed under the step in flight: the one behind it
                // cannot be trusted either.
                if next.host.is_none() {
                    let _ = self.runner.wait();
                }
                self.fail_step(next.launched);
                Err(err)
            }
        }
    }

    /// Hands a prepared step to the runner: sampled on its device when it can
    /// and the step needs no host logits, else forward and sampled on the host
    /// at once. Then advances the scheduler past it.
    fn launch(&mut self, mut prepared: PreparedBatch) -> Result<InFlight, EngineError> {
        if !prepared.deferred().is_empty() {
            if let Some((step, tokens)) = &self.host_tokens {
                if *step == prepared.deferred_step {
                    prepared.resolve_deferred(tokens);
                }
            }
        }
        let rows = prepared.logits_rows().len();
        self.last_step_rows = prepared.num_rows();
        self.last_step_tokens = prepared.num_tokens();
        let runner_start = Instant::now();
        // Only requests with a grammar pay for constrained decoding; the engine
        // resolves the step before (`step_overlapped`), so their grammars have
        // seen every token they sampled. On a device the masks are computed
        // while the forward pass runs.
        let constrained = !self.grammars.is_empty();
        let device_logprobs = if prepared.needs_host_logits() && self.runner.samples_extras() {
            self.attach_extras(&mut prepared)
        } else {
            Vec::new()
        };
        let on_device = if self.on_host_path(&prepared) {
            Ok(false)
        } else if constrained {
            let (grammars, vocab_size) = (&mut self.grammars, self.vocab_size);
            let mut masks = || step_token_masks(grammars, vocab_size, &prepared);
            self.runner.launch_masked(&prepared, &mut masks).map_err(EngineError::Runner)
        } else {
            self.runner.launch(&prepared).map_err(EngineError::Runner)
        };
        let on_device = match on_device {
            Ok(d) => d,
            Err(err) => {
                self.forward_time += runner_start.elapsed();
                return Err(err);
            }
        };
        let host = if on_device {
            self.forward_time += runner_start.elapsed();
            None
        } else {
            if !prepared.deferred().is_empty() {
                self.forward_time += runner_start.elapsed();
                return Err(EngineError::Runner(
                    "a step on the host path feeds tokens the previous step sampled on the device".into(),
                ));
            }
            let logits = self.runner.forward(&prepared).map_err(EngineError::Runner);
            self.forward_time += runner_start.elapsed();
            let logits = logits?;
            if logits.num_rows() != rows || logits.vocab_size() != self.vocab_size {
                return Err(EngineError::LogitsShape {
                    rows,
                    vocab: self.vocab_size,
                    got_rows: logits.num_rows(),
                    got_vocab: logits.vocab_size(),
                });
            }
            let masks = if constrained { self.token_masks(&prepared) } else { None };
            Some(self.sample_on_host(&prepared, logits, masks.as_ref()))
        };
        let launched = self.scheduler.launch(&prepared);
        if let Some((tokens, _)) = &host {
            self.host_tokens = Some((launched.step(), tokens.clone()));
        }
        let grammar_rows = constrained.then(|| prepared.sampling_req_ids().collect());
        Ok(InFlight { launched, grammar_rows, host, device_logprobs })
    }

    /// Whether the step samples on the host: it needs penalties or log
    /// probabilities and the runner cannot do them on its device.
    fn on_host_path(&self, prepared: &PreparedBatch) -> bool {
        prepared.needs_host_logits() && !self.runner.samples_extras()
    }

    /// Fills the step's device-side penalties and log probabilities (a penalty
    /// slot for each request with penalties, set up on its first step) and
    /// returns the requests of its log-probability rows, in order.
    fn attach_extras(&mut self, prepared: &mut PreparedBatch) -> Vec<ReqId> {
        let mut extras = StepExtras::default();
        let mut logprob_ids = Vec::new();
        let ids: Vec<ReqId> = prepared.sampling_req_ids().collect();
        for (row, &id) in ids.iter().enumerate() {
            let Some(req) = self.scheduler.running_req(id) else {
                continue;
            };
            let params = req.params();
            let pen = params.penalties;
            if !pen.is_neutral() {
                let (slot, new) = self.penalty_slots.slot(id);
                if new {
                    // A slot is given at the request's first sampling step, when
                    // every token it has is known on the host.
                    let (prompt, outputs) = req.token_ids().split_at(req.prompt_len());
                    extras.setups.push(SlotSetup { slot, prompt: prompt.to_vec(), outputs: outputs.to_vec() });
                }
                extras.penalties.push(PenaltyRow {
                    row: row as u32,
                    slot,
                    repetition: pen.repetition,
                    frequency: pen.frequency,
                    presence: pen.presence,
                });
            }
            if let Some(top_n) = params.logprobs {
                extras.logprobs.push((row as u32, top_n));
                logprob_ids.push(id);
            }
        }
        prepared.extras = extras;
        logprob_ids
    }

    /// Gets a launched step's tokens (waiting for the device if it sampled
    /// there) and applies them.
    fn resolve(&mut self, f: InFlight) -> Result<Vec<TokenEvent>, EngineError> {
        let (tokens, mut logprobs) = match f.host {
            Some(host) => host,
            None => {
                let rows = f.launched.num_samples();
                let wait_start = Instant::now();
                let tokens = self.runner.wait();
                self.forward_time += wait_start.elapsed();
                let (tokens, device_logprobs) = match tokens {
                    Ok(t) => (t.tokens, t.logprobs),
                    Err(err) => {
                        self.fail_step(f.launched);
                        return Err(EngineError::Runner(err));
                    }
                };
                if tokens.len() != rows || tokens.iter().any(|&t| t as usize >= self.vocab_size) {
                    self.fail_step(f.launched);
                    return Err(EngineError::LogitsShape {
                        rows,
                        vocab: self.vocab_size,
                        got_rows: tokens.len(),
                        got_vocab: tokens.iter().map(|&t| t as usize + 1).max().unwrap_or(0),
                    });
                }
                if device_logprobs.len() != f.device_logprobs.len() {
                    self.fail_step(f.launched);
                    return Err(EngineError::Runner(
                        format!(
                            "the runner returned {} rows of log probabilities for {}",
                            device_logprobs.len(),
                            f.device_logprobs.len()
                        )
                        .into(),
                    ));
                }
                self.host_tokens = Some((f.launched.step(), tokens.clone()));
                let logprobs = f.device_logprobs.iter().zip(device_logprobs).map(|(&id, (_, lp))| (id, Some(lp)));
                (tokens, logprobs.collect())
            }
        };
        self.num_steps += 1;
        let grammar_done = match &f.grammar_rows {
            Some(ids) => self.advance_grammars(ids, &tokens),
            None => Vec::new(),
        };
        let mut events = self.scheduler.resolve(f.launched, &tokens);
        if !grammar_done.is_empty() || !self.grammars.is_empty() {
            self.end_grammar_requests(&mut events, &grammar_done);
        }
        if !logprobs.is_empty() {
            for event in &mut events {
                if let Some(i) = logprobs.iter().position(|(id, _)| *id == event.id) {
                    event.logprobs = logprobs.swap_remove(i).1;
                }
            }
        }
        // A finished request's penalty slot can go to another request: the
        // device sets it up again behind every step already launched.
        let scheduler = &self.scheduler;
        self.penalty_slots.release_unless(|id| scheduler.contains(id));
        Ok(events)
    }

    /// A launched step failed on the device: its requests cannot go on (their
    /// next tokens are unknown), so they end, and what waited for the step is
    /// released.
    fn fail_step(&mut self, launched: LaunchedStep) {
        let ids: Vec<ReqId> = launched.req_ids().collect();
        for id in ids {
            self.scheduler.finish(id, FinishReason::Abort);
        }
        self.scheduler.mark_resolved(launched.step());
    }

    /// Samples a step's host logits: applies each request's penalties, samples,
    /// and computes the log probabilities of the requests that asked for them
    /// (from the raw logits, see [`crate::core::sampling::logprobs`]). Returns the tokens and,
    /// for the rows that report log probabilities, `(request, logprobs)`.
    fn sample_on_host(&self, prepared: &PreparedBatch, mut logits: Logits, masks: Option<&TokenMasks>) -> HostSamples {
        let ids: Vec<ReqId> = prepared.sampling_req_ids().collect();
        let mut raw_rows: Vec<(usize, usize, Vec<f32>)> = Vec::new();
        for (row, &id) in ids.iter().enumerate() {
            let Some(req) = self.scheduler.running_req(id) else {
                continue;
            };
            let params = req.params();
            if let Some(top_n) = params.logprobs {
                raw_rows.push((row, top_n, logits.row(row).to_vec()));
            }
            if !params.penalties.is_neutral() {
                let (prompt, outputs) = req.token_ids().split_at(req.prompt_len());
                params.penalties.apply(logits.row_mut(row), prompt, outputs);
            }
        }
        if let Some(masks) = masks {
            for (i, &row) in masks.rows().iter().enumerate() {
                apply_token_mask(logits.row_mut(row as usize), masks.mask(i));
            }
        }
        let tokens = sampling::sample(&logits, prepared.sampling());
        let logprobs = raw_rows
            .into_iter()
            .map(|(row, top_n, raw)| (ids[row], Some(token_logprobs(&raw, tokens[row], top_n))))
            .collect();
        (tokens, logprobs)
    }

    /// Constrains a request added with [`Self::add_request`] to `grammar`,
    /// before its first step. `false` if the request is unknown.
    pub fn set_grammar(&mut self, id: ReqId, grammar: Grammar) -> bool {
        if !self.scheduler.contains(id) {
            return false;
        }
        self.grammars.insert(id, grammar);
        true
    }

    /// The token masks of a step's rows whose request has a grammar (`None`
    /// when none has). Host work that depends only on the tokens sampled
    /// before this step: an engine that overlaps the host with the forward
    /// pass can run it while the previous step computes, once that step's
    /// tokens have advanced the grammars.
    pub fn token_masks(&mut self, prepared: &PreparedBatch) -> Option<TokenMasks> {
        step_token_masks(&mut self.grammars, self.vocab_size, prepared)
    }

    /// Feeds each grammar the token its row sampled; returns the requests
    /// whose grammar is done (complete, or failed), which end with the step.
    pub fn advance_grammars(&mut self, row_ids: &[ReqId], tokens: &[u32]) -> Vec<ReqId> {
        let mut done = Vec::new();
        for (&id, &token) in row_ids.iter().zip(tokens) {
            if let Some(grammar) = self.grammars.get_mut(&id) {
                if grammar.advance(token) {
                    done.push(id);
                }
            }
        }
        done
    }

    /// Ends the requests of `done` that the step did not end itself (a
    /// grammar complete without its end token being one of the engine's), and
    /// forgets the grammars of the requests that ended.
    fn end_grammar_requests(&mut self, events: &mut [TokenEvent], done: &[ReqId]) {
        for event in events.iter_mut() {
            if event.finished.is_none() && done.contains(&event.id) {
                event.finished = self.scheduler.finish(event.id, FinishReason::Stop);
            }
            if event.finished.is_some() {
                self.grammars.remove(&event.id);
            }
        }
    }

    /// Runs `requests` to completion and returns their outputs in order.
    /// Needs an idle engine (it would otherwise swallow other requests'
    /// tokens). Either every request is valid and queued, or none is.
    pub fn generate(&mut self, requests: Vec<GenerateRequest>) -> Result<Vec<GenerateOutput>, EngineError> {
        let in_flight = self.scheduler.num_waiting() + self.scheduler.num_running();
        if in_flight > 0 || self.in_flight.is_some() {
            return Err(EngineError::Busy { num_requests: in_flight });
        }
        for req in &requests {
            self.validate(req)?;
        }
        let mut slots: HashMap<ReqId, usize> = HashMap::with_capacity(requests.len());
        for (i, req) in requests.into_iter().enumerate() {
            slots.insert(self.add_request(req)?, i);
        }
        let mut outputs: Vec<Option<GenerateOutput>> = vec![None; slots.len()];
        let mut num_left = slots.len();
        while num_left > 0 {
            let events = match self.step() {
                Ok(events) => events,
                Err(err) => {
                    for &id in slots.keys() {
                        self.abort(id);
                    }
                    return Err(err);
                }
            };
            for finished in events.into_iter().filter_map(|e| e.finished) {
                if let Some(&slot) = slots.get(&finished.id) {
                    outputs[slot] = Some(finished.into());
                    num_left -= 1;
                }
            }
        }
        // A step launched behind the last tokens only holds ended requests.
        self.drain()?;
        Ok(outputs.into_iter().map(|o| o.expect("every request finished")).collect())
    }

    /// Cancels a request and frees its pages. `false` if it is unknown
    /// (already finished, or never added).
    pub fn abort(&mut self, id: ReqId) -> bool {
        self.finish(id, FinishReason::Abort).is_some()
    }

    /// Ends a request from outside with `reason` (e.g. `Stop` when the
    /// detokenizer matched a stop string), freeing its pages; returns what it
    /// produced. `None` if it is unknown.
    pub fn finish(&mut self, id: ReqId, reason: FinishReason) -> Option<FinishedReq> {
        self.grammars.remove(&id);
        self.scheduler.finish(id, reason)
    }

    /// Prompt tokens of a running request served from the prefix cache.
    pub fn cached_tokens(&self, id: ReqId) -> Option<usize> {
        self.scheduler.running_req(id).map(|r| r.cached_tokens())
    }

    /// Whether any request is queued or running, or a step is in flight.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work() || self.in_flight.is_some()
    }

    pub fn stats(&self) -> EngineStats {
        let cache = self.scheduler.cache();
        let counters = self.scheduler.counters();
        EngineStats {
            num_waiting: self.scheduler.num_waiting(),
            num_running: self.scheduler.num_running(),
            num_pages: cache.num_pages(),
            used_pages: cache.num_used_pages(),
            free_pages: cache.num_free_pages(),
            cached_pages: cache.num_cached_pages(),
            evictable_pages: cache.num_evictable_pages(),
            cache_hit_tokens: cache.hit_tokens(),
            num_steps: self.num_steps,
            num_preempted: counters.num_preempted,
            num_finished: counters.num_finished,
            forward_time: self.forward_time,
            host_time: self.host_time,
            last_step_rows: self.last_step_rows,
            last_step_tokens: self.last_step_tokens,
        }
    }

    /// Drops every prefix-cache page no request uses (`/flush_cache`).
    pub fn flush_cache(&mut self) {
        self.scheduler.flush_cache();
    }

    /// Asserts that every KV page is accounted for exactly once.
    pub fn check_integrity(&self) {
        self.scheduler.check_integrity();
    }

    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        let invalid = |field, reason: String| Err(EngineError::InvalidRequest { field, reason });
        let p = &req.params;
        let prompt_len = req.prompt_ids.len();
        if prompt_len == 0 {
            return invalid("prompt_ids", "must not be empty".into());
        }
        if let Some((i, &t)) = req.prompt_ids.iter().enumerate().find(|(_, &t)| t as usize >= self.vocab_size) {
            return invalid(
                "prompt_ids",
                format!("token {t} at index {i} is outside the vocabulary of {}", self.vocab_size),
            );
        }
        if let Some((i, &t)) = p.stop_token_ids.iter().enumerate().find(|(_, &t)| t as usize >= self.vocab_size) {
            return invalid(
                "stop_token_ids",
                format!("token {t} at index {i} is outside the vocabulary of {}", self.vocab_size),
            );
        }
        if p.max_tokens == 0 {
            return invalid("max_tokens", "must be at least 1".into());
        }
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return invalid("temperature", format!("must be a finite number >= 0, got {}", p.temperature));
        }
        if p.top_k == Some(0) {
            return invalid("top_k", "must be at least 1 (or unset)".into());
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return invalid("top_p", format!("must be in (0, 1], got {}", p.top_p));
        }
        if !(0.0..=1.0).contains(&p.min_p) {
            return invalid("min_p", format!("must be in [0, 1], got {}", p.min_p));
        }
        let pen = &p.penalties;
        if !(pen.repetition.is_finite() && pen.repetition > 0.0) {
            return invalid("repetition_penalty", format!("must be a finite number > 0, got {}", pen.repetition));
        }
        for (field, value) in [("frequency_penalty", pen.frequency), ("presence_penalty", pen.presence)] {
            if !(-2.0..=2.0).contains(&value) {
                return invalid(field, format!("must be in [-2, 2], got {value}"));
            }
        }
        if let Some(n) = p.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return invalid("top_logprobs", format!("at most {MAX_TOP_LOGPROBS} alternatives are reported, got {n}"));
        }
        let too_long = |limit, limit_tokens| {
            Err(EngineError::TooLong { prompt_len, max_tokens: p.max_tokens, limit, limit_tokens })
        };
        let total = prompt_len.saturating_add(p.max_tokens);
        if total > self.max_context_len {
            return too_long(LengthLimit::Context, self.max_context_len);
        }
        // The last output is never fed back, so it needs no KV slot.
        let pool_tokens = self.scheduler.config().num_pages * self.scheduler.config().page_size;
        if total - 1 > pool_tokens {
            return too_long(LengthLimit::KvPool, pool_tokens);
        }
        Ok(())
    }
}

/// The token masks of a step's rows whose request has a grammar in `grammars`
/// (`None` when none has): [`Engine::token_masks`], as a function of the
/// grammars alone so that a runner can call it while the forward pass runs.
fn step_token_masks(
    grammars: &mut HashMap<ReqId, Grammar>,
    vocab_size: usize,
    prepared: &PreparedBatch,
) -> Option<TokenMasks> {
    let rows: HashMap<ReqId, u32> = prepared
        .sampling_req_ids()
        .enumerate()
        .filter(|(_, id)| grammars.contains_key(id))
        .map(|(row, id)| (id, row as u32))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut work: Vec<(u32, &mut Grammar)> =
        grammars.iter_mut().filter_map(|(id, g)| rows.get(id).map(|&row| (row, g))).collect();
    work.sort_unstable_by_key(|(row, _)| *row);
    let mut masks = TokenMasks::zeroed(vocab_size, work.iter().map(|(row, _)| *row).collect());
    let words = masks.words_per_row();
    // Rows are independent and a mask can take a good fraction of a
    // millisecond over a large vocabulary: spread them over the cores.
    if work.len() > 1 {
        masks.bits_mut().par_chunks_mut(words).zip(work.par_iter_mut()).for_each(|(out, (_, g))| g.fill_mask(out));
    } else {
        for (out, (_, g)) in masks.bits_mut().chunks_mut(words).zip(work.iter_mut()) {
            g.fill_mask(out);
        }
    }
    Some(masks)
}
