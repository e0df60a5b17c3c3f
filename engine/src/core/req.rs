//! Requests, sampling parameters and batches: the nouns of the scheduler.
//!
//! A request lives in one of two types. [`PendingReq`] waits in the queue
//! and holds no KV memory; [`Req`] runs and owns a page table
//! ([`ReqPages`]). Admission turns the first into the second, preemption and
//! completion turn it back or end it. A step is first a [`Batch`] (which
//! requests, how many tokens each) and then, once the scheduler has given it
//! pages and built its index arrays, a [`PreparedBatch`]: the plain data a
//! model runner needs for one forward pass.
//!
//! Length vocabulary (after mini-sglang's `core.py`), for a running request
//! whose known tokens are `token_ids` (prompt, then outputs so far):
//!
//! ```text
//! 0            cached_len                     token_ids.len()
//! |-- KV valid --|-- extend: fed this step --|
//! ```
//!
//! Invariant: `cached_len < token_ids.len()`: there is always at least one
//! token whose KV is not computed yet (at worst the last sampled one), which
//! is what the next step feeds to the model.

use std::fmt;
use std::sync::Arc;

use crate::core::kvcache::{CacheManager, ReqPages};
use crate::core::sampling::extras::StepExtras;
use crate::core::sampling::logprobs::TokenLogprobs;
use crate::core::sampling::penalties::Penalties;
use crate::core::sampling::SamplingRow;
use models::layout::StepLayout;

/// Identifies a request for its whole life, across preemptions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReqId(u64);

impl ReqId {
    pub const fn new(id: u64) -> Self {
        Self(id)
    }

    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ReqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// How to pick each next token of one request, and when to stop.
///
/// Stop *strings* are not here: they need text, so the detokenizer layer
/// matches them and ends the request with `Engine::finish`.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches
    /// `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0
    /// keeps all.
    pub min_p: f32,
    /// Seed of the request's random stream; `None` lets the engine pick one.
    /// The same seed and logits give the same tokens whatever else runs.
    pub seed: Option<u64>,
    /// Most tokens to generate (>= 1).
    pub max_tokens: usize,
    /// Tokens that end the request (the token is part of the output).
    /// Shared: a request's choices hold one list.
    pub stop_token_ids: Arc<[u32]>,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Repetition, frequency and presence penalties (neutral by default).
    pub penalties: Penalties,
    /// Report each output token's log probability and this many most likely
    /// alternatives (`Some(0)`: the token's only); `None` reports nothing.
    pub logprobs: Option<usize>,
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens, stopping at EOS.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            max_tokens,
            stop_token_ids: Arc::from([]),
            ignore_eos: false,
            penalties: Penalties::NONE,
            logprobs: None,
        }
    }

    /// Whether a step sampling for this request needs its logits on the host:
    /// penalties and log probabilities are computed there (a GPU step then
    /// copies its logits rows to the host instead of sampling on the device).
    pub fn needs_host_logits(&self) -> bool {
        !self.penalties.is_neutral() || self.logprobs.is_some()
    }

    /// Sampling at `temperature` with a fixed seed, no truncation.
    pub fn random(max_tokens: usize, temperature: f32, seed: u64) -> Self {
        Self { temperature, seed: Some(seed), ..Self::greedy(max_tokens) }
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An end-of-sequence or stop token was generated (included in the
    /// output), or the front end matched a stop string.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The client went away or asked to cancel.
    Abort,
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        })
    }
}

/// The shape of a step, as the attention backend and CUDA graphs see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Some row feeds more than one token (a prompt chunk; possibly mixed
    /// with decode rows).
    Prefill,
    /// Every row feeds exactly one token.
    Decode,
}

/// What a request is whatever its phase: its id, its tokens (prompt, then the
/// outputs so far), its sampling parameters and seed. [`PendingReq`] and [`Req`]
/// both hold one and give read access to it through `Deref`, so its getters
/// exist once; only the phase types change it, through their transitions.
#[derive(Debug)]
pub struct ReqBase {
    id: ReqId,
    /// Prompt followed by the outputs generated so far.
    token_ids: Vec<u32>,
    prompt_len: usize,
    params: SamplingParams,
    seed: u64,
}

