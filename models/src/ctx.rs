//! The forward context: what one model step reads besides the weights.
//!
//! | type | what |
//! | --- | --- |
//! | [`ForwardBatch`] | one step's tokens, positions, KV slots and attention layout, on the device |
//! | [`KvCache`] | the paged K and V caches of every layer |
//! | [`AttnBackend`] | how a layer stores its new K/V and attends (implementations: `attn_backend`) |
//! | [`ForwardCtx`] | the three above, borrowed for one forward call |
//!
//! There is no global context (mini-sglang's `get_global_ctx`): the engine builds a
//! `ForwardBatch` per step from its scheduler and passes it, with the cache, to
//! `CausalLm::forward`, which threads a `ForwardCtx` through the layers. Models
//! keep no per-request state; the cache is owned by the caller, and which pages a
//! sequence uses is decided by the caller's page allocator and written down in
//! the batch's block table.

use std::any::Any;

use kernel_runtime::ops::PagedAttnMeta;
use kernel_runtime::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::layout::StepLayout;

/// Which rows of the step's hidden states get logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitRows {
    /// The last new token of every sequence (serving: one next token each).
    LastOfEachSequence,
    /// Every new token (tests, prompt log-probabilities).
    All,
    /// The last new token of the listed sequences (indices into the batch), in
    /// this order: the sequences that sample this step, leaving out those in the
    /// middle of a chunked prefill.
    LastOf(Vec<usize>),
}

/// One sequence's part of a step: its new tokens, how many of its tokens the
/// cache already holds, and its pages.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    /// Token ids to run this step (a prompt chunk, or one decode token).
    pub new_tokens: &'a [u32],
    /// Tokens of the sequence already in the KV cache (positions `0..cached_len`).
    pub cached_len: usize,
    /// The sequence's pages in order; they must cover `cached_len + new_tokens.len()`
    /// tokens. Token at position p lives in slot `pages[p / page_size] * page_size +
    /// p % page_size`.
    pub pages: &'a [u32],
}

/// One forward step of a batch of sequences, with its tensors on the device.
///
/// Built by [`ForwardBatch::new`], which derives positions, KV slots (`out_loc`)
/// and the attention metadata from per-sequence [`SeqStep`]s so that they cannot
/// disagree with each other. Fields are private so that the invariants hold:
/// every sequence has at least one new token, its pages cover its tokens, and the
/// device tensors match the host copies.
#[derive(Debug)]
pub struct ForwardBatch {
    /// `[t]` i32 token ids of the new tokens, sequence after sequence.
    input_ids: Tensor,
    /// `[t]` i32 position of each new token.
    positions: Tensor,
    /// `[t]` i32 KV slot (`page * page_size + offset`) each new token is stored in.
    out_loc: Tensor,
    /// `[b + 1]` i32 offsets of each sequence's rows.
    q_indptr: Tensor,
    /// `[b]` i32 cached + new tokens per sequence.
    kv_lens: Tensor,
    /// `[b, max_pages]` i32 pages per sequence (padded with page 0).
    block_table: Tensor,
    /// `[n]` i32 rows to compute logits for; `None` for every row.
    logit_rows: Option<Tensor>,
    input_ids_host: Vec<u32>,
    q_lens: Vec<usize>,
    kv_lens_host: Vec<usize>,
    num_logit_rows: usize,
    page_size: usize,
    max_page: Option<u32>,
    device: Device,
    /// The decode kernel's fixed split count (CUDA graphs); `None`: planned per step.
    decode_splits: Option<usize>,
}

