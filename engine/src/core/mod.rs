//! The serving core: everything between token ids in and token ids out.
//!
//! | module | what |
//! | --- | --- |
//! | [`req`] | `PendingReq`, `Req` (private lengths, named transitions), `Batch` -> `PreparedBatch`, sampling parameters |
//! | [`kvcache`] | the page pool and the prefix caches (radix, naive) behind `CacheManager` |
//! | [`scheduler`] | admission, chunked prefill, prefill-first or mixed steps, preemption |
//! | [`grammar`] | constrained decoding: a request's `Grammar` (llguidance) and a step's `TokenMasks` |
//! | [`sampling`] | the CPU sampler, with [`sampling::penalties`] and [`sampling::logprobs`] |
//! | [`runner`] | `CausalLmRunner`: a `models::CausalLm` as a `ModelRunner` (GPU sampling) |
//! | [`device_tokens`] | sampled ids kept on the GPU for the next step (overlap scheduling) |
//! | [`engine`] | `Engine`: `add_request`, `step` (overlapped or not), `abort`, `finish`, `generate` |
//! | [`tp`] | tensor parallelism across processes: rendezvous, control channel, `TpRunner`, the worker loop |
//!
//! Nothing here knows about text, HTTP or the terminal (see `crate::text` and
//! `crate::frontend`).

pub mod device_tokens;
pub mod engine;
pub mod grammar;
pub mod kvcache;
pub mod req;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod tp;
