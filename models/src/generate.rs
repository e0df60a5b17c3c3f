//! Greedy generation of one prompt: the smallest driver of a [`CausalLm`].
//!
//! The engine's scheduler batches many requests over a shared page pool; this is
//! the single-sequence version, with the pages of its own small cache handed out
//! contiguously, for `minisgl generate`-style offline use, examples and tests.

use kernel_runtime::ops;

use crate::causal_lm::CausalLm;
use crate::ctx::{ForwardBatch, LogitRows, SeqStep};
use crate::error::{ModelError, Result};

/// How [`greedy`] runs (no `Default`: pick each on purpose).
#[derive(Debug, Clone, Copy)]
pub struct GreedyOptions {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Tokens per KV page of the cache allocated for the run.
    pub page_size: usize,
    /// Stop after the first token that is one of the model's eos ids (it is
    /// included in the output).
    pub stop_at_eos: bool,
}

/// Generates up to `options.max_new_tokens` tokens after `prompt_ids` by always
/// taking the most likely one (the first on ties); returns the new ids only.
pub fn greedy(model: &dyn CausalLm, prompt_ids: &[u32], options: &GreedyOptions) -> Result<Vec<u32>> {
    if prompt_ids.is_empty() {
        return Err(ModelError::Batch("the prompt is empty".into()));
    }
    if options.max_new_tokens == 0 {
        return Ok(Vec::new());
    }
    // The last generated token is never fed back, so its K/V need no slot.
    let total = prompt_ids.len() + options.max_new_tokens - 1;
    if total > model.max_position_embeddings() {
        return Err(ModelError::Batch(format!(
            "{} prompt tokens + {} new tokens exceed max_position_embeddings = {}",
            prompt_ids.len(),
            options.max_new_tokens,
            model.max_position_embeddings()
        )));
    }
    let page_size = options.page_size.max(1);
    let num_pages = total.div_ceil(page_size);
    let kv = model.new_kv_cache(num_pages, page_size)?;
    let pages: Vec<u32> = (0..num_pages as u32).collect();

    let mut out = Vec::with_capacity(options.max_new_tokens);
    let mut cached_len = 0;
    let mut step: Vec<u32> = prompt_ids.to_vec();
    while out.len() < options.max_new_tokens {
        let seq = SeqStep { new_tokens: &step, cached_len, pages: &pages };
        let batch = ForwardBatch::new(&[seq], page_size, LogitRows::LastOfEachSequence, model.device())?;
        let logits = model.forward(&batch, &kv)?;
        let next = ops::argmax(&logits)?.to_vec::<i32>()?.first().copied().unwrap_or(0) as u32;
        out.push(next);
        if options.stop_at_eos && model.eos_token_ids().contains(&next) {
            break;
        }
        cached_len += step.len();
        step = vec![next];
    }
    Ok(out)
}