/// The parts of a [`ForwardBatch`] whose tensors something else filled (the
/// persistent step inputs of `graph_inputs`), checked by that builder.
pub(crate) struct BatchParts {
    pub input_ids: Tensor,
    pub positions: Tensor,
    pub out_loc: Tensor,
    pub q_indptr: Tensor,
    pub kv_lens: Tensor,
    pub block_table: Tensor,
    /// `None`: logits of every row.
    pub logit_rows: Option<Tensor>,
    pub input_ids_host: Vec<u32>,
    pub q_lens: Vec<usize>,
    pub kv_lens_host: Vec<usize>,
    pub num_logit_rows: usize,
    pub page_size: usize,
    pub max_page: Option<u32>,
    pub decode_splits: Option<usize>,
}

impl ForwardBatch {
    /// A batch over tensors already on the device.
    pub(crate) fn from_parts(p: BatchParts) -> ForwardBatch {
        ForwardBatch {
            device: p.input_ids.device(),
            input_ids: p.input_ids,
            positions: p.positions,
            out_loc: p.out_loc,
            q_indptr: p.q_indptr,
            kv_lens: p.kv_lens,
            block_table: p.block_table,
            logit_rows: p.logit_rows,
            input_ids_host: p.input_ids_host,
            q_lens: p.q_lens,
            kv_lens_host: p.kv_lens_host,
            num_logit_rows: p.num_logit_rows,
            page_size: p.page_size,
            max_page: p.max_page,
            decode_splits: p.decode_splits,
        }
    }

    /// The scheduler's layout of a step, uploaded to `device` as it is (fresh
    /// tensors; the engine's runner writes persistent buffers instead, through
    /// `graph_inputs::StepInputs`).
    pub fn from_layout(layout: &StepLayout, device: Device) -> Result<ForwardBatch> {
        layout.check()?;
        let i32s = |v: &[u32]| -> Vec<i32> { v.iter().map(|&x| x as i32).collect() };
        let (b, t) = (layout.num_rows(), layout.num_tokens());
        let width = layout.width.max(1);
        let table = if layout.width == 0 { vec![0; b] } else { i32s(&layout.page_table) };
        let logit_rows: Vec<i32> =
            layout.logits_rows.iter().map(|&r| layout.q_indptr[r as usize + 1] as i32 - 1).collect();
        Ok(ForwardBatch {
            input_ids: Tensor::from_slice(&i32s(&layout.input_ids), &[t], device)?,
            positions: Tensor::from_slice(&i32s(&layout.positions), &[t], device)?,
            out_loc: Tensor::from_slice(&i32s(&layout.out_loc), &[t], device)?,
            q_indptr: Tensor::from_slice(&i32s(&layout.q_indptr), &[b + 1], device)?,
            kv_lens: Tensor::from_slice(&i32s(&layout.kv_lens), &[b], device)?,
            block_table: Tensor::from_slice(&table, &[b, width], device)?,
            num_logit_rows: logit_rows.len(),
            logit_rows: Some(Tensor::from_slice(&logit_rows, &[logit_rows.len()], device)?),
            input_ids_host: layout.input_ids.clone(),
            q_lens: (0..b).map(|r| layout.q_len(r)).collect(),
            kv_lens_host: layout.kv_lens.iter().map(|&l| l as usize).collect(),
            page_size: layout.page_size,
            max_page: layout.max_page(),
            device,
            decode_splits: None,
        })
    }