impl ReqBase {
    pub fn id(&self) -> ReqId {
        self.id
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    pub fn num_outputs(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Outputs still allowed: at least 1 for a queued request; for a running
    /// one, counting the one the next full step samples.
    pub fn remaining_outputs(&self) -> usize {
        self.params.max_tokens - self.num_outputs()
    }
}

/// A request waiting for admission: it owns no KV memory. Its tokens are the
/// prompt, followed by outputs only after a preemption (they are then
/// recomputed like a prompt).
#[derive(Debug)]
pub struct PendingReq {
    base: ReqBase,
    /// Prompt tokens served from the prefix cache at the first admission.
    cached_tokens: Option<usize>,
}

impl std::ops::Deref for PendingReq {
    type Target = ReqBase;

    fn deref(&self) -> &ReqBase {
        &self.base
    }
}

impl PendingReq {
    /// A new request. The engine validated the input; these are programming
    /// errors.
    pub fn new(id: ReqId, prompt_ids: Vec<u32>, params: SamplingParams, seed: u64) -> Self {
        assert!(!prompt_ids.is_empty(), "{id}: empty prompt");
        assert!(params.max_tokens >= 1, "{id}: max_tokens must be at least 1");
        let prompt_len = prompt_ids.len();
        Self { base: ReqBase { id, token_ids: prompt_ids, prompt_len, params, seed }, cached_tokens: None }
    }

    /// Starts running with `pages`, whose shared prefix (from the prefix
    /// cache) already holds the KV of the first tokens.
    pub fn admit(self, pages: ReqPages, page_size: usize, admission: u64) -> Req {
        let cached_len = pages.num_shared_pages() * page_size;
        assert!(
            cached_len < self.base.token_ids.len(),
            "{}: a prefix match must leave a token to compute",
            self.base.id
        );
        Req {
            admitted_len: self.base.token_ids.len(),
            cached_tokens: self.cached_tokens.unwrap_or(cached_len.min(self.base.prompt_len)),
            base: self.base,
            cached_len,
            pages,
            admission,
            unresolved: Vec::new(),
            last_step: 0,
        }
    }

    /// Ends the request while it waits (it holds no pages).
    pub fn finish(self, reason: FinishReason) -> FinishedReq {
        let cached_tokens = self.cached_tokens.unwrap_or(0);
        FinishedReq::new(self.base.id, self.base.token_ids, self.base.prompt_len, reason, cached_tokens)
    }
}

/// An output token pushed when its step was launched, whose value that step
/// is still computing (overlap scheduling): the next step feeds it from the
/// device, the host learns it when the step is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// Index in the request's `token_ids`.
    pub pos: usize,
    /// The launched step that samples it.
    pub step: u64,
    /// Its index among that step's sampled tokens.
    pub row: u32,
}

/// A running request: it owns a page table and is scheduled every step until
/// it finishes or is preempted.
#[derive(Debug)]
pub struct Req {
    base: ReqBase,
    /// Tokens of `token_ids` still being sampled by launched steps (at most
    /// two: the step in flight and the one launched behind it), oldest first.
    unresolved: Vec<Unresolved>,
    /// The last launched step this request is a row of (0: none yet): its
    /// pages may be released only once that step is resolved.
    last_step: u64,
    cached_tokens: usize,
    /// Invariant: `cached_len < token_ids.len()` and the page table holds at
    /// least `cached_len` tokens.
    cached_len: usize,
    /// `token_ids.len()` at admission: what the first sampling step feeds up
    /// to (the prompt, or prompt and outputs after a preemption).
    admitted_len: usize,
    pages: ReqPages,
    /// Admission order, for preempting the newest first.
    admission: u64,
}

impl std::ops::Deref for Req {
    type Target = ReqBase;

    fn deref(&self) -> &ReqBase {
        &self.base
    }
}

impl Req {
    pub fn cached_len(&self) -> usize {
        self.cached_len
    }

    /// Tokens whose KV is not computed yet; all of them are fed by the next
    /// step unless the prefill budget cuts a chunk.
    pub fn extend_len(&self) -> usize {
        self.base.token_ids.len() - self.cached_len
    }

    /// Has not sampled since admission: still feeding its prompt (or, after
    /// a preemption, recomputing). The step that samples next completes the
    /// prefill.
    pub fn is_prefilling(&self) -> bool {
        self.base.token_ids.len() == self.admitted_len
    }

    pub fn admission(&self) -> u64 {
        self.admission
    }

    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    pub fn pages(&self) -> &ReqPages {
        &self.pages
    }

