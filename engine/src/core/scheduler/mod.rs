//! The scheduler: which requests run in the next step, with how many tokens
//! each, and what happens to them when the step's tokens come back.
//!
//! A step goes through four calls, kept apart so that overlap scheduling
//! can prepare step n+1 while the GPU runs step n:
//!
//! 1. [`Scheduler::schedule`] picks a [`Batch`] (policy, admission,
//!    preemption; no KV memory changes hands except on preemption);
//! 2. [`Scheduler::prepare`] gives the rows their pages and builds the
//!    [`PreparedBatch`] the model runs on;
//! 3. [`Scheduler::launch`], once the step is handed to the runner, advances
//!    the requests' lengths and pushes a placeholder for each token the step
//!    samples, so that the next step can be scheduled before the tokens are
//!    known;
//! 4. [`Scheduler::resolve`] takes the sampled tokens, checks stop
//!    conditions, caches prefixes and releases finished requests.
//!
//! [`Scheduler::complete`] is 3 and 4 at once (no overlap).
//!
//! # Overlap scheduling
//!
//! With overlap, step n+1 is launched before step n is resolved, so a request
//! can end (a stop token, a stop string, an abort) while a launched step
//! still reads its pages. Its report is made at once (with the tokens known
//! up to then: the token the later step samples for it is dropped), but its
//! pages stay with it, in `retiring`, until every step it is a row of is
//! resolved; pages a running request gives up early (radix duplicates) are
//! held by the cache the same way. A request whose last output has been
//! launched is not scheduled again. Preempting a request a launched step
//! reads cannot wait that way: [`Scheduler::schedule`] answers
//! [`Scheduled::WaitForInFlight`] instead, and the engine resolves first.
//!
//! # Policy
//!
//! Following mini-sglang (`scheduler/scheduler.py`, `prefill.py`):
//!
//! - **Continuous batching.** Requests are admitted from a FIFO queue while
//!   others decode; a request that cannot be admitted blocks those behind it
//!   (no overtaking, so long prompts do not starve).
//! - **Chunked prefill.** At most `max_prefill_length` prompt tokens are fed
//!   per step. Requests already part way through their prompt continue first,
//!   oldest first; new requests are then admitted while budget remains. A
//!   chunk may end anywhere, including mid-page: the next chunk writes on in
//!   the same page.
//! - **Prefill and decode.** [`SchedulePolicy::PrefillFirst`] is
//!   mini-sglang's: a step with prefill work runs only prefill rows, decode
//!   waits for a step without. [`SchedulePolicy::Mixed`] (SGLang's mixed
//!   chunk) adds every decoding request to each step as a one-token row, so
//!   decode never stalls behind long prompts; decode rows do not count
//!   against the prefill budget. Outputs are identical either way.
//! - **Admission control.** `max_running_requests` bounds the running set;
//!   a request is admitted only if its uncached tokens plus a reserved share
//!   of its remaining outputs ([`policy`]) fit in the available pages (free
//!   plus evictable) next to the reservations of the running requests. With
//!   `decode_reserve = 1` (mini-sglang) decode can never run out of pages.
//! - **Preemption.** When a step's pages do not fit anyway (a smaller
//!   reservation), the most recently admitted requests are preempted until
//!   they do: each gives its pages back (its computed prefix stays in the
//!   radix cache, so recomputing it is cheap when it is not evicted), keeps
//!   its outputs, and returns to the front of the queue. Recomputation and
//!   position-indexed random streams make its output identical. The oldest
//!   request is never preempted; since the engine rejects requests that could
//!   not fit the pool alone, it always progresses.

mod policy;
mod prepare;

pub use policy::{pages_to_reserve, reserve_tokens};

use std::collections::VecDeque;

use crate::core::kvcache::{CacheKind, CacheManager};
use crate::core::req::{Batch, BatchRow, FinishReason, FinishedReq, PendingReq, PreparedBatch, Req, ReqId, TokenEvent};

/// What [`Scheduler::schedule`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Scheduled {
    /// The next step.
    Batch(Batch),
    /// Nothing to run now.
    Idle,
    /// The step needs pages that only preempting a request a launched step
    /// reads (or pages held for such a step) would give: resolve the launched
    /// steps, then schedule again.
    WaitForInFlight,
}

