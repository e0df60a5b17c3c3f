//! The detokenizer thread: token ids in, text events out, off the engine thread.
//!
//! The engine thread only schedules and steps (mini-sglang runs a detokenizer
//! process for the same reason): it hands every generated token to this thread
//! ([`DetokMsg`]), which owns each request's [`TextStream`] (incremental
//! decoding and stop strings), sends the handler its [`Event`]s, and records the
//! per-token metrics. A matched stop string is reported back to the engine thread
//! (the request's id on the `ended` channel), which ends the request there; the tokens the engine
//! computed for it meanwhile (a step or two) arrive after the stop and are
//! dropped, never streamed, and the reported usage counts the tokens up to the
//! stop. The report travels on a channel of its own (not the command channel, so
//! that the engine thread still sees every handle gone when the server drops them).
//!
//! Every message about one request comes from the engine thread on one channel,
//! so a request's events keep their order: `Accepted` (sent by the engine thread
//! before any token can exist), then texts, then one `Finished` or `Failed`.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::events::{Event, Finished, TokenLogprob};
use super::metrics::Metrics;
use crate::core::req::{FinishReason, ReqId, TokenEvent};
use crate::text::text_stream::TextStream;
use crate::text::tokenizer::Tokenizer;

/// What the engine thread tells the detokenizer.
#[derive(Debug)]
pub enum DetokMsg {
    /// A request was accepted: its output state from now on.
    Start(Box<DetokRequest>),
    /// A generated token; `cached_tokens` is the request's prompt tokens served
    /// from the prefix cache (known once it is admitted).
    Token { event: TokenEvent, cached_tokens: usize },
    /// The request ended without a token: failed (or the server shut down) with
    /// `error`, or aborted because its client left (`None`: nobody to tell).
    End { id: ReqId, error: Option<ApiError> },
}

/// A request's output state, handed over at acceptance.
#[derive(Debug)]
pub struct DetokRequest {
    pub id: ReqId,
    pub events: UnboundedSender<Event>,
    pub text: TextStream,
    pub arrival: Instant,
    pub prompt_tokens: usize,
}

struct Streaming {
    req: DetokRequest,
    last_token: Option<Instant>,
    /// Tokens consumed so far (the completion tokens if a stop string ends it).
    tokens: usize,
}

/// The thread's state.
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    /// Back to the engine thread: requests to end (a stop string matched, or
    /// their output failed to decode).
    ended: mpsc::Sender<ReqId>,
    streams: HashMap<ReqId, Streaming>,
}

impl Detokenizer {
    pub fn new(tokenizer: Arc<Tokenizer>, metrics: Arc<Metrics>, ended: mpsc::Sender<ReqId>) -> Self {
        Self { tokenizer, metrics, ended, streams: HashMap::new() }
    }

    /// Handles messages until the engine thread hangs up.
    pub fn run(mut self, messages: mpsc::Receiver<DetokMsg>) {
        while let Ok(msg) = messages.recv() {
            self.handle(msg);
        }
        // The engine thread is gone: whoever still waits gets an answer.
        for (_, s) in self.streams.drain() {
            let _ = s.req.events.send(Event::Failed(ApiError::ShuttingDown));
        }
    }

    fn handle(&mut self, msg: DetokMsg) {
        match msg {
            DetokMsg::Start(req) => {
                self.streams.insert(req.id, Streaming { req: *req, last_token: None, tokens: 0 });
            }
            DetokMsg::Token { event, cached_tokens } => self.token(event, cached_tokens),
            DetokMsg::End { id, error } => {
                let Some(s) = self.streams.remove(&id) else {
                    return;
                };
                match error {
                    None => {
                        self.metrics.record_finished(FinishReason::Abort, s.req.prompt_tokens, s.req.arrival.elapsed())
                    }
                    Some(err) => {
                        if err == ApiError::ShuttingDown {
                            let elapsed = s.req.arrival.elapsed();
                            self.metrics.record_finished(FinishReason::Abort, s.req.prompt_tokens, elapsed);
                        } else {
                            self.metrics.record_failed();
                        }
                        let _ = s.req.events.send(Event::Failed(err));
                    }
                }
            }
        }
    }

