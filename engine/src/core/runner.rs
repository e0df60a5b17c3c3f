//! The bridge between the engine and a `models::CausalLm`: turns the scheduler's
//! [`PreparedBatch`] (host vectors) into a `models::ForwardBatch` on the model's
//! device, runs the forward pass over the runner-owned KV cache, and samples: on
//! a GPU with `kernel_runtime::ops::sample` (only token ids cross to the host), on
//! the CPU by handing the logits rows to the engine's sampler.

use kernel_runtime::ops::SampleRow;
use kernel_runtime::{Device, Tensor};
use models::{CausalLm, ForwardBatch, KvCache, LogitRows, SeqStep};

use crate::core::engine::{ModelRunner, RunnerError};
use crate::core::req::PreparedBatch;
use crate::core::sampling::{self, Logits, SamplingRow};

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
    pub fn new(
        model: Box<dyn CausalLm>,
        num_pages: usize,
        page_size: usize,
        max_context_len: usize,
    ) -> models::Result<Self> {
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

impl CausalLmRunner {
    /// The forward pass: logits of the rows that sample, `[logits_rows, vocab]`,
    /// left on the model's device.
    fn logits(&mut self, batch: &PreparedBatch) -> Result<Tensor, RunnerError> {
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
        // Logits only for the rows that sample (not for mid-prefill chunks).
        let rows: Vec<usize> = batch.logits_rows().iter().map(|&r| r as usize).collect();
        let forward = ForwardBatch::new(&seqs, page_size, LogitRows::LastOf(rows), self.model.device())?;
        Ok(self.model.forward(&forward, &self.kv)?)
    }
}

/// The kernel's settings for one sampling row, with the engine's uniform number
/// for the row's (seed, output index), so that seeds reproduce on the GPU too.
fn sample_row(row: &SamplingRow) -> SampleRow {
    // f32 rounding could turn 1 - 2^-53 into 1.0: keep u below 1.
    let u = (sampling::uniform(row.seed, row.step) as f32).min(1.0 - f32::EPSILON / 2.0);
    SampleRow {
        temperature: row.temperature,
        top_k: row.top_k.map_or(0, |k| k.min(1 << 24) as u32),
        top_p: row.top_p,
        min_p: row.min_p,
        u,
    }
}

impl ModelRunner for CausalLmRunner {
    fn forward(&mut self, batch: &PreparedBatch) -> Result<Logits, RunnerError> {
        let logits = self.logits(batch)?;
        let vocab = logits.dim(1);
        Ok(Logits::new(logits.to_f32_vec()?, vocab))
    }

    /// On a GPU the logits stay there and only token ids come back; on the CPU the
    /// engine's sampler runs on the host logits.
    fn forward_sample(&mut self, batch: &PreparedBatch) -> Result<Option<Vec<u32>>, RunnerError> {
        if self.model.device() == Device::Cpu {
            return Ok(None);
        }
        let logits = self.logits(batch)?;
        let rows: Vec<SampleRow> = batch.sampling().iter().map(sample_row).collect();
        Ok(Some(kernel_runtime::ops::sample(&logits, &rows)?))
    }

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn max_context_len(&self) -> usize {
        self.max_context_len
    }
}