impl Scheduled {
    /// The batch, if there is one.
    pub fn batch(self) -> Option<Batch> {
        match self {
            Scheduled::Batch(b) => Some(b),
            Scheduled::Idle | Scheduled::WaitForInFlight => None,
        }
    }
}

/// A launched step's sampling rows, kept until its tokens come back.
#[derive(Debug)]
pub struct LaunchedStep {
    step: u64,
    /// One per sampled token, in the order of the step's logits rows.
    samples: Vec<LaunchedSample>,
}

impl LaunchedStep {
    /// The step's number (1 for the first launched).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Tokens the step samples.
    pub fn num_samples(&self) -> usize {
        self.samples.len()
    }

    /// The request of each sampled token.
    pub fn req_ids(&self) -> impl ExactSizeIterator<Item = ReqId> + '_ {
        self.samples.iter().map(|s| s.id)
    }
}

#[derive(Debug)]
struct LaunchedSample {
    id: ReqId,
    /// Where the placeholder of the token sits in the request's tokens.
    pos: usize,
    /// The step completes the request's prefill (its prompt goes to the cache).
    completes_prefill: bool,
}

/// How prefill and decode share steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulePolicy {
    /// A step runs prefill rows if there are any, decode rows otherwise
    /// (mini-sglang). Pure decode steps suit CUDA graphs.
    PrefillFirst,
    /// Every step carries all decoding requests plus up to
    /// `max_prefill_length` prefill tokens (SGLang's mixed chunk).
    Mixed,
}

/// Scheduler knobs. No `Default`: each value is a decision of the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Tokens per KV page (`--page-size`).
    pub page_size: usize,
    /// KV pages in the pool; the runner's KV cache must have exactly these
    /// (sized from `--mem-fraction` or `--num-pages` by the caller).
    pub num_pages: usize,
    /// Most prompt tokens fed per step (chunked prefill, `--max-prefill-length`).
    pub max_prefill_length: usize,
    /// Most requests running at once (`--max-running-requests`).
    pub max_running_requests: usize,
    /// Prefix cache (`--cache radix|naive`).
    pub cache: CacheKind,
    /// How prefill and decode share steps.
    pub policy: SchedulePolicy,
    /// Share of each request's remaining `max_tokens` reserved at admission,
    /// in `[0, 1]`: 1 never preempts (mini-sglang), lower admits more and
    /// preempts when decode outgrows the pool; see [`policy`].
    pub decode_reserve: f64,
    /// Tokens that end a request unless it sets `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
}