    /// The last launched step this request is a row of (0: none).
    pub fn last_step(&self) -> u64 {
        self.last_step
    }

    /// The still unresolved token at `pos`, if it is one.
    pub fn unresolved_at(&self, pos: usize) -> Option<Unresolved> {
        self.unresolved.iter().find(|u| u.pos == pos).copied()
    }

    /// Whether some of its tokens are still being sampled by launched steps.
    pub fn has_unresolved(&self) -> bool {
        !self.unresolved.is_empty()
    }

    /// Grows the page table to hold the KV of the next `extend_len` tokens.
    pub fn grow(&mut self, extend_len: usize, cache: &mut CacheManager) {
        assert!(
            extend_len <= self.extend_len(),
            "{}: cannot feed {extend_len} of {} tokens",
            self.base.id,
            self.extend_len()
        );
        cache.grow(&mut self.pages, self.cached_len + extend_len);
    }

    /// The tokens whose KV is valid (what may go into the prefix cache).
    pub fn computed_ids(&self) -> &[u32] {
        &self.base.token_ids[..self.cached_len]
    }

    /// Puts the whole pages of the computed tokens into the prefix cache
    /// (after the prompt is prefilled), so later requests can share them.
    pub fn cache_prefix(&mut self, cache: &mut CacheManager) {
        cache.cache_prefix(&self.base.token_ids[..self.cached_len], &mut self.pages);
    }

    /// What the sampler needs for this request's next token. The random
    /// stream is indexed by output position, so a token does not depend on
    /// how the request was batched, chunked or preempted.
    pub fn sampling_row(&self) -> SamplingRow {
        SamplingRow {
            temperature: self.base.params.temperature,
            top_k: self.base.params.top_k,
            top_p: self.base.params.top_p,
            min_p: self.base.params.min_p,
            seed: self.base.seed,
            step: self.num_outputs() as u64,
        }
    }

    /// A step fed the next `len` tokens but not the last one: nothing to
    /// sample yet.
    pub fn complete_chunk(&mut self, len: usize) {
        self.launch_chunk(len, self.last_step);
    }

    /// Step `step` was launched feeding the next `len` tokens but not the
    /// last one: their KV is (being) computed.
    pub fn launch_chunk(&mut self, len: usize, step: u64) {
        assert!(
            0 < len && len < self.extend_len(),
            "{}: a chunk of {len} tokens must leave some of {}",
            self.base.id,
            self.extend_len()
        );
        self.cached_len += len;
        self.last_step = step;
    }

    /// Step `step` was launched feeding all remaining tokens and samples the
    /// next one as its `row`-th token: the token is pushed as a placeholder
    /// (so that the next step can be scheduled before it is known) and its
    /// position returned, for [`Self::resolve`].
    pub fn launch_sample(&mut self, len: usize, step: u64, row: u32) -> usize {
        assert_eq!(len, self.extend_len(), "{}: a sampling step must feed every pending token", self.base.id);
        assert!(self.remaining_outputs() > 0, "{}: sampling past max_tokens", self.base.id);
        self.cached_len += len;
        let pos = self.base.token_ids.len();
        self.base.token_ids.push(0);
        self.unresolved.push(Unresolved { pos, step, row });
        self.last_step = step;
        pos
    }