    /// A batch of `seqs` for a cache of pages of `page_size` tokens, uploaded to
    /// `device`.
    pub fn new(seqs: &[SeqStep<'_>], page_size: usize, logits: LogitRows, device: Device) -> Result<ForwardBatch> {
        if seqs.is_empty() {
            return Err(ModelError::Batch("a batch needs at least one sequence".into()));
        }
        if page_size == 0 {
            return Err(ModelError::Batch("page size 0".into()));
        }
        let num_tokens: usize = seqs.iter().map(|s| s.new_tokens.len()).sum();
        let max_pages = seqs.iter().map(|s| s.pages.len()).max().unwrap_or(0).max(1);
        let mut input_ids = Vec::with_capacity(num_tokens);
        let mut positions = Vec::with_capacity(num_tokens);
        let mut out_loc = Vec::with_capacity(num_tokens);
        let mut q_indptr = vec![0i32];
        let mut q_lens = Vec::with_capacity(seqs.len());
        let mut kv_lens = Vec::with_capacity(seqs.len());
        let mut block_table = vec![0i32; seqs.len() * max_pages];
        for (i, s) in seqs.iter().enumerate() {
            let q_len = s.new_tokens.len();
            let kv_len = s.cached_len + q_len;
            if q_len == 0 {
                return Err(ModelError::Batch(format!("sequence {i} has no new tokens")));
            }
            if kv_len > s.pages.len() * page_size {
                return Err(ModelError::Batch(format!(
                    "sequence {i} has {kv_len} tokens but {} pages of {page_size} hold only {}",
                    s.pages.len(),
                    s.pages.len() * page_size
                )));
            }
            if kv_len > i32::MAX as usize
                || (s.pages.iter().max().copied().unwrap_or(0) as usize + 1) * page_size > i32::MAX as usize
            {
                return Err(ModelError::Batch(format!("sequence {i} does not fit 32-bit positions and slots")));
            }
            for (j, &page) in s.pages.iter().enumerate() {
                block_table[i * max_pages + j] = page as i32;
            }
            for p in s.cached_len..kv_len {
                positions.push(p as i32);
                out_loc.push((s.pages[p / page_size] as usize * page_size + p % page_size) as i32);
            }
            input_ids.extend_from_slice(s.new_tokens);
            q_indptr.push(q_indptr[i] + q_len as i32);
            q_lens.push(q_len);
            kv_lens.push(kv_len);
        }
        let logit_rows: Option<Vec<i32>> = match logits {
            LogitRows::All => None,
            LogitRows::LastOfEachSequence => Some(q_indptr[1..].iter().map(|&end| end - 1).collect()),
            LogitRows::LastOf(which) => {
                if let Some(&bad) = which.iter().find(|&&i| i >= seqs.len()) {
                    return Err(ModelError::Batch(format!(
                        "logits asked for sequence {bad} of a batch of {}",
                        seqs.len()
                    )));
                }
                Some(which.iter().map(|&i| q_indptr[i + 1] - 1).collect())
            }
        };
        let ids_i32: Vec<i32> = input_ids.iter().map(|&id| id as i32).collect();
        let kv_lens_i32: Vec<i32> = kv_lens.iter().map(|&l| l as i32).collect();
        let b = seqs.len();
        Ok(ForwardBatch {
            input_ids: Tensor::from_slice(&ids_i32, &[num_tokens], device)?,
            positions: Tensor::from_slice(&positions, &[num_tokens], device)?,
            out_loc: Tensor::from_slice(&out_loc, &[num_tokens], device)?,
            q_indptr: Tensor::from_slice(&q_indptr, &[b + 1], device)?,
            kv_lens: Tensor::from_slice(&kv_lens_i32, &[b], device)?,
            block_table: Tensor::from_slice(&block_table, &[b, max_pages], device)?,
            num_logit_rows: logit_rows.as_ref().map_or(num_tokens, Vec::len),
            logit_rows: logit_rows.map(|rows| Tensor::from_slice(&rows, &[rows.len()], device)).transpose()?,
            max_page: seqs.iter().flat_map(|s| s.pages.iter().copied()).max(),
            input_ids_host: input_ids,
            q_lens,
            kv_lens_host: kv_lens,
            page_size,
            device,
            decode_splits: None,
        })
    }

    /// The decode kernel's fixed split count, if the step is captured in (or
    /// replays) a CUDA graph.
    pub fn decode_splits(&self) -> Option<usize> {
        self.decode_splits
    }

    /// New tokens in the step (rows of the hidden states).
    pub fn num_tokens(&self) -> usize {
        self.input_ids_host.len()
    }

    /// Sequences in the step.
    pub fn num_seqs(&self) -> usize {
        self.q_lens.len()
    }

    /// `[t]` i32 token ids.
    pub fn input_ids(&self) -> &Tensor {
        &self.input_ids
    }

    /// The token ids on the host.
    pub fn input_ids_host(&self) -> &[u32] {
        &self.input_ids_host
    }

    /// `[t]` i32 positions.
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }

    /// `[t]` i32 KV slot of each new token.
    pub fn out_loc(&self) -> &Tensor {
        &self.out_loc
    }

    /// New tokens per sequence.
    pub fn q_lens(&self) -> &[usize] {
        &self.q_lens
    }

    /// Cached + new tokens per sequence (after this step's store).
    pub fn kv_lens(&self) -> &[usize] {
        &self.kv_lens_host
    }

    /// The page size the slots and block table were computed for.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The highest page number used, if any.
    pub fn max_page(&self) -> Option<u32> {
        self.max_page
    }

    /// Whether every sequence runs exactly one token (a decode step).
    pub fn is_decode(&self) -> bool {
        self.q_lens.iter().all(|&l| l == 1)
    }

    /// The rows logits are computed for (`None`: every row).
    pub fn logit_rows(&self) -> Option<&Tensor> {
        self.logit_rows.as_ref()
    }

    /// The number of logit rows the forward returns.
    pub fn num_logit_rows(&self) -> usize {
        self.num_logit_rows
    }

    /// The device the tensors live on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The layout `ops::paged_attention` reads.
    pub fn attn_meta(&self) -> PagedAttnMeta<'_> {
        PagedAttnMeta {
            q_indptr: &self.q_indptr,
            kv_lens: &self.kv_lens,
            block_table: &self.block_table,
            q_lens_host: &self.q_lens,
            kv_lens_host: &self.kv_lens_host,
            decode_splits: self.decode_splits,
        }
    }
}

/// The size of a paged KV cache (rule: a config struct, not five integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    pub num_layers: usize,
    pub num_pages: usize,
    pub page_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheShape {
    /// Bytes of K and V of one page over all layers, in `dtype` (for sizing the
    /// pool from a memory budget).
    pub fn bytes_per_page(&self, dtype: DType) -> usize {
        2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * dtype.size_in_bytes()
    }
}

/// Per-layer K and V caches, each `[num_pages, page_size, num_kv_heads, head_dim]`.
///
/// The cache is only memory: which pages belong to which sequence is the
/// caller's business (its page allocator and radix tree), told to the model in
/// each [`ForwardBatch`].
#[derive(Debug)]
pub struct KvCache {
    shape: KvCacheShape,
    dtype: DType,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl KvCache {
    /// A zeroed cache of `shape` in `dtype` on `device`.
    pub fn new(shape: KvCacheShape, dtype: DType, device: Device) -> Result<KvCache> {
        if shape.page_size == 0 || shape.num_pages == 0 {
            return Err(ModelError::Batch(format!("a KV cache needs pages of at least one token, got {shape:?}")));
        }
        let dims = [shape.num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim];
        let mut k = Vec::with_capacity(shape.num_layers);
        let mut v = Vec::with_capacity(shape.num_layers);
        for _ in 0..shape.num_layers {
            k.push(Tensor::zeros(&dims, dtype, device)?);
            v.push(Tensor::zeros(&dims, dtype, device)?);
        }
        Ok(KvCache { shape, dtype, k, v })
    }

    /// The K and V caches of layer `layer_idx`.
    pub fn layer(&self, layer_idx: usize) -> Result<(&Tensor, &Tensor)> {
        match (self.k.get(layer_idx), self.v.get(layer_idx)) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => Err(ModelError::Batch(format!(
                "layer {layer_idx} is outside a KV cache of {} layers",
                self.shape.num_layers
            ))),
        }
    }

    /// The cache's dimensions.
    pub fn shape(&self) -> &KvCacheShape {
        &self.shape
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.shape.page_size
    }