    /// Turns one token into text for its request (the logic the engine loop
    /// used to run inline).
    fn token(&mut self, event: TokenEvent, cached_tokens: usize) {
        let now = Instant::now();
        // A token after a stop string ended the request: computed while the stop
        // travelled to the engine thread; dropped.
        let Some(s) = self.streams.get_mut(&event.id) else {
            return;
        };
        match s.last_token {
            None => self.metrics.record_first_token(now - s.req.arrival),
            Some(last) => self.metrics.record_next_token(now - last),
        }
        s.last_token = Some(now);
        s.tokens += 1;
        let tokenizer = &*self.tokenizer;
        if let Some(lp) = &event.logprobs {
            let text = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
            let _ = s.req.events.send(Event::Logprobs(TokenLogprob {
                token: text(lp.token),
                logprob: lp.logprob,
                top: lp.top.iter().map(|&(id, p)| (text(id), p)).collect(),
            }));
        }
        let delta = match s.req.text.push(tokenizer, event.token) {
            Ok(delta) => delta,
            Err(err) => return self.fail(event.id, event.finished.is_none(), &err),
        };
        if let Some(finished) = event.finished {
            // The engine ended it (EOS, stop token, max_tokens).
            let mut text = delta.text;
            let mut reason = finished.reason;
            if delta.stopped {
                reason = FinishReason::Stop;
            } else {
                match s.req.text.finish(tokenizer) {
                    Ok(rest) => {
                        text.push_str(&rest.text);
                        if rest.stopped {
                            reason = FinishReason::Stop;
                        }
                    }
                    Err(err) => return self.fail(event.id, false, &err),
                }
            }
            let usage = (finished.prompt_len, finished.output_ids.len(), finished.cached_tokens);
            self.complete(event.id, text, reason, usage);
        } else if delta.stopped {
            // A stop string: the engine ends it when this arrives; until then its
            // tokens are dropped above (the request is no longer streamed).
            let _ = self.ended.send(event.id);
            let usage = (s.req.prompt_tokens, s.tokens, cached_tokens);
            self.complete(event.id, delta.text, FinishReason::Stop, usage);
        } else if !delta.text.is_empty() {
            let _ = s.req.events.send(Event::Text(delta.text));
        }
    }

    /// Sends the request's last event; `usage` is (prompt, completion, cached)
    /// tokens.
    fn complete(&mut self, id: ReqId, text: String, reason: FinishReason, usage: (usize, usize, usize)) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        let (prompt_tokens, completion_tokens, cached_tokens) = usage;
        self.metrics.record_finished(reason, prompt_tokens, s.req.arrival.elapsed());
        let _ = s.req.events.send(Event::Finished(Finished {
            text,
            reason,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
        }));
    }

    /// Fails one request (its output could not be detokenized), and has the
    /// engine abort it if it still runs.
    fn fail(&mut self, id: ReqId, still_running: bool, err: &dyn std::fmt::Display) {
        if still_running {
            let _ = self.ended.send(id);
        }
        if let Some(s) = self.streams.remove(&id) {
            self.metrics.record_failed();
            let _ = s.req.events.send(Event::Failed(ApiError::Internal(err.to_string())));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::core::req::FinishedReq;

    fn event(id: ReqId, token: u32) -> DetokMsg {
        DetokMsg::Token { event: TokenEvent { id, token, logprobs: None, finished: None }, cached_tokens: 3 }
    }

    /// A stop string ends the stream at once and is reported to the engine; the
    /// tokens computed before the engine sees it are never streamed, and the
    /// usage counts the tokens up to the stop.
    #[test]
    fn tokens_after_a_stop_string_are_dropped() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny");
        let tokenizer = Arc::new(Tokenizer::from_dir(&dir).unwrap());
        let ids = tokenizer.encode("one two three four five", false).unwrap();
        let (ended_tx, ended_rx) = mpsc::channel();
        let mut d = Detokenizer::new(tokenizer.clone(), Arc::new(Metrics::new()), ended_tx);
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let id = ReqId::new(7);
        let text = TextStream::new(crate::text::tokenizer::StopStrings::new([" three"]).unwrap(), true);
        d.handle(DetokMsg::Start(Box::new(DetokRequest {
            id,
            events: events_tx,
            text,
            arrival: Instant::now(),
            prompt_tokens: 5,
        })));
        for &t in &ids {
            d.handle(event(id, t));
        }
        // The engine's own end of the request arrives later still.
        let finished =
            FinishedReq { id, reason: FinishReason::Length, prompt_len: 5, output_ids: ids.clone(), cached_tokens: 3 };
        d.handle(DetokMsg::Token {
            event: TokenEvent { id, token: ids[0], logprobs: None, finished: Some(finished) },
            cached_tokens: 3,
        });
        assert_eq!(ended_rx.try_iter().collect::<Vec<_>>(), [id], "the engine is told once");
        let mut streamed = String::new();
        let mut last = None;
        while let Ok(e) = events.try_recv() {
            match e {
                Event::Text(t) => streamed.push_str(&t),
                Event::Finished(f) => last = Some(f),
                other => panic!("unexpected event {other:?}"),
            }
        }
        let f = last.expect("a Finished event");
        streamed.push_str(&f.text);
        assert_eq!(streamed, "one two");
        assert_eq!(f.reason, FinishReason::Stop);
        let upto_stop = tokenizer.encode("one two three", false).unwrap().len();
        assert_eq!((f.prompt_tokens, f.completion_tokens, f.cached_tokens), (5, upto_stop, 3));
        assert!(d.streams.is_empty());
    }
}