    /// The token at `pos` (pushed by [`Self::launch_sample`]) is `token`.
    /// Returns why the request ends there, if it does.
    pub fn resolve(&mut self, pos: usize, token: u32, eos_token_ids: &[u32]) -> Option<FinishReason> {
        let idx = self.unresolved.iter().position(|u| u.pos == pos).expect("resolving a token that is not pending");
        self.unresolved.remove(idx);
        self.base.token_ids[pos] = token;
        let is_eos = !self.base.params.ignore_eos && eos_token_ids.contains(&token);
        if is_eos || self.base.params.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if pos + 1 - self.base.prompt_len >= self.base.params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// A step fed all remaining tokens and sampled `token`. Returns why the
    /// request ends, if it does.
    pub fn complete_step(&mut self, len: usize, token: u32, eos_token_ids: &[u32]) -> Option<FinishReason> {
        let pos = self.launch_sample(len, self.last_step, 0);
        self.resolve(pos, token, eos_token_ids)
    }

    /// The known tokens: up to the first unresolved one.
    fn resolved_token_ids(&self) -> Vec<u32> {
        let end = self.unresolved.first().map_or(self.base.token_ids.len(), |u| u.pos);
        self.base.token_ids[..end].to_vec()
    }

    /// Stops running, keeping the outputs so far: the request gives its
    /// pages back (its computed prefix stays in the prefix cache, if any)
    /// and returns to the queue, to recompute its KV when admitted again.
    pub fn preempt(self, cache: &mut CacheManager) -> PendingReq {
        assert!(self.unresolved.is_empty(), "{}: preempted while a step samples for it", self.base.id);
        cache.release(&self.base.token_ids[..self.cached_len], self.pages);
        PendingReq { base: self.base, cached_tokens: Some(self.cached_tokens) }
    }

    /// Ends the request and gives its pages back.
    pub fn finish(self, reason: FinishReason, cache: &mut CacheManager) -> FinishedReq {
        let report = self.report(reason);
        self.release(cache);
        report
    }

    /// What the caller is told when the request ends with `reason`: its
    /// outputs up to the first token a launched step is still sampling
    /// (overlap scheduling drops that one).
    pub fn report(&self, reason: FinishReason) -> FinishedReq {
        FinishedReq::new(self.base.id, self.resolved_token_ids(), self.base.prompt_len, reason, self.cached_tokens)
    }

    /// Gives the pages back (once no launched step can read them). The
    /// tokens whose KV is computed are all known by then: an unresolved
    /// token is only ever the last one, which no step has fed.
    pub fn release(self, cache: &mut CacheManager) {
        debug_assert!(self.unresolved.iter().all(|u| u.pos >= self.cached_len));
        cache.release(&self.base.token_ids[..self.cached_len], self.pages);
    }
}

/// A request that ended, with what the caller reports about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedReq {
    pub id: ReqId,
    pub reason: FinishReason,
    pub prompt_len: usize,
    pub output_ids: Vec<u32>,
    /// Prompt tokens whose KV came from the prefix cache (first admission).
    pub cached_tokens: usize,
}

impl FinishedReq {
    fn new(id: ReqId, mut token_ids: Vec<u32>, prompt_len: usize, reason: FinishReason, cached_tokens: usize) -> Self {
        let output_ids = token_ids.split_off(prompt_len);
        Self { id, reason, prompt_len, output_ids, cached_tokens }
    }
}

/// A token produced by a step, streamed to the request's client.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub id: ReqId,
    pub token: u32,
    /// The token's log probabilities, when the request asked for them.
    pub logprobs: Option<TokenLogprobs>,
    /// Set when this token ends the request.
    pub finished: Option<FinishedReq>,
}

/// One request's share of a step: feed its next `extend_len` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    pub id: ReqId,
    pub extend_len: usize,
    /// The chunk reaches the request's last token, so the step samples one.
    pub samples: bool,
}

/// A scheduled step before it has KV pages and index arrays.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch {
    rows: Vec<BatchRow>,
}

impl Batch {
    pub fn new(rows: Vec<BatchRow>) -> Self {
        assert!(!rows.is_empty(), "an empty batch is not a step");
        assert!(rows.iter().all(|r| r.extend_len > 0), "every row feeds at least one token");
        Self { rows }
    }

    pub fn rows(&self) -> &[BatchRow] {
        &self.rows
    }

    pub fn phase(&self) -> Phase {
        if self.rows.iter().all(|r| r.extend_len == 1) {
            Phase::Decode
        } else {
            Phase::Prefill
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.extend_len).sum()
    }
}

/// A token of a step whose id the previous launched step is still sampling
/// (overlap scheduling): the runner feeds `input_ids[token]` from that step's
/// `row`-th sampled id, on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeferredToken {
    /// Index of the token in the step's `input_ids`.
    pub token: u32,
    /// Index among the previous step's sampled tokens.
    pub row: u32,
}

