//! The one host layout of a step: built once by the engine's scheduler, read
//! as it is by the model (uploaded by [`ForwardBatch::from_layout`] or written
//! into persistent buffers by `graph_inputs::StepInputs`), never re-derived.
//!
//! Rows are sequences; the new tokens of all rows are concatenated. KV slot `s`
//! is token `s % page_size` of page `s / page_size`. Row `r` feeds the tokens
//! `q_indptr[r]..q_indptr[r + 1]` and attends to its first `kv_lens[r]` tokens,
//! found through `page_table[r * width..][..ceil(kv_lens[r] / page_size)]`; its
//! new tokens are the last of those.
//!
//! [`SeqStep`](crate::ctx::SeqStep) and [`ForwardBatch::new`] (per-sequence
//! slices, everything derived) stay for tests and tools that build a step by
//! hand, and as the oracle the scheduler's layout is tested against.
//!
//! [`ForwardBatch::from_layout`]: crate::ctx::ForwardBatch::from_layout
//! [`ForwardBatch::new`]: crate::ctx::ForwardBatch::new

use crate::error::{ModelError, Result};

/// One step's tokens, positions, KV slots and attention layout, on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLayout {
    /// Tokens per KV page the slots and the page table were computed for.
    pub page_size: usize,
    /// `[t]` token ids to feed. A token the previous step is still sampling
    /// (overlap scheduling) holds 0 here; the runner fills it on the device.
    pub input_ids: Vec<u32>,
    /// `[t]` position of each token in its sequence.
    pub positions: Vec<u32>,
    /// `[t]` KV slot each token's keys and values are written to.
    pub out_loc: Vec<u32>,
    /// `[b + 1]` offsets of each row's tokens.
    pub q_indptr: Vec<u32>,
    /// `[b]` tokens each row attends to (cached + fed).
    pub kv_lens: Vec<u32>,
    /// Columns of [`Self::page_table`].
    pub width: usize,
    /// `[b, width]` row-major pages of each row; entries past a row's pages
    /// are 0 and never read.
    pub page_table: Vec<u32>,
    /// Rows that get logits (of their last token), in output order.
    pub logits_rows: Vec<u32>,
}

impl StepLayout {
    /// Rows (sequences) of the step.
    pub fn num_rows(&self) -> usize {
        self.kv_lens.len()
    }

    /// New tokens of the step.
    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Tokens fed by row `r`.
    pub fn q_len(&self, r: usize) -> usize {
        (self.q_indptr[r + 1] - self.q_indptr[r]) as usize
    }

    /// The pages row `r` attends through.
    pub fn row_pages(&self, r: usize) -> &[u32] {
        let n = (self.kv_lens[r] as usize).div_ceil(self.page_size.max(1));
        &self.page_table[r * self.width..r * self.width + n]
    }

    /// Whether every row feeds exactly one token and gets logits, in row order
    /// (the shape CUDA graphs hold).
    pub fn is_plain_decode(&self) -> bool {
        let b = self.num_rows();
        self.num_tokens() == b
            && self.logits_rows.len() == b
            && self.logits_rows.iter().enumerate().all(|(i, &r)| r as usize == i)
    }

    /// The highest page the step reads or writes.
    pub fn max_page(&self) -> Option<u32> {
        (0..self.num_rows()).flat_map(|r| self.row_pages(r).iter().copied()).max()
    }

    /// Checks that the arrays agree in shape and fit 32-bit device indices, so
    /// that a bad layout is an error before any kernel reads it. The values
    /// themselves (positions, slots) are the scheduler's, tested against the
    /// per-sequence derivation.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(ModelError::Batch(what));
        let (b, t) = (self.num_rows(), self.num_tokens());
        if b == 0 {
            return bad("a step needs at least one sequence".into());
        }
        if self.page_size == 0 {
            return bad("page size 0".into());
        }
        if self.positions.len() != t || self.out_loc.len() != t {
            return bad(format!("{t} tokens but {} positions and {} slots", self.positions.len(), self.out_loc.len()));
        }
        if self.q_indptr.len() != b + 1 || self.q_indptr[0] != 0 || self.q_indptr[b] as usize != t {
            return bad(format!("q_indptr {:?} does not cut {t} tokens into {b} rows", self.q_indptr));
        }
        if self.page_table.len() != b * self.width {
            return bad(format!("a page table of {} entries for {b} rows of {}", self.page_table.len(), self.width));
        }
        for r in 0..b {
            let (start, end) = (self.q_indptr[r], self.q_indptr[r + 1]);
            let kv_len = self.kv_lens[r] as usize;
            if end <= start || kv_len < (end - start) as usize {
                return bad(format!("row {r} feeds {} tokens of {kv_len}", end.saturating_sub(start)));
            }
            if kv_len > self.width * self.page_size || kv_len > i32::MAX as usize {
                return bad(format!(
                    "row {r} has {kv_len} tokens but {} pages of {} hold only {}",
                    self.width,
                    self.page_size,
                    self.width * self.page_size
                ));
            }
        }
        if let Some(&r) = self.logits_rows.iter().find(|&&r| r as usize >= b) {
            return bad(format!("logits asked for row {r} of a step of {b}"));
        }
        let slots = self.max_page().map_or(0, |p| (p as usize + 1) * self.page_size);
        if slots > i32::MAX as usize || self.out_loc.iter().any(|&s| s > i32::MAX as u32) {
            return bad("the step does not fit 32-bit slots".into());
        }
        Ok(())
    }
}
