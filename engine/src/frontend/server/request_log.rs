//! One log line per finished request, written on the HTTP side where the
//! response is completed (the engine thread stays free of logging).
//!
//! Each choice of a request gets a [`RequestLog`]: it notes when the first
//! output arrives (time to first token, as the client sees it) and, at the
//! end, logs the prompt and output token counts, the time to first token,
//! the output rate and the finish reason. A choice whose handler goes away
//! before the end (the client disconnected) is logged as aborted when its log
//! is dropped. The first output also counts the prompt's tokens as prefilled
//! in [`Metrics`], for the periodic throughput line ([`super::stats_log`]).

use std::sync::Arc;
use std::time::Instant;

use super::engine_loop::Finished;
use super::metrics::Metrics;
use super::response::finish_reason_str;

/// The log of one choice, from submission to its end.
pub struct RequestLog {
    id: String,
    prompt_tokens: usize,
    arrival: Instant,
    first_output: Option<Instant>,
    finished: bool,
    metrics: Arc<Metrics>,
}

impl RequestLog {
    /// `id` is the response's id (with `-N` for choice N of several).
    pub fn new(id: String, prompt_tokens: usize, arrival: Instant, metrics: Arc<Metrics>) -> Self {
        Self { id, prompt_tokens, arrival, first_output: None, finished: false, metrics }
    }

    /// Any output event (text, log probabilities, the end): the first one
    /// marks the time to first token.
    pub fn on_output(&mut self) {
        if self.first_output.is_none() {
            self.first_output = Some(Instant::now());
            self.metrics.record_prefilled(self.prompt_tokens);
        }
    }

    /// The choice ended: logs its line.
    pub fn finish(&mut self, f: &Finished) {
        self.on_output();
        self.finished = true;
        let now = Instant::now();
        let total = now.duration_since(self.arrival).as_secs_f64();
        let ttft = self.first_output.unwrap_or(now).duration_since(self.arrival).as_secs_f64();
        tracing::info!(
            "request {} finished: prompt {} tokens ({} cached), output {} tokens, ttft {:.3}s, {:.1} tok/s, {:.2}s, finish_reason {}",
            self.id,
            f.prompt_tokens,
            f.cached_tokens,
            f.completion_tokens,
            ttft,
            f.completion_tokens as f64 / total.max(1e-9),
            total,
            finish_reason_str(f.reason)
        );
    }

    /// The choice failed in the server (its error goes to the client).
    pub fn fail(&mut self, why: &str) {
        self.finished = true;
        tracing::warn!("request {} failed after {:.2}s: {why}", self.id, self.arrival.elapsed().as_secs_f64());
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if !self.finished {
            tracing::info!(
                "request {} aborted after {:.2}s: the client went away",
                self.id,
                self.arrival.elapsed().as_secs_f64()
            );
        }
    }
}
