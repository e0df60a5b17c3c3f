//! Log probabilities of sampled tokens, for the API's `logprobs` and
//! `top_logprobs`.
//!
//! They are the model's own distribution: `log_softmax` of the raw logits row,
//! before penalties, temperature and truncation (vLLM's default,
//! `raw_logprobs`), so that they describe the model rather than the sampler
//! settings, and a greedy and a sampled request report the same numbers.

/// The log probability of one sampled token and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token.
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens with their log probabilities, most likely
    /// first (lower id first on ties); may include the sampled token.
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)[token]` and the `top_n` most likely tokens. NaN logits
/// count as impossible (-inf).
pub fn token_logprobs(logits: &[f32], token: u32, top_n: usize) -> TokenLogprobs {
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = logits.iter().copied().map(clean).fold(f32::NEG_INFINITY, f32::max);
    let log_sum = if max.is_finite() {
        let sum: f64 = logits.iter().map(|&v| (f64::from(clean(v)) - f64::from(max)).exp()).sum();
        f64::from(max) + sum.ln()
    } else {
        // No finite logit: every token is as (im)possible as any other.
        f64::INFINITY
    };
    let logprob = |i: usize| -> f32 {
        match logits.get(i).copied().map(clean) {
            Some(v) if v.is_finite() && log_sum.is_finite() => (f64::from(v) - log_sum) as f32,
            _ => f32::NEG_INFINITY,
        }
    };
    let top = if top_n == 0 {
        Vec::new()
    } else {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let by_logit = |a: &usize, b: &usize| clean(logits[*b]).total_cmp(&clean(logits[*a])).then(a.cmp(b));
        let n = top_n.min(order.len());
        if n < order.len() {
            order.select_nth_unstable_by(n, by_logit);
            order.truncate(n);
        }
        order.sort_by(by_logit);
        order.into_iter().map(|i| (i as u32, logprob(i))).collect()
    };
    TokenLogprobs { token, logprob: logprob(token as usize), top }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax_and_top_is_ordered() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lse = (1f64.exp() + 3f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let lp = token_logprobs(&logits, 2, 3);
        assert!((f64::from(lp.logprob) - (2.0 - lse)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert!((f64::from(lp.top[0].1) - (3.0 - lse)).abs() < 1e-6);
        let total: f64 = (0..4).map(|i| f64::from(token_logprobs(&logits, i, 0).logprob).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn top_n_beyond_the_vocabulary_lists_every_token() {
        let lp = token_logprobs(&[0.0, 0.0], 0, 20);
        assert_eq!(lp.top.len(), 2);
        assert!(token_logprobs(&[0.0, 0.0], 1, 0).top.is_empty());
    }

    #[test]
    fn masked_and_nan_logits_are_impossible() {
        let lp = token_logprobs(&[0.0, f32::NEG_INFINITY, f32::NAN], 1, 3);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert_eq!(lp.top[0], (0, 0.0));
        assert_eq!(token_logprobs(&[0.0, f32::NAN], 1, 0).logprob, f32::NEG_INFINITY);
        // An id outside the row has no probability either.
        assert_eq!(token_logprobs(&[0.0], 5, 0).logprob, f32::NEG_INFINITY);
    }
}