    /// Pages per layer.
    pub fn num_pages(&self) -> usize {
        self.shape.num_pages
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the cache lives (that of its first layer; a cache of no layers is
    /// on the CPU).
    pub fn device(&self) -> Device {
        self.k.first().map_or(Device::Cpu, Tensor::device)
    }
}

/// Whatever an attention backend computes once per step and reads in every
/// layer (work splits, merged indices). The paged backend needs none.
#[derive(Default)]
pub struct AttnPlan(Option<Box<dyn Any + Send + Sync>>);

impl AttnPlan {
    /// A plan holding `value`.
    pub fn new<T: Any + Send + Sync>(value: T) -> AttnPlan {
        AttnPlan(Some(Box::new(value)))
    }

    /// The plan's value, if it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.as_ref().and_then(|b| b.downcast_ref())
    }
}

impl std::fmt::Debug for AttnPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "AttnPlan(..)" } else { "AttnPlan(none)" })
    }
}

/// One layer's attention inputs: q `[t, heads_q, d]` and the new k, v `[t,
/// heads_kv, d]` (views of the fused QKV projection, rotated), and the softmax
/// scale.
#[derive(Debug, Clone, Copy)]
pub struct AttnInputs<'t> {
    pub layer_idx: usize,
    pub q: &'t Tensor,
    pub k: &'t Tensor,
    pub v: &'t Tensor,
    pub scale: f32,
    /// The layer already wrote the rotated k and v into `ctx.kv`'s layer at the
    /// batch's `out_loc` slots (the fused `ops::rope_store`); the backend must not
    /// store them again (`k` then holds the unrotated keys).
    pub kv_stored: bool,
}

/// An attention implementation: stores a layer's new K/V in the cache and
/// attends over the cache (after mini-sglang's `BaseAttnBackend`).
///
/// Kept small on purpose: one per-step hook, one per-layer call, and whether its
/// decode steps can be captured in a CUDA graph.
pub trait AttnBackend: Send + Sync + std::fmt::Debug {
    /// The backend's `--attn` name.
    fn name(&self) -> &'static str;

    /// Whether a decode step launches the same work whatever its lengths, given
    /// the batch's fixed split count ([`ForwardBatch::decode_splits`]), so that a
    /// CUDA graph captured once replays it correctly (the decode kernel does; the
    /// tile kernel plans from the lengths on the host). The caller also checks
    /// that the model's heads fit the decode kernel.
    fn decode_graph_safe(&self) -> bool {
        false
    }

    /// Prepares a step; called once per forward before the first layer.
    fn plan(&self, batch: &ForwardBatch) -> Result<AttnPlan>;

    /// Stores `inputs.k`/`inputs.v` at the batch's `out_loc` slots of layer
    /// `inputs.layer_idx` (unless `inputs.kv_stored`), then returns the attention
    /// output `[t, heads_q, d]`.
    fn forward(&self, ctx: &ForwardCtx<'_>, inputs: AttnInputs<'_>) -> Result<Tensor>;

    /// The layer's attention prologue `rope` (q/k norm, rotary embedding, the
    /// store of k and v into the caches: `ops::rope_store`, whose q, k, v are
    /// `inputs`') and then [`AttnBackend::forward`], as one call, so that a backend
    /// can run both in one launch. The default runs them apart. `inputs.q`
    /// afterwards holds either the rotated or the given queries.
    fn forward_rope(
        &self,
        ctx: &ForwardCtx<'_>,
        inputs: AttnInputs<'_>,
        rope: &kernel_runtime::ops::RopeStore<'_>,
    ) -> Result<Tensor> {
        kernel_runtime::ops::rope_store(rope)?;
        self.forward(ctx, AttnInputs { kv_stored: true, ..inputs })
    }
}

