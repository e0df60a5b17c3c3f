//! [`SampleRow`], the sampling settings of one row, shared by `ops::sample`, its
//! CPU reference and its CUDA launcher.

/// The sampling settings of one row (see sampling.cu for the exact rules).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow {
    /// 0 is greedy (argmax, first index on ties).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the smallest head of the ranking whose mass reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; 0 keeps all.
    pub min_p: f32,
    /// The uniform number of the draw, in `[0, 1)`.
    pub u: f32,
}

impl SampleRow {
    /// Greedy.
    pub fn greedy() -> SampleRow {
        SampleRow { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, u: 0.0 }
    }
}

/// Bit of a penalty counter set when the token is in the request's prompt
/// (penalty_count.cu's kPromptBit); the bits below it count output occurrences.
pub const PROMPT_BIT: i32 = 1 << 30;

/// What `ops::penalty_count` records for each (slot, token) entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountKind {
    /// One more occurrence in the output.
    Output = 0,
    /// The token is in the prompt.
    Prompt = 1,
}

/// One logits row that `ops::apply_penalties` penalises, from the counters of
/// its penalty slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PenaltyRow {
    /// The logits row.
    pub row: u32,
    /// Its row of counters.
    pub slot: u32,
    /// > 0; 1 is neutral.
    pub repetition: f32,
    /// Subtracted per output occurrence; 0 is neutral.
    pub frequency: f32,
    /// Subtracted once when the token occurred in the output; 0 is neutral.
    pub presence: f32,
}

/// The most alternatives `ops::logprobs` reports per row (logprobs.cu's
/// kMaxTopLogprobs; OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Columns of one row of `ops::logprobs`' output for `top_n` alternatives: the
/// token, its log probability's bits, then `top_n` (id, bits) pairs.
pub fn logprobs_cols(top_n: usize) -> usize {
    2 + 2 * top_n
}

/// One decoded row of `ops::logprobs`' output.
#[derive(Clone, Debug, PartialEq)]
pub struct RowLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first; at most the vocabulary's size.
    pub top: Vec<(u32, f32)>,
}

impl RowLogprobs {
    /// Decodes `row` (`logprobs_cols(top_n)` or more words) of a vocabulary of
    /// `vocab` tokens, keeping the first `top_n` alternatives that exist.
    pub fn decode(row: &[i32], top_n: usize, vocab: usize) -> RowLogprobs {
        let word = |i: usize| row.get(i).copied().unwrap_or(0);
        let top = (0..top_n.min(vocab))
            .map(|k| (word(2 + 2 * k), f32::from_bits(word(3 + 2 * k) as u32)))
            .filter(|&(id, _)| id >= 0 && (id as usize) < vocab)
            .map(|(id, lp)| (id as u32, lp))
            .collect();
        RowLogprobs { token: word(0).max(0) as u32, logprob: f32::from_bits(word(1) as u32), top }
    }
}
