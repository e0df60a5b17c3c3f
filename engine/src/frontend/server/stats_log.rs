//! The periodic load line while the server is busy, as vLLM and SGLang print:
//! running and waiting requests, KV cache use, and prompt and generation
//! throughput over the last interval.
//!
//! A tokio task reads the shared [`Metrics`] (the engine thread publishes
//! its load there after every step), so the engine loop does no logging.
//! An idle interval (nothing running or waiting, no token made) prints
//! nothing, so an idle server's log stays quiet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{Metrics, TokenCounts};

/// Logs one line every `interval` while there is work, until the task is
/// dropped.
pub async fn run(metrics: Arc<Metrics>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut last = (Instant::now(), metrics.token_counts());
    loop {
        ticker.tick().await;
        let now = (Instant::now(), metrics.token_counts());
        if let Some(line) = line(&metrics, last, now) {
            tracing::info!("{line}");
        }
        last = now;
    }
}

/// The line for the interval from `last` to `now`, or `None` when it was idle.
fn line(metrics: &Metrics, last: (Instant, TokenCounts), now: (Instant, TokenCounts)) -> Option<String> {
    let stats = metrics.engine_stats()?;
    let seconds = now.0.duration_since(last.0).as_secs_f64().max(1e-9);
    let prefilled = now.1.prefilled.saturating_sub(last.1.prefilled);
    let generated = now.1.generated.saturating_sub(last.1.generated);
    if stats.num_running == 0 && stats.num_waiting == 0 && prefilled == 0 && generated == 0 {
        return None;
    }
    let kv_share = 100.0 * stats.used_pages as f64 / stats.num_pages.max(1) as f64;
    Some(format!(
        "load: {} running, {} waiting, KV {}/{} pages ({kv_share:.1}%), prompt {:.1} tok/s, generation {:.1} tok/s",
        stats.num_running,
        stats.num_waiting,
        stats.used_pages,
        stats.num_pages,
        prefilled as f64 / seconds,
        generated as f64 / seconds,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::engine::EngineStats;

    fn stats(num_running: usize, used_pages: usize) -> EngineStats {
        EngineStats {
            num_waiting: 1,
            num_running,
            num_pages: 200,
            used_pages,
            free_pages: 200 - used_pages,
            cached_pages: 0,
            evictable_pages: 0,
            cache_hit_tokens: 0,
            num_steps: 0,
            num_preempted: 0,
            num_finished: 0,
            ..EngineStats::default()
        }
    }

    #[test]
    fn the_line_has_the_load_and_the_rates_of_the_interval() {
        let m = Metrics::new();
        let t0 = Instant::now();
        let before = m.token_counts();
        m.record_prefilled(30);
        for _ in 0..20 {
            m.record_next_token(Duration::from_millis(1));
        }
        m.publish_engine(stats(2, 50));
        let line = line(&m, (t0, before), (t0 + Duration::from_secs(2), m.token_counts())).unwrap();
        assert_eq!(
            line,
            "load: 2 running, 1 waiting, KV 50/200 pages (25.0%), prompt 15.0 tok/s, generation 10.0 tok/s"
        );
    }

    #[test]
    fn an_idle_interval_prints_nothing() {
        let m = Metrics::new();
        let mut idle = stats(0, 0);
        idle.num_waiting = 0;
        m.publish_engine(idle);
        let t0 = Instant::now();
        let c = m.token_counts();
        assert_eq!(line(&m, (t0, c), (t0 + Duration::from_secs(1), c)), None);
    }
}
