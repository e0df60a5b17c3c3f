//! The argument types of paged attention ([`crate::ops::paged_attention`]): the
//! batch layout both implementations read, and the CUDA kernel choice.

use crate::tensor::Tensor;

/// The batch layout attention needs, as device (or host) tensors built by the
/// engine for one forward step.
#[derive(Debug, Clone)]
pub struct PagedAttnMeta<'a> {
    /// `[b + 1]` int32: new (query) tokens of sequence i are rows
    /// `q_indptr[i]..q_indptr[i + 1]` of q.
    pub q_indptr: &'a Tensor,
    /// `[b]` int32: tokens of sequence i in the cache after this step's store
    /// (cached prefix + new tokens).
    pub kv_lens: &'a Tensor,
    /// `[b, max_pages]` int32: page numbers of sequence i, in order.
    pub block_table: &'a Tensor,
    /// Host copies: query tokens and kv length of each sequence (for planning and
    /// the CPU path).
    pub q_lens_host: &'a [usize],
    pub kv_lens_host: &'a [usize],
    /// A fixed split count for the CUDA decode kernel, for steps captured in a
    /// CUDA graph: the launch must not depend on the lengths, which change at
    /// every replay, so each sequence is cut on the device into at most this many
    /// equal chunks. `None`: planned from `kv_lens_host` (eager steps).
    pub decode_splits: Option<usize>,
}

/// Which CUDA kernel computes paged attention (the CPU path ignores the choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AttnKernel {
    /// The decode kernel where the batch fits it, the prefill kernel for batches of
    /// long query runs, else the tile kernel.
    #[default]
    Auto,
    /// The FlashAttention-2 tile kernel (attention.cu), for every batch.
    Tile,
    /// The decode kernel (decode_attention.cu); a batch it cannot hold is an error.
    Decode,
    /// The prefill kernel (prefill_attention.cu: long query runs, bf16/f16, head
    /// dims 64, 128, 256), for every batch; another dtype or head dim is an error.
    Prefill,
}
