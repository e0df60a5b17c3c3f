//! Server metrics in the Prometheus text format (`GET /metrics`).
//!
//! The engine thread records request outcomes, token counts and latencies
//! as they happen and publishes a snapshot of the engine's load after every
//! iteration; handlers record rejected requests. One mutex guards it all:
//! it is taken a few times per step, which is noise next to a forward pass,
//! and it keeps every scrape consistent. Names follow vLLM's and SGLang's
//! (`time_to_first_token_seconds`, `num_requests_running`, ...) with a
//! `minisgl_` prefix.

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::core::engine::EngineStats;
use crate::core::req::FinishReason;

/// Bucket bounds (seconds) of the time-to-first-token histogram: vLLM's,
/// plus finer ones for small models and the CPU path.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
];
/// Bucket bounds (seconds) of the inter-token-latency histogram.
const ITL_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0];
/// Bucket bounds (seconds) of the end-to-end request latency histogram.
const E2E_BUCKETS: &[f64] =
    &[0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0];

/// Bucket bounds (seconds) of the engine step time histogram.
const STEP_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Bucket bounds of the rows-per-step histogram (the CUDA graph buckets' scale).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 224.0, 256.0, 512.0];

#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per bucket; the last one is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, value: f64) {
        let idx = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        self.counts[idx] += 1;
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b}"),
                None => "+Inf".to_owned(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct State {
    finished_stop: u64,
    finished_length: u64,
    finished_abort: u64,
    failed: u64,
    rejected: u64,
    prompt_tokens: u64,
    /// Prompt tokens of requests whose first output arrived (so, prefilled).
    prefilled_tokens: u64,
    generation_tokens: u64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    step_time: Histogram,
    step_rows: Histogram,
    engine: Option<EngineStats>,
}

/// Running token totals (see [`Metrics::token_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    pub prefilled: u64,
    pub generated: u64,
}

