//! The memory arithmetic of admission: how many pages a request may still
//! claim, given how much of its output the scheduler reserves for.
//!
//! mini-sglang admits a request only if its uncached prompt *plus its whole
//! `max_tokens`* fit next to what the running requests may still claim, so
//! decode never runs out of pages (and nothing is ever preempted) at the
//! price of admitting fewer requests. [`reserve_tokens`] generalises this
//! with a ratio: 1 is mini-sglang's policy, 0 reserves nothing beyond the
//! tokens a request already has, which admits as much as fits now and relies
//! on preemption when decode outgrows the pool (vLLM's policy). Values in
//! between trade the two, like SGLang's `new_token_ratio`.

use crate::core::kvcache::pages_for;

/// KV tokens to set aside for a request that holds `num_tokens` tokens and
/// may generate `remaining_outputs` more (>= 1), reserving `ratio` of its
/// future growth. Its last output is never fed back, hence the `- 1`: with
/// ratio 1 this is exactly the KV it can ever need.
pub fn reserve_tokens(num_tokens: usize, remaining_outputs: usize, ratio: f64) -> usize {
    assert!(remaining_outputs >= 1, "a live request can produce at least one more token");
    assert!((0.0..=1.0).contains(&ratio), "reserve ratio must be in [0, 1]");
    let growth = remaining_outputs - 1;
    num_tokens + (growth as f64 * ratio).ceil() as usize
}

/// Pages a request still needs for its reservation, given `num_pages` it
/// already has (possibly shared with the prefix cache).
pub fn pages_to_reserve(
    num_tokens: usize,
    remaining_outputs: usize,
    ratio: f64,
    num_pages: usize,
    page_size: usize,
) -> usize {
    pages_for(reserve_tokens(num_tokens, remaining_outputs, ratio), page_size).saturating_sub(num_pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_reservation_covers_the_whole_lifetime() {
        // 10 prompt tokens, 5 outputs: 14 tokens are ever fed.
        assert_eq!(reserve_tokens(10, 5, 1.0), 14);
        assert_eq!(pages_to_reserve(10, 5, 1.0, 0, 4), 4);
        assert_eq!(pages_to_reserve(10, 5, 1.0, 2, 4), 2);
        // One output left: only the tokens already known.
        assert_eq!(reserve_tokens(10, 1, 1.0), 10);
    }

    #[test]
    fn zero_reservation_covers_the_next_step_only() {
        assert_eq!(reserve_tokens(10, 100, 0.0), 10);
        assert_eq!(pages_to_reserve(10, 100, 0.0, 3, 4), 0);
        assert_eq!(pages_to_reserve(13, 100, 0.0, 3, 4), 1);
    }

    #[test]
    fn partial_reservation_rounds_up() {
        assert_eq!(reserve_tokens(10, 4, 0.5), 12);
        assert_eq!(reserve_tokens(10, 5, 0.3), 12);
    }
}
