//! What the server's threads tell a request's handler: the [`Event`]s of one
//! request, in order. The engine thread (acceptance, rejection, failures) and
//! the detokenizer thread (text, log probabilities, the end) both send them, so
//! they live below both.

use crate::core::engine::EngineError;
use crate::core::req::FinishReason;

use super::error::ApiError;

/// What the engine thread tells a request's handler, in order: one of
/// `Accepted`/`Rejected`/`Failed`, then (if accepted) `Text`s and one
/// `Finished` or `Failed`; with log probabilities asked for, each token's
/// `Logprobs` comes before the `Text` or `Finished` it is part of.
#[derive(Debug)]
pub enum Event {
    /// Queued in the engine, with its final `max_tokens`.
    Accepted {
        max_tokens: usize,
    },
    /// Refused by the engine's validation (too long, bad token ids, ...).
    Rejected(EngineError),
    /// New output text (never empty).
    Text(String),
    /// The log probabilities of one generated token (its text may come later:
    /// an incomplete UTF-8 character, or a possible stop string, is held back).
    Logprobs(TokenLogprob),
    Finished(Finished),
    /// The server failed or cancelled the request.
    Failed(ApiError),
}

/// A generated token's log probability and the most likely alternatives, as
/// text (each token decoded alone, as vLLM does; a token that is part of a
/// UTF-8 character decodes to U+FFFD).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// The end of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The last piece of text (possibly empty).
    pub text: String,
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}