/// Everything a layer reads besides its weights, for one forward call.
#[derive(Debug, Clone, Copy)]
pub struct ForwardCtx<'a> {
    pub batch: &'a ForwardBatch,
    pub kv: &'a KvCache,
    pub attn: &'a dyn AttnBackend,
    pub plan: &'a AttnPlan,
}

/// Checks that a step and a KV cache fit a model (`config`, compute `dtype`,
/// `device`), so that a mismatch is an error naming it rather than an op failing
/// deep inside a layer. Every model's `forward` starts with it.
pub fn check_step(
    c: &crate::config::ModelConfig,
    dtype: DType,
    device: Device,
    batch: &ForwardBatch,
    kv: &KvCache,
) -> Result<()> {
    let s = kv.shape();
    if (s.num_layers, s.num_kv_heads, s.head_dim) != (c.num_hidden_layers, c.num_key_value_heads, c.head_dim) {
        return Err(ModelError::Batch(format!(
            "KV cache of {} layers x {} heads x {} dims does not fit the model's {} x {} x {}",
            s.num_layers, s.num_kv_heads, s.head_dim, c.num_hidden_layers, c.num_key_value_heads, c.head_dim
        )));
    }
    if kv.dtype() != dtype || kv.device() != device || batch.device() != device {
        return Err(ModelError::Batch(format!(
            "model runs {} on {}, KV cache is {} on {}, batch is on {}",
            dtype,
            device,
            kv.dtype(),
            kv.device(),
            batch.device()
        )));
    }
    if batch.page_size() != kv.page_size() {
        return Err(ModelError::Batch(format!(
            "batch built for pages of {} tokens, cache has {}",
            batch.page_size(),
            kv.page_size()
        )));
    }
    if let Some(page) = batch.max_page().filter(|&p| p as usize >= kv.num_pages()) {
        return Err(ModelError::Batch(format!("page {page} is outside the KV cache of {} pages", kv.num_pages())));
    }
    if let Some(&id) = batch.input_ids_host().iter().find(|&&id| id as usize >= c.vocab_size) {
        return Err(ModelError::Batch(format!("token id {id} is outside the vocabulary of {}", c.vocab_size)));
    }
    if let Some(&len) = batch.kv_lens().iter().find(|&&l| l > c.max_position_embeddings) {
        return Err(ModelError::Batch(format!(
            "a sequence of {len} tokens exceeds max_position_embeddings = {}",
            c.max_position_embeddings
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_derives_slots_and_layout() {
        let (a, b) = ([5u32, 6, 7], [9u32]);
        let seqs = [
            SeqStep { new_tokens: &a, cached_len: 2, pages: &[3, 1] },
            SeqStep { new_tokens: &b, cached_len: 4, pages: &[0, 2] },
        ];
        let batch = ForwardBatch::new(&seqs, 4, LogitRows::LastOfEachSequence, Device::Cpu).unwrap();
        assert_eq!(batch.positions().to_vec::<i32>().unwrap(), [2, 3, 4, 4]);
        // Positions 2, 3 in page 3; 4 in page 1; the second sequence's 4 in page 2.
        assert_eq!(batch.out_loc().to_vec::<i32>().unwrap(), [14, 15, 4, 8]);
        assert_eq!(batch.logit_rows().unwrap().to_vec::<i32>().unwrap(), [2, 3]);
        assert_eq!((batch.num_tokens(), batch.num_logit_rows(), batch.kv_lens()), (4, 2, &[5usize, 5][..]));
        assert!(!batch.is_decode());
        assert_eq!(batch.max_page(), Some(3));

        let short = [SeqStep { new_tokens: &a, cached_len: 6, pages: &[0, 1] }];
        let e = ForwardBatch::new(&short, 4, LogitRows::All, Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("9 tokens but 2 pages of 4 hold only 8"), "{e}");
        let empty = [SeqStep { new_tokens: &[], cached_len: 0, pages: &[0] }];
        assert!(ForwardBatch::new(&empty, 4, LogitRows::All, Device::Cpu).is_err());
    }
}