/// Counters since the scheduler started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    pub num_admitted: u64,
    pub num_preempted: u64,
    pub num_finished: u64,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    cache: CacheManager,
    waiting: VecDeque<PendingReq>,
    /// In admission order (oldest first).
    running: Vec<Req>,
    /// Ended requests whose pages a launched step may still read.
    retiring: Vec<Req>,
    next_admission: u64,
    counters: SchedulerCounters,
    /// Steps launched and resolved so far (overlap keeps at most two apart).
    launched_step: u64,
    resolved_step: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        assert!(config.max_prefill_length > 0, "max_prefill_length must be positive");
        assert!(config.max_running_requests > 0, "max_running_requests must be positive");
        assert!((0.0..=1.0).contains(&config.decode_reserve), "decode_reserve must be in [0, 1]");
        let cache = CacheManager::new(config.page_size, config.num_pages, config.cache);
        Self {
            config,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            retiring: Vec::new(),
            next_admission: 0,
            counters: SchedulerCounters::default(),
            launched_step: 0,
            resolved_step: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn cache(&self) -> &CacheManager {
        &self.cache
    }

    pub fn counters(&self) -> SchedulerCounters {
        self.counters
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// A running request.
    pub fn running_req(&self, id: ReqId) -> Option<&Req> {
        self.running.iter().find(|r| r.id() == id)
    }

    pub fn contains(&self, id: ReqId) -> bool {
        self.running.iter().any(|r| r.id() == id) || self.waiting.iter().any(|r| r.id() == id)
    }

    /// Queues a request. The engine checked that it fits the pool alone.
    pub fn add(&mut self, req: PendingReq) {
        let lifetime_tokens = req.token_ids().len() + req.remaining_outputs() - 1;
        assert!(
            lifetime_tokens <= self.config.num_pages * self.config.page_size,
            "{}: {lifetime_tokens} tokens can never fit the pool",
            req.id()
        );
        self.waiting.push_back(req);
    }

    /// Picks the next step.
    pub fn schedule(&mut self) -> Scheduled {
        let mut rows = Vec::new();
        let mut budget = self.config.max_prefill_length;

        // Prompts part way through continue first, oldest first.
        for req in self.running.iter().filter(|r| r.is_prefilling()) {
            if budget == 0 {
                break;
            }
            rows.push(row_for(req, budget));
            budget -= rows.last().map_or(0, |r: &BatchRow| r.extend_len);
        }

        let num_old = self.running.len();
        if budget > 0 {
            self.admit(&mut budget, &mut rows);
        }

        if rows.is_empty() || self.config.policy == SchedulePolicy::Mixed {
            // A request whose last output is launched already only waits for it.
            let decoding = self.running[..num_old].iter().filter(|r| !r.is_prefilling() && r.remaining_outputs() > 0);
            rows.extend(decoding.map(|r| row_for(r, 1)));
        }

        if !self.fit(&mut rows) {
            return Scheduled::WaitForInFlight;
        }
        if rows.is_empty() {
            Scheduled::Idle
        } else {
            Scheduled::Batch(Batch::new(rows))
        }
    }

    /// Whether a launched step that is not resolved yet reads `req`'s pages.
    fn in_flight(&self, req: &Req) -> bool {
        req.last_step() > self.resolved_step
    }

    /// Admits queued requests, FIFO, while budget, running slots and memory
    /// allow; each admitted request gets a prefill row.
    fn admit(&mut self, budget: &mut usize, rows: &mut Vec<BatchRow>) {
        let (ratio, page_size) = (self.config.decode_reserve, self.config.page_size);
        let mut reserved: usize = self
            .running
            .iter()
            .map(|r| {
                // A request whose last output is launched (overlap) needs no more.
                let remaining = r.remaining_outputs().max(1);
                pages_to_reserve(r.token_ids().len(), remaining, ratio, r.pages().num_pages(), page_size)
            })
            .sum();
        while *budget > 0 && self.running.len() < self.config.max_running_requests {
            let Some(next) = self.waiting.front() else {
                break;
            };
            let m = self.cache.match_prefix(next.token_ids());
            let need =
                pages_to_reserve(next.token_ids().len(), next.remaining_outputs(), ratio, m.num_pages(), page_size);
            // Locking the match takes its evictable pages out of the
            // available ones.
            let available = self.cache.num_available_pages() - m.num_evictable_pages();
            if reserved + need > available {
                break;
            }
            let pending = self.waiting.pop_front().expect("front was just seen");
            let pages = self.cache.acquire(m);
            let req = pending.admit(pages, page_size, self.next_admission);
            self.next_admission += 1;
            self.counters.num_admitted += 1;
            let row = row_for(&req, *budget);
            *budget -= row.extend_len;
            rows.push(row);
            reserved += need;
            self.running.push(req);
        }
    }

    /// Preempts the newest requests until the pages `rows` need are
    /// available. `false` when that would take a request (or held pages)
    /// that a launched step still reads.
    fn fit(&mut self, rows: &mut Vec<BatchRow>) -> bool {
        loop {
            let needed: usize = rows
                .iter()
                .map(|row| {
                    let req = self.running.iter().find(|r| r.id() == row.id).expect("row of a running request");
                    self.cache.pages_to_grow(req.pages(), req.cached_len() + row.extend_len)
                })
                .sum();
            if needed <= self.cache.num_available_pages() {
                return true;
            }
            if self.cache.num_held_pages() > 0 || !self.retiring.is_empty() {
                return false;
            }
            assert!(self.running.len() > 1, "a lone request must fit the pool (checked at submission)");
            let newest =
                self.running.iter().enumerate().max_by_key(|(_, r)| r.admission()).map(|(i, _)| i).expect("running");
            if self.in_flight(&self.running[newest]) {
                return false;
            }
            let victim = self.running.remove(newest);
            rows.retain(|row| row.id != victim.id());
            log::debug!("preempting {} ({} tokens) to free KV pages", victim.id(), victim.token_ids().len());
            self.counters.num_preempted += 1;
            let pending = victim.preempt(&mut self.cache);
            self.waiting.push_front(pending);
        }
    }

    /// Allocates the step's pages and builds its index arrays.
    pub fn prepare(&mut self, batch: Batch) -> PreparedBatch {
        prepare::prepare(batch, &mut self.running, &mut self.cache)
    }

    /// Applies a finished step: `tokens[i]` was sampled for
    /// `batch.logits_rows()[i]`. Returns one event per sampled token.
    pub fn complete(&mut self, batch: PreparedBatch, tokens: &[u32]) -> Vec<TokenEvent> {
        let launched = self.launch(&batch);
        self.resolve(launched, tokens)
    }

    /// The runner has `batch`: advances each row's request as if its tokens
    /// were known (chunks count as computed, sampled tokens are pushed as
    /// placeholders), so that the next step can be scheduled and prepared
    /// while this one runs. [`Self::resolve`] fills in the tokens.
    pub fn launch(&mut self, batch: &PreparedBatch) -> LaunchedStep {
        self.launched_step += 1;
        let step = self.launched_step;
        self.cache.step_launched(step);
        let mut samples = Vec::with_capacity(batch.logits_rows().len());
        for row in batch.rows() {
            let Some(req) = self.running.iter_mut().find(|r| r.id() == row.id) else {
                // Ended between prepare and launch (resolving the step in flight
                // found its stop token): its token will be dropped.
                if row.samples {
                    samples.push(LaunchedSample { id: row.id, pos: usize::MAX, completes_prefill: false });
                }
                continue;
            };
            if row.samples {
                let completes_prefill = req.is_prefilling();
                let pos = req.launch_sample(row.extend_len, step, samples.len() as u32);
                samples.push(LaunchedSample { id: row.id, pos, completes_prefill });
            } else {
                req.launch_chunk(row.extend_len, step);
            }
        }
        LaunchedStep { step, samples }
    }

    /// A launched step came back with `tokens` (one per sampled row): checks
    /// stop conditions, caches prefixes, ends requests. Returns one event per
    /// token of a request still running; a request ended meanwhile (from
    /// outside, or by its previous token) drops its token.
    pub fn resolve(&mut self, launched: LaunchedStep, tokens: &[u32]) -> Vec<TokenEvent> {
        assert_eq!(tokens.len(), launched.samples.len(), "one token per sampled row");
        assert_eq!(launched.step, self.resolved_step + 1, "steps are resolved in launch order");
        let mut events = Vec::with_capacity(tokens.len());
        for (sample, &token) in launched.samples.iter().zip(tokens) {
            let Some(idx) = self.running.iter().position(|r| r.id() == sample.id) else {
                continue;
            };
            let req = &mut self.running[idx];
            match req.resolve(sample.pos, token, &self.config.eos_token_ids) {
                None => {
                    if sample.completes_prefill {
                        // Prompt done: share its pages with later requests.
                        req.cache_prefix(&mut self.cache);
                    }
                    events.push(TokenEvent { id: sample.id, token, logprobs: None, finished: None });
                }
                Some(reason) => {
                    let req = self.running.remove(idx);
                    let finished = self.end(req, reason);
                    events.push(TokenEvent { id: sample.id, token, logprobs: None, finished: Some(finished) });
                }
            }
        }
        self.mark_resolved(launched.step);
        events
    }

    /// Step `step` is over (resolved, or failed): releases what waited for it.
    pub fn mark_resolved(&mut self, step: u64) {
        self.resolved_step = self.resolved_step.max(step);
        self.cache.step_resolved(self.resolved_step);
        let resolved = self.resolved_step;
        let (done, keep): (Vec<Req>, Vec<Req>) = self.retiring.drain(..).partition(|r| r.last_step() <= resolved);
        self.retiring = keep;
        for req in done {
            req.release(&mut self.cache);
        }
    }

    /// The last launched step.
    pub fn launched_step(&self) -> u64 {
        self.launched_step
    }

    /// Ends a running request: its report now, its pages once no launched
    /// step reads them.
    fn end(&mut self, req: Req, reason: FinishReason) -> FinishedReq {
        self.counters.num_finished += 1;
        let report = req.report(reason);
        if self.in_flight(&req) {
            self.retiring.push(req);
        } else {
            req.release(&mut self.cache);
        }
        report
    }

    /// Ends a request from outside (abort, or a stop string matched by the
    /// detokenizer), freeing its pages. `None` if it is not known (already
    /// finished, or never added).
    ///
    /// With overlap scheduling, a request in a launched step keeps its pages
    /// until that step is resolved (mini-sglang defers such frees the same
    /// way), and the token that step samples for it is dropped.
    pub fn finish(&mut self, id: ReqId, reason: FinishReason) -> Option<FinishedReq> {
        if let Some(idx) = self.running.iter().position(|r| r.id() == id) {
            let req = self.running.remove(idx);
            return Some(self.end(req, reason));
        }
        let idx = self.waiting.iter().position(|r| r.id() == id)?;
        let pending = self.waiting.remove(idx).expect("index just found");
        self.counters.num_finished += 1;
        Some(pending.finish(reason))
    }

    /// Evicts every unlocked page of the prefix cache.
    pub fn flush_cache(&mut self) {
        self.cache.flush();
    }

    /// Asserts the page accounting (cheap enough for tests and debugging).
    pub fn check_integrity(&self) {
        self.cache.check_integrity();
        if self.running.is_empty() && self.retiring.is_empty() && self.cache.num_held_pages() == 0 {
            assert_eq!(self.cache.num_used_pages(), 0, "pages in use with no request running");
        }
    }
}

/// The row of a running request for a step with `budget` prefill tokens left.
fn row_for(req: &Req, budget: usize) -> BatchRow {
    let extend_len = req.extend_len().min(budget);
    BatchRow { id: req.id(), extend_len, samples: extend_len == req.extend_len() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::req::{Phase, SamplingParams};

    fn config(num_pages: usize, max_prefill_length: usize, policy: SchedulePolicy) -> SchedulerConfig {
        SchedulerConfig {
            page_size: 4,
            num_pages,
            max_prefill_length,
            max_running_requests: 8,
            cache: CacheKind::Radix,
            policy,
            decode_reserve: 1.0,
            eos_token_ids: vec![],
        }
    }

    fn pending(id: u64, prompt_len: usize, max_tokens: usize) -> PendingReq {
        let prompt = (0..prompt_len as u32).map(|i| i + 1000 * id as u32).collect();
        PendingReq::new(ReqId::new(id), prompt, SamplingParams::greedy(max_tokens), 0)
    }

    /// A step's phase, `(request, extend_len)` per row, and its events.
    type StepTrace = (Phase, Vec<(u64, usize)>, Vec<TokenEvent>);

    /// Runs one step, sampling token 7 for every row.
    fn step(s: &mut Scheduler) -> Option<StepTrace> {
        let batch = s.schedule().batch()?;
        let shape = batch.rows().iter().map(|r| (r.id.get(), r.extend_len)).collect();
        let prepared = s.prepare(batch);
        let phase = prepared.phase();
        let tokens = vec![7; prepared.logits_rows().len()];
        let events = s.complete(prepared, &tokens);
        s.check_integrity();
        Some((phase, shape, events))
    }

    #[test]
    fn prefill_first_chunks_then_decodes() {
        let mut s = Scheduler::new(config(64, 8, SchedulePolicy::PrefillFirst));
        s.add(pending(1, 10, 2));
        s.add(pending(2, 3, 2));
        let (phase, shape, events) = step(&mut s).unwrap();
        assert_eq!(phase, Phase::Prefill);
        assert_eq!(shape, [(1, 8)]);
        assert!(events.is_empty());
        // The chunk continues first, then request 2 is admitted with the rest of the budget.
        let (_, shape, events) = step(&mut s).unwrap();
        assert_eq!(shape, [(1, 2), (2, 3)]);
        assert_eq!(events.len(), 2);
        let (phase, shape, _) = step(&mut s).unwrap();
        assert_eq!(phase, Phase::Decode);
        assert_eq!(shape, [(1, 1), (2, 1)]);
        assert!(!s.has_work());
        assert!(step(&mut s).is_none());
        s.flush_cache();
        assert_eq!(s.cache().num_free_pages(), 64);
    }

    #[test]
    fn mixed_adds_decode_rows_to_prefill_steps() {
        let mut s = Scheduler::new(config(64, 4, SchedulePolicy::Mixed));
        s.add(pending(1, 2, 5));
        step(&mut s).unwrap();
        s.add(pending(2, 6, 5));
        let (phase, shape, _) = step(&mut s).unwrap();
        assert_eq!(phase, Phase::Prefill);
        assert_eq!(shape, [(2, 4), (1, 1)]);
        let (_, shape, _) = step(&mut s).unwrap();
        assert_eq!(shape, [(2, 2), (1, 1)]);
    }

    #[test]
    fn admission_respects_running_limit_and_memory() {
        let mut cfg = config(6, 64, SchedulePolicy::PrefillFirst);
        cfg.max_running_requests = 2;
        let mut s = Scheduler::new(cfg);
        for id in 1..=3 {
            s.add(pending(id, 4, 5));
        }
        // Each needs (4 + 4) tokens = 2 pages reserved: 2 running max.
        let (_, shape, _) = step(&mut s).unwrap();
        assert_eq!(shape, [(1, 4), (2, 4)]);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));

        // Memory: 3 pages reserve for one request only.
        let mut s = Scheduler::new(config(3, 64, SchedulePolicy::PrefillFirst));
        s.add(pending(1, 4, 9));
        s.add(pending(2, 4, 9));
        let (_, shape, _) = step(&mut s).unwrap();
        assert_eq!(shape, [(1, 4)]);
        while s.num_waiting() == 1 {
            step(&mut s).unwrap();
        }
        // Request 2 got in only once request 1 was done.
        assert_eq!(s.counters().num_finished, 1);
        while step(&mut s).is_some() {}
        assert_eq!(s.counters().num_preempted, 0);
    }

    #[test]
    fn preemption_when_decode_outgrows_the_pool() {
        let mut cfg = config(4, 64, SchedulePolicy::PrefillFirst);
        cfg.decode_reserve = 0.0;
        let mut s = Scheduler::new(cfg);
        s.add(pending(1, 4, 8));
        s.add(pending(2, 4, 8));
        let mut outputs: std::collections::HashMap<u64, usize> = Default::default();
        while let Some((_, _, events)) = step(&mut s) {
            for e in events {
                *outputs.entry(e.id.get()).or_default() += 1;
            }
        }
        assert!(s.counters().num_preempted > 0);
        assert_eq!(outputs[&1], 8);
        assert_eq!(outputs[&2], 8);
        s.check_integrity();
    }

    #[test]
    fn finish_from_outside_frees_pages() {
        let mut s = Scheduler::new(config(16, 64, SchedulePolicy::PrefillFirst));
        s.add(pending(1, 9, 20));
        s.add(pending(2, 9, 20));
        step(&mut s).unwrap();
        assert!(s.cache().num_used_pages() > 0);
        s.add(pending(3, 5, 5));
        let done = s.finish(ReqId::new(1), FinishReason::Abort).unwrap();
        assert_eq!(done.output_ids, [7]);
        assert_eq!(s.finish(ReqId::new(3), FinishReason::Stop).unwrap().reason, FinishReason::Stop);
        assert!(s.finish(ReqId::new(3), FinishReason::Abort).is_none());
        s.finish(ReqId::new(2), FinishReason::Abort).unwrap();
        assert!(!s.has_work());
        s.check_integrity();
        assert_eq!(s.cache().num_used_pages(), 0);
    }

    /// The one layout the scheduler builds equals the old per-sequence
    /// derivation (`models::ForwardBatch::new` over `SeqStep`s taken from the
    /// requests themselves: their tokens, cached lengths and page tables) for
    /// chunked prefill, prefix-cache hits and mixed prefill + decode steps.
    #[test]
    fn layout_equals_the_per_sequence_derivation() {
        use kernel_runtime::Device;
        use models::{ForwardBatch, LogitRows, SeqStep};

        let mut s = Scheduler::new(config(256, 6, SchedulePolicy::Mixed));
        let shared: Vec<u32> = (0..13).collect();
        let with_prefix = |id: u64, own: usize, max_tokens: usize| {
            let prompt = shared.iter().copied().chain((0..own as u32).map(|i| 500 + 10 * id as u32 + i)).collect();
            PendingReq::new(ReqId::new(id), prompt, SamplingParams::greedy(max_tokens), 0)
        };
        s.add(with_prefix(1, 3, 6));
        let (mut saw_chunk, mut saw_hit, mut saw_mixed) = (false, false, false);
        for n in 0..40 {
            if n == 6 {
                // Arrives once request 1's prompt is cached: a radix hit.
                s.add(with_prefix(2, 9, 5));
                s.add(with_prefix(3, 2, 4));
            }
            let Some(batch) = s.schedule().batch() else {
                break;
            };
            let prepared = s.prepare(batch);
            let v = |t: &kernel_runtime::Tensor| t.to_vec::<i32>().unwrap();
            let pages: Vec<Vec<u32>> = prepared
                .rows()
                .iter()
                .map(|row| {
                    let req = s.running_req(row.id).unwrap();
                    req.pages().page_ids().map(|p| p.get()).collect()
                })
                .collect();
            let seqs: Vec<SeqStep<'_>> = prepared
                .rows()
                .iter()
                .zip(&pages)
                .map(|(row, pages)| {
                    let req = s.running_req(row.id).unwrap();
                    let start = req.cached_len();
                    let needed = (start + row.extend_len).div_ceil(4);
                    SeqStep {
                        new_tokens: &req.token_ids()[start..start + row.extend_len],
                        cached_len: start,
                        pages: &pages[..needed],
                    }
                })
                .collect();
            let which: Vec<usize> = prepared.logits_rows().iter().map(|&r| r as usize).collect();
            let want = ForwardBatch::new(&seqs, 4, LogitRows::LastOf(which), Device::Cpu).unwrap();
            let got = ForwardBatch::from_layout(prepared.layout(), Device::Cpu).unwrap();
            assert_eq!(v(got.input_ids()), v(want.input_ids()), "step {n}: ids");
            assert_eq!(v(got.positions()), v(want.positions()), "step {n}: positions");
            assert_eq!(v(got.out_loc()), v(want.out_loc()), "step {n}: slots");
            let (gm, wm) = (got.attn_meta(), want.attn_meta());
            assert_eq!(v(gm.q_indptr), v(wm.q_indptr), "step {n}: q_indptr");
            assert_eq!(v(gm.kv_lens), v(wm.kv_lens), "step {n}: kv_lens");
            assert_eq!(v(gm.block_table), v(wm.block_table), "step {n}: page table");
            assert_eq!(gm.q_lens_host, wm.q_lens_host);
            assert_eq!(v(got.logit_rows().unwrap()), v(want.logit_rows().unwrap()), "step {n}: logits rows");
            saw_chunk |= prepared.rows().iter().any(|r| !r.samples);
            saw_hit |= seqs
                .iter()
                .zip(prepared.rows())
                .any(|(q, r)| r.extend_len > 1 && q.cached_len > 0 && q.cached_len % 4 == 0 && r.id.get() > 1);
            saw_mixed |=
                prepared.rows().iter().any(|r| r.extend_len == 1) && prepared.rows().iter().any(|r| r.extend_len > 1);
            let tokens = vec![7; prepared.logits_rows().len()];
            s.complete(prepared, &tokens);
            s.check_integrity();
        }
        assert!(saw_chunk && saw_hit && saw_mixed, "chunk {saw_chunk}, radix hit {saw_hit}, mixed {saw_mixed}");
    }
}
