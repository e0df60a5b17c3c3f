//! Constrained decoding: a request's grammar state, and the token masks of a
//! step.
//!
//! A request that must follow a grammar (a JSON schema, a tool-call format)
//! carries a [`Grammar`]: an `llguidance` matcher that the front end compiled
//! for the tokenizer. Before each step that samples for it, the engine asks the
//! grammar which tokens may come next ([`Grammar::fill_mask`]); the sampler
//! (on the host, or the GPU kernel `token_mask`) sets the logits of the others
//! to -inf; after the step the sampled token advances the grammar
//! ([`Grammar::advance`]).
//!
//! Masks are packed bits, 32 tokens a `u32` word, bit `t % 32` of word `t / 32`
//! set when token `t` is allowed (llguidance's own layout, so a mask is copied,
//! never converted). [`TokenMasks`] holds the masks of the rows of one step
//! that have a grammar; rows without one are not in it and cost nothing.
//!
//! Computing a mask is host work of tens to hundreds of microseconds; it
//! depends only on the tokens sampled so far, so an engine that overlaps the
//! host with the forward pass can compute it while the GPU runs (see
//! `Engine::token_masks`).

use std::fmt;

use llguidance::Matcher;

/// Words of a packed mask over `vocab_size` tokens.
pub fn mask_words(vocab_size: usize) -> usize {
    vocab_size.div_ceil(32)
}

/// Whether token `t` is allowed by a packed mask (tokens past its end are not).
pub fn mask_allows(mask: &[u32], t: u32) -> bool {
    mask.get(t as usize / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
}

/// Sets the logits of the tokens `mask` does not allow to -inf: the host path
/// of the `token_mask` kernel (same contract: tokens past the mask's end are
/// disallowed).
pub fn apply_token_mask(logits: &mut [f32], mask: &[u32]) {
    for (chunk_idx, chunk) in logits.chunks_mut(32).enumerate() {
        let word = mask.get(chunk_idx).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        for (bit, logit) in chunk.iter_mut().enumerate() {
            if word >> bit & 1 == 0 {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// One request's grammar: what it may generate next.
pub struct Grammar {
    matcher: Matcher,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammar").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Grammar {
    /// Wraps a matcher the front end built (and checked) for this model's
    /// tokenizer.
    pub fn new(matcher: Matcher) -> Self {
        Self { matcher }
    }

    /// Writes the packed mask of the tokens allowed next into `out` (one
    /// step's row, [`mask_words`] of the model's vocabulary). A grammar that is
    /// complete allows only its end-of-sequence token; one that failed (its
    /// limits were hit) allows only that too, which ends the request.
    pub fn fill_mask(&mut self, out: &mut [u32]) {
        out.fill(0);
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => {
                let words = mask.as_slice();
                let n = words.len().min(out.len());
                out[..n].copy_from_slice(&words[..n]);
            }
            Err(_) => {
                if let Ok(env) = self.matcher.tok_env() {
                    set_bit(out, env.tok_trie().eos_token());
                }
            }
        }
        if out.iter().all(|&w| w == 0) {
            // Nothing allowed (a failed matcher whose environment is gone, or
            // an end token outside the model's vocabulary): allow everything
            // rather than sample from an empty set; `advance` ends the request.
            out.fill(u32::MAX);
        }
    }

    /// Feeds the sampled token. Returns `true` when the grammar is done (it
    /// reached its end, or failed), and so the request should end.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.matcher.is_stopped() {
            return true;
        }
        // An error puts the matcher in its error state, which `is_stopped`
        // reports; the request then ends like a completed one.
        let _ = self.matcher.consume_token(token);
        self.matcher.is_stopped()
    }

    /// Why the matcher failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

fn set_bit(mask: &mut [u32], t: u32) {
    if let Some(w) = mask.get_mut(t as usize / 32) {
        *w |= 1 << (t % 32);
    }
}

/// The token masks of one step: one packed mask per logits row that has a
/// grammar (`rows[i]` is the logits row of mask `i`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMasks {
    words_per_row: usize,
    rows: Vec<u32>,
    bits: Vec<u32>,
}

impl TokenMasks {
    /// Masks over `vocab_size` tokens, none yet.
    pub fn new(vocab_size: usize) -> Self {
        Self { words_per_row: mask_words(vocab_size), rows: Vec::new(), bits: Vec::new() }
    }

    /// Masks over `vocab_size` tokens for the logits rows `rows`, all zero
    /// (nothing allowed) until filled through [`Self::bits_mut`].
    pub fn zeroed(vocab_size: usize, rows: Vec<u32>) -> Self {
        let words_per_row = mask_words(vocab_size);
        Self { words_per_row, bits: vec![0; rows.len() * words_per_row], rows }
    }

    /// Every mask's words, to fill (as [`Self::bits`]).
    pub fn bits_mut(&mut self) -> &mut [u32] {
        &mut self.bits
    }

    /// Adds the mask of logits row `row`, returning its words to fill.
    pub fn push_row(&mut self, row: u32) -> &mut [u32] {
        self.rows.push(row);
        let start = self.bits.len();
        self.bits.resize(start + self.words_per_row, 0);
        &mut self.bits[start..]
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn words_per_row(&self) -> usize {
        self.words_per_row
    }

    /// The logits row of each mask.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    /// Every mask, `[rows().len(), words_per_row()]`, row-major.
    pub fn bits(&self) -> &[u32] {
        &self.bits
    }

    /// Mask `i` (of logits row `rows()[i]`).
    pub fn mask(&self, i: usize) -> &[u32] {
        &self.bits[i * self.words_per_row..(i + 1) * self.words_per_row]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_keeps_exactly_the_allowed_tokens() {
        let vocab = 70;
        let mut mask = vec![0u32; mask_words(vocab)];
        for t in [0u32, 5, 31, 32, 69] {
            set_bit(&mut mask, t);
        }
        let mut logits: Vec<f32> = (0..vocab).map(|i| i as f32).collect();
        apply_token_mask(&mut logits, &mask);
        for (t, &l) in logits.iter().enumerate() {
            assert_eq!(l.is_finite(), mask_allows(&mask, t as u32), "token {t}");
        }
        // A mask shorter than the row disallows the rest.
        let mut logits = vec![0.0f32; 40];
        apply_token_mask(&mut logits, &[u32::MAX]);
        assert!(logits[..32].iter().all(|l| l.is_finite()) && logits[32..].iter().all(|l| l.is_infinite()));
    }

    #[test]
    fn masks_are_laid_out_per_row() {
        let mut m = TokenMasks::new(33);
        m.push_row(3)[1] = 1;
        m.push_row(0)[0] = 7;
        assert_eq!((m.words_per_row(), m.rows()), (2, &[3, 0][..]));
        assert_eq!(m.bits(), [0, 1, 7, 0]);
        assert_eq!(m.mask(1), [7, 0]);
    }
}