/// Everything a model runner needs for one forward pass, as host vectors.
///
/// The token, position, slot and attention arrays are the model's own
/// [`StepLayout`], built once here and consumed as it is: rows are requests;
/// tokens of all rows are concatenated (`num_tokens` entries in `input_ids`,
/// `positions`, `out_loc`). KV slot `s` is token `s % page_size` of page
/// `s / page_size` of the KV cache.
///
/// The runner must: write the KV of token `i` at `out_loc[i]`; let row `r`
/// attend to its first `kv_lens[r]` tokens, found through
/// `page_table[r * max_num_pages ..][.. ceil(kv_lens[r] / page_size)]`
/// (the row's new tokens are the last `q_lens[r]` of those); return logits
/// for the last token of each row listed in `logits_rows`, in that order; and
/// feed the [`Self::deferred`] tokens from the previous step's samples.
#[derive(Debug)]
pub struct PreparedBatch {
    pub(crate) phase: Phase,
    pub(crate) rows: Vec<BatchRow>,
    pub(crate) layout: StepLayout,
    pub(crate) q_lens: Vec<u32>,
    pub(crate) sampling: Vec<SamplingRow>,
    /// Some sampling row needs its logits on the host
    /// ([`SamplingParams::needs_host_logits`]).
    pub(crate) needs_host_logits: bool,
    /// Tokens sampled by the previous launched step, not known on the host yet.
    pub(crate) deferred: Vec<DeferredToken>,
    /// The launched step the deferred tokens come from (0: none).
    pub(crate) deferred_step: u64,
    /// Penalties and log probabilities for a runner that does them on its
    /// device (set by the engine at launch; empty otherwise).
    pub(crate) extras: StepExtras,
}

impl PreparedBatch {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The step's layout, as the model consumes it.
    pub fn layout(&self) -> &StepLayout {
        &self.layout
    }

    pub fn page_size(&self) -> usize {
        self.layout.page_size
    }

    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    pub fn num_tokens(&self) -> usize {
        self.layout.input_ids.len()
    }