/// The server's counters, histograms and the latest engine snapshot.
#[derive(Debug)]
pub struct Metrics {
    state: Mutex<State>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                finished_stop: 0,
                finished_length: 0,
                finished_abort: 0,
                failed: 0,
                rejected: 0,
                prompt_tokens: 0,
                prefilled_tokens: 0,
                generation_tokens: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                step_time: Histogram::new(STEP_BUCKETS),
                step_rows: Histogram::new(BATCH_BUCKETS),
                engine: None,
            }),
        }
    }

    /// The state, even if a thread panicked while holding the lock: counters
    /// stay meaningful, and `/metrics` must keep answering.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record_first_token(&self, ttft: Duration) {
        let mut s = self.lock();
        s.ttft.observe(ttft.as_secs_f64());
        s.generation_tokens += 1;
    }

    pub fn record_next_token(&self, itl: Duration) {
        let mut s = self.lock();
        s.itl.observe(itl.as_secs_f64());
        s.generation_tokens += 1;
    }

    /// One engine step: its wall time and the rows (requests) it ran.
    pub fn record_step(&self, time: Duration, rows: usize) {
        let mut s = self.lock();
        s.step_time.observe(time.as_secs_f64());
        s.step_rows.observe(rows as f64);
    }

    /// A request ended (including aborts by a disconnected client).
    pub fn record_finished(&self, reason: FinishReason, prompt_tokens: usize, e2e: Duration) {
        let mut s = self.lock();
        match reason {
            FinishReason::Stop => s.finished_stop += 1,
            FinishReason::Length => s.finished_length += 1,
            FinishReason::Abort => s.finished_abort += 1,
        }
        s.prompt_tokens += prompt_tokens as u64;
        s.e2e.observe(e2e.as_secs_f64());
    }

    /// A request failed inside the server (model runner error, shutdown).
    pub fn record_failed(&self) {
        self.lock().failed += 1;
    }

    /// A request's prompt was prefilled (its first output arrived).
    pub fn record_prefilled(&self, prompt_tokens: usize) {
        self.lock().prefilled_tokens += prompt_tokens as u64;
    }

    /// Prompt tokens prefilled and tokens generated since start, for rates.
    pub fn token_counts(&self) -> TokenCounts {
        let s = self.lock();
        TokenCounts { prefilled: s.prefilled_tokens, generated: s.generation_tokens }
    }

    /// A request was refused with a 4xx.
    pub fn record_rejected(&self) {
        self.lock().rejected += 1;
    }

    pub fn publish_engine(&self, stats: EngineStats) {
        self.lock().engine = Some(stats);
    }

    /// The latest engine snapshot (none before the engine thread started).
    pub fn engine_stats(&self) -> Option<EngineStats> {
        self.lock().engine
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let s = self.lock();
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        };

        let name = "minisgl_requests_total";
        let _ = writeln!(out, "# HELP {name} Requests that ended, by finish reason (abort: the client went away or the server aborted it; error: the server failed it).");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (reason, value) in
            [("stop", s.finished_stop), ("length", s.finished_length), ("abort", s.finished_abort), ("error", s.failed)]
        {
            let _ = writeln!(out, "{name}{{finish_reason=\"{reason}\"}} {value}");
        }
        counter(
            &mut out,
            "minisgl_requests_rejected_total",
            "Requests refused with a 4xx error before reaching the engine.",
            s.rejected,
        );
        counter(&mut out, "minisgl_prompt_tokens_total", "Prompt tokens of the requests that ended.", s.prompt_tokens);
        counter(&mut out, "minisgl_generation_tokens_total", "Tokens generated.", s.generation_tokens);

        let e = s.engine.unwrap_or_default();
        gauge(&mut out, "minisgl_num_requests_waiting", "Requests queued for admission.", e.num_waiting as u64);
        gauge(&mut out, "minisgl_num_requests_running", "Requests admitted (the running batch).", e.num_running as u64);
        gauge(&mut out, "minisgl_kv_pages_total", "KV cache pages in the pool.", e.num_pages as u64);
        gauge(&mut out, "minisgl_kv_pages_used", "KV pages held by running requests.", e.used_pages as u64);
        gauge(&mut out, "minisgl_kv_pages_free", "KV pages in the free list.", e.free_pages as u64);
        gauge(&mut out, "minisgl_kv_pages_cached", "KV pages held by the prefix cache.", e.cached_pages as u64);
        gauge(
            &mut out,
            "minisgl_kv_pages_evictable",
            "Prefix-cache pages no request uses (reclaimable).",
            e.evictable_pages as u64,
        );
        counter(
            &mut out,
            "minisgl_prefix_cache_hit_tokens_total",
            "Prompt tokens served from the prefix cache.",
            e.cache_hit_tokens,
        );
        counter(&mut out, "minisgl_engine_steps_total", "Engine steps (forward passes).", e.num_steps);
        counter(&mut out, "minisgl_preemptions_total", "Requests preempted to free KV pages.", e.num_preempted);
        s.ttft.render(
            &mut out,
            "minisgl_time_to_first_token_seconds",
            "Time from submission to the first generated token.",
        );
        s.itl.render(&mut out, "minisgl_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
        s.e2e.render(&mut out, "minisgl_e2e_request_latency_seconds", "Time from submission to the end of a request.");
        s.step_time.render(
            &mut out,
            "minisgl_step_time_seconds",
            "Wall time of one engine step (schedule, forward, sample).",
        );
        s.step_rows.render(&mut out, "minisgl_step_batch_size", "Requests (rows) in one engine step.");
        out
    }
}

/// Reads one unlabelled sample (`name value`) from an exposition, for tests
/// and tools.
pub fn parse_sample(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::new();
        m.record_first_token(Duration::from_millis(3));
        m.record_first_token(Duration::from_secs(100));
        m.record_finished(FinishReason::Stop, 7, Duration::from_millis(20));
        let text = m.render();
        assert!(text.contains("minisgl_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("minisgl_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("minisgl_requests_total{finish_reason=\"stop\"} 1"));
        assert_eq!(parse_sample(&text, "minisgl_prompt_tokens_total"), Some(7.0));
        assert_eq!(parse_sample(&text, "minisgl_generation_tokens_total"), Some(2.0));
        assert_eq!(parse_sample(&text, "minisgl_time_to_first_token_seconds_count"), Some(2.0));
    }
}
