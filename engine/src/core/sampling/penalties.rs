//! Repetition, frequency and presence penalties: the logits processors of the
//! OpenAI API (`frequency_penalty`, `presence_penalty`) and of vLLM/SGLang and
//! transformers (`repetition_penalty`), applied to one request's logits row on
//! the host before sampling.
//!
//! With `count(t)` the number of times token `t` appears in the request's output
//! so far, in this order (vLLM's):
//!
//! 1. repetition: every token seen in the prompt or the output has its logit
//!    divided by `repetition` when positive and multiplied by it otherwise
//!    (transformers' `RepetitionPenaltyLogitsProcessor`); 1 is neutral;
//! 2. frequency and presence: `logit -= frequency * count(t) + presence * [count(t) > 0]`,
//!    over output tokens only (OpenAI's definition); 0 is neutral.

use std::collections::HashMap;

/// The penalties of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// > 0; 1 is neutral, > 1 discourages repeats.
    pub repetition: f32,
    /// Subtracted once per earlier occurrence in the output; 0 is neutral.
    pub frequency: f32,
    /// Subtracted once if the token occurred in the output; 0 is neutral.
    pub presence: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self::NONE
    }
}

impl Penalties {
    /// No penalty at all.
    pub const NONE: Penalties = Penalties { repetition: 1.0, frequency: 0.0, presence: 0.0 };

    /// Whether applying these changes nothing.
    pub fn is_neutral(&self) -> bool {
        self.repetition == 1.0 && self.frequency == 0.0 && self.presence == 0.0
    }

    /// Penalises `logits` (one row over the vocabulary) for a request whose
    /// tokens so far are `prompt` then `outputs`. Ids outside the row are
    /// ignored.
    pub fn apply(&self, logits: &mut [f32], prompt: &[u32], outputs: &[u32]) {
        if self.repetition != 1.0 {
            let mut seen = vec![false; logits.len()];
            for &t in prompt.iter().chain(outputs) {
                if let Some(s) = seen.get_mut(t as usize) {
                    *s = true;
                }
            }
            for (logit, _) in logits.iter_mut().zip(&seen).filter(|(_, &s)| s) {
                *logit = if *logit > 0.0 { *logit / self.repetition } else { *logit * self.repetition };
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in outputs {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(logit) = logits.get_mut(t as usize) {
                    *logit -= self.frequency * n as f32 + self.presence;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_penalties_change_nothing() {
        let mut row = vec![1.0, -2.0, 0.5];
        Penalties::NONE.apply(&mut row, &[0, 1], &[2, 2]);
        assert_eq!(row, [1.0, -2.0, 0.5]);
        assert!(Penalties::NONE.is_neutral());
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens() {
        let p = Penalties { repetition: 2.0, ..Penalties::NONE };
        let mut row = vec![4.0, -1.0, 3.0, 5.0];
        // Token 0 in the prompt, token 1 in the output (twice: still once), 9 is out of range.
        p.apply(&mut row, &[0, 9], &[1, 1]);
        assert_eq!(row, [2.0, -2.0, 3.0, 5.0]);
    }

    #[test]
    fn frequency_counts_output_occurrences_and_presence_counts_once() {
        let p = Penalties { frequency: 0.5, presence: 0.25, ..Penalties::NONE };
        let mut row = vec![0.0; 4];
        // The prompt's token 3 is not penalised by frequency or presence.
        p.apply(&mut row, &[3], &[1, 2, 2, 2]);
        assert_eq!(row, [0.0, -0.75, -1.75, 0.0]);
    }

    #[test]
    fn negative_frequency_and_presence_encourage_repeats() {
        let p = Penalties { frequency: -1.0, presence: -1.0, ..Penalties::NONE };
        let mut row = vec![0.0, 0.0];
        p.apply(&mut row, &[], &[1]);
        assert_eq!(row, [0.0, 2.0]);
    }
}