    /// The request of each row.
    pub fn req_ids(&self) -> impl ExactSizeIterator<Item = ReqId> + '_ {
        self.rows.iter().map(|r| r.id)
    }

    pub fn rows(&self) -> &[BatchRow] {
        &self.rows
    }

    /// `[num_tokens]` token ids to feed ([`Self::deferred`] ones hold 0).
    pub fn input_ids(&self) -> &[u32] {
        &self.layout.input_ids
    }

    /// `[num_tokens]` position of each token in its sequence.
    pub fn positions(&self) -> &[u32] {
        &self.layout.positions
    }

    /// `[num_tokens]` KV slot to write each token's keys and values to.
    pub fn out_loc(&self) -> &[u32] {
        &self.layout.out_loc
    }

    /// `[num_rows + 1]` offsets of each row's tokens in the flat arrays.
    pub fn q_indptr(&self) -> &[u32] {
        &self.layout.q_indptr
    }

    /// `[num_rows]` tokens fed per row.
    pub fn q_lens(&self) -> &[u32] {
        &self.q_lens
    }

    /// `[num_rows]` tokens each row attends to (cached + fed).
    pub fn kv_lens(&self) -> &[u32] {
        &self.layout.kv_lens
    }

    /// Width of [`Self::page_table`].
    pub fn max_num_pages(&self) -> usize {
        self.layout.width
    }

    /// `[num_rows, max_num_pages]` row-major page indices; entries past a
    /// row's pages are 0 and must not be read.
    pub fn page_table(&self) -> &[u32] {
        &self.layout.page_table
    }

    /// Rows that need logits (of their last token), in output order.
    pub fn logits_rows(&self) -> &[u32] {
        &self.layout.logits_rows
    }

    /// Sampling parameters for each logits row.
    pub fn sampling(&self) -> &[SamplingRow] {
        &self.sampling
    }

    /// Whether some sampling row has penalties or reports log probabilities:
    /// the step runs [`crate::core::engine::ModelRunner::forward`] unless the
    /// runner does them on its device ([`Self::extras`]).
    pub fn needs_host_logits(&self) -> bool {
        self.needs_host_logits
    }

    /// The penalties and log probabilities the runner computes on its device
    /// (empty unless [`Self::needs_host_logits`] and the runner
    /// [`samples_extras`](crate::core::engine::ModelRunner::samples_extras)).
    pub fn extras(&self) -> &StepExtras {
        &self.extras
    }

    /// Tokens whose ids the previous launched step is still sampling (overlap
    /// scheduling); empty when every id is in [`Self::input_ids`].
    pub fn deferred(&self) -> &[DeferredToken] {
        &self.deferred
    }

    /// Fills the deferred tokens from `sampled`, the previous step's tokens
    /// now known on the host.
    pub fn resolve_deferred(&mut self, sampled: &[u32]) {
        for d in self.deferred.drain(..) {
            self.layout.input_ids[d.token as usize] = sampled[d.row as usize];
        }
    }

    /// The requests of the sampling rows, in the order of [`Self::logits_rows`].
    pub fn sampling_req_ids(&self) -> impl ExactSizeIterator<Item = ReqId> + '_ {
        self.layout.logits_rows.iter().map(|&r| self.rows[r as usize].id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kvcache::{CacheKind, CacheManager};

    fn admitted(cm: &mut CacheManager, prompt: Vec<u32>, params: SamplingParams) -> Req {
        let pending = PendingReq::new(ReqId::new(1), prompt, params, 7);
        let m = cm.match_prefix(pending.token_ids());
        let pages = cm.acquire(m);
        pending.admit(pages, cm.page_size(), 0)
    }

    #[test]
    fn lengths_follow_chunks_and_steps() {
        let mut cm = CacheManager::new(4, 8, CacheKind::Naive);
        let mut req = admitted(&mut cm, vec![1, 2, 3, 4, 5], SamplingParams::greedy(2));
        assert_eq!((req.cached_len(), req.extend_len()), (0, 5));
        req.grow(5, &mut cm);
        assert!(req.is_prefilling());
        req.complete_chunk(3);
        assert_eq!((req.cached_len(), req.extend_len()), (3, 2));
        assert_eq!(req.complete_step(2, 9, &[0]), None);
        assert_eq!((req.cached_len(), req.extend_len(), req.num_outputs()), (5, 1, 1));
        assert!(!req.is_prefilling());
        assert_eq!(req.sampling_row().step, 1);
        assert_eq!(req.complete_step(1, 8, &[0]), Some(FinishReason::Length));
        let done = req.finish(FinishReason::Length, &mut cm);
        assert_eq!(done.output_ids, [9, 8]);
        cm.check_integrity();
        assert_eq!(cm.num_free_pages(), 8);
    }

    #[test]
    fn stop_conditions() {
        let mut cm = CacheManager::new(1, 64, CacheKind::Naive);
        let mut params = SamplingParams::greedy(10);
        params.stop_token_ids = Arc::from([42]);
        let mut req = admitted(&mut cm, vec![1], params.clone());
        req.grow(1, &mut cm);
        assert_eq!(req.complete_step(1, 0, &[0]), Some(FinishReason::Stop));
        req.finish(FinishReason::Stop, &mut cm);

        params.ignore_eos = true;
        let mut req = admitted(&mut cm, vec![1], params);
        req.grow(1, &mut cm);
        assert_eq!(req.complete_step(1, 0, &[0]), None);
        req.grow(1, &mut cm);
        assert_eq!(req.complete_step(1, 42, &[0]), Some(FinishReason::Stop));
        req.finish(FinishReason::Stop, &mut cm);
        cm.check_integrity();
        assert_eq!(cm.num_free_pages(), 64);
    }

    #[test]
    fn preemption_keeps_outputs_and_random_stream() {
        let mut cm = CacheManager::new(2, 8, CacheKind::Naive);
        let mut req = admitted(&mut cm, vec![5, 6, 7], SamplingParams::random(4, 1.0, 3));
        req.grow(3, &mut cm);
        assert_eq!(req.complete_step(3, 11, &[]), None);
        let row = req.sampling_row();
        let pending = req.preempt(&mut cm);
        assert_eq!(pending.token_ids(), [5, 6, 7, 11]);
        assert_eq!(pending.remaining_outputs(), 3);
        let m = cm.match_prefix(pending.token_ids());
        let pages = cm.acquire(m);
        let req = pending.admit(pages, 2, 1);
        assert_eq!(req.extend_len(), 4);
        assert_eq!(req.sampling_row(), row);
        req.finish(FinishReason::Abort, &mut cm);
        cm.check_integrity();
    }

    #[test]
    fn batch_phase_is_its_shape() {
        let row = |extend_len| BatchRow { id: ReqId::new(0), extend_len, samples: true };
        assert_eq!(Batch::new(vec![row(1), row(1)]).phase(), Phase::Decode);
        assert_eq!(Batch::new(vec![row(1), row(5)]).phase(), Phase::Prefill);
        assert_eq!(Batch::new(vec![row(1), row(5)]).num_tokens(), 6);
    }
}
