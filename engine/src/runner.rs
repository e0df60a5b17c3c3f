//! The bridge between the engine and a `models::CausalLm`: turns the scheduler's
//! [`PreparedBatch`] (host vectors) into a `models::ForwardBatch` on the model's
//! device, runs the forward pass over the runner-owned KV cache, and returns the
//! logits rows the sampler needs as f32 on the host.

use kernel_runtime::Tensor;
use models::{CausalLm, ForwardBatch, KvCache, LogitRows, SeqStep};

use crate::core::PreparedBatch;
use crate::engine::{ModelRunner, RunnerError};
use crate::sampling::Logits;

/// A loaded model with its KV cache: the engine's [`ModelRunner`].
#[derive(Debug)]
pub struct CausalLmRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
    /// Longest sequence served (`max_position_embeddings`, or less if asked).
    max_context_len: usize,
}

impl CausalLmRunner {
    /// Wraps `model` with a KV cache of `num_pages` pages of `page_size` tokens.
    pub fn new(model: Box<dyn CausalLm>, num_pages: usize, page_size: usize, max_context_len: usize) -> models::Result<Self> {
        let kv = model.new_kv_cache(num_pages, page_size)?;
        Ok(Self { model, kv, max_context_len })
    }

    /// The model.
    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    /// The KV cache (for tests and diagnostics).
    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }
}

impl ModelRunner for CausalLmRunner {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        let page_size = batch.page_size();
        let width = batch.max_num_pages();
        let (ids, indptr, q_lens, kv_lens, table) =
            (batch.input_ids(), batch.q_indptr(), batch.q_lens(), batch.kv_lens(), batch.page_table());
        let mut seqs = Vec::with_capacity(batch.num_rows());
        for r in 0..batch.num_rows() {
            let (start, q_len, kv_len) = (indptr[r] as usize, q_lens[r] as usize, kv_lens[r] as usize);
            let num_pages = kv_len.div_ceil(page_size);
            seqs.push(SeqStep {
                new_tokens: &ids[start..start + q_len],
                cached_len: kv_len - q_len,
                pages: &table[r * width..r * width + num_pages],
            });
        }
        let forward = ForwardBatch::new(&seqs, page_size, LogitRows::LastOfEachSequence, self.model.device())?;
        let logits = self.model.forward(&forward, &self.kv)?;
        // Logits of every row's last token came back; keep the rows that sample.
        let wanted: Vec<i32> = batch.logits_rows().iter().map(|&r| r as i32).collect();
        let selected = if wanted.len() == batch.num_rows() {
            logits
        } else {
            let rows = Tensor::from_slice(&wanted, &[wanted.len()], logits.device())?;
            kernel_runtime::ops::embedding(&logits.contiguous()?, &rows, 0)?
        };
        let vocab = selected.dim(1);
        Ok(Logits::new(selected.to_f32_vec()?, vocab))
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn max_context_len(&self) -> usize {
        self.max_context_len
    }
}
