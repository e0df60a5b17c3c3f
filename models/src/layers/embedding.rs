//! The token embedding and the LM head, both vocab-parallel.
//!
//! Both are `[vocab_size, hidden]` matrices; with `tie_word_embeddings` the head
//! shares the embedding's tensor (no copy). `vocab_size` is the config's, which
//! may exceed the tokenizer's (padded vocabularies): the extra rows are real rows
//! of the matrices, and their logits are simply never produced by the tokenizer.
//!
//! Under tensor parallelism each rank holds its vocabulary rows
//! (`tp::Shard::vocab`), padded with zero rows to the same count on every rank.
//! The embedding looks up its own ids (`ops::embedding` zeroes the others') and
//! all-reduces; the head computes its rows' logits and all-gathers them into
//! the full row on every rank, cutting the padding off.

use kernel_runtime::{ops, Tensor};

use crate::error::Result;
use crate::tp::{TpGroup, VocabShard};
use crate::weights::{Slice, VarBuilder};

/// This rank's rows of `name.weight` `[vocab_size, hidden]`, padded with zeros.
fn load_vocab_rows(vb: &VarBuilder<'_>, name: &str, vocab_size: usize, hidden: usize) -> Result<(Tensor, VocabShard)> {
    let shard = vb.tp().shard();
    let rows = shard.vocab(vocab_size);
    if !shard.is_split() {
        return Ok((vb.pp(name).get("weight", &[vocab_size, hidden])?, rows));
    }
    let own = vb.pp(name).get_slice(
        "weight",
        &[vocab_size, hidden],
        Some(Slice::of(0, rows.start..rows.start + rows.len)),
    )?;
    if rows.len == rows.padded {
        return Ok((own, rows));
    }
    let padded = Tensor::zeros(&[rows.padded, hidden], own.dtype(), own.device())?;
    if rows.len > 0 {
        ops::copy(&padded.narrow(0, 0, rows.len)?, &own)?;
    }
    Ok((padded, rows))
}

/// Token embedding (`embed_tokens`): each rank holds a vocabulary range
/// (`ops::embedding` takes its start and zeroes ids outside it), summed over the
/// ranks.
#[derive(Debug, Clone)]
pub struct VocabParallelEmbedding {
    /// `[rows.padded, hidden]`: this rank's rows, then zeros.
    weight: Tensor,
    rows: VocabShard,
    vocab_size: usize,
    tp: TpGroup,
}

impl VocabParallelEmbedding {
    /// Loads this rank's rows of `name.weight` `[vocab_size, hidden]`.
    pub fn load(vb: &VarBuilder<'_>, name: &str, vocab_size: usize, hidden: usize) -> Result<VocabParallelEmbedding> {
        let (weight, rows) = load_vocab_rows(vb, name, vocab_size, hidden)?;
        Ok(VocabParallelEmbedding { weight, rows, vocab_size, tp: vb.tp().clone() })
    }

    /// The embedding rows of `ids` `[t]`: a new `[t, hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = ops::embedding(&self.weight, ids, self.rows.start as i64)?;
        self.tp.all_reduce(&x)?;
        Ok(x)
    }

    /// This rank's `[rows, hidden]` matrix (all of it with one rank; for a tied LM head).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

/// The LM head: hidden states to logits over the vocabulary.
#[derive(Debug, Clone)]
pub struct ParallelLmHead {
    /// `[rows, hidden]`, padded as the embedding's.
    weight: Tensor,
    vocab_size: usize,
    tp: TpGroup,
}

impl ParallelLmHead {
    /// Loads this rank's rows of `name.weight` `[vocab_size, hidden]`.
    pub fn load(vb: &VarBuilder<'_>, name: &str, vocab_size: usize, hidden: usize) -> Result<ParallelLmHead> {
        let (weight, _) = load_vocab_rows(vb, name, vocab_size, hidden)?;
        Ok(ParallelLmHead { weight, vocab_size, tp: vb.tp().clone() })
    }

    /// A head sharing the embedding matrix (`tie_word_embeddings`).
    pub fn tied(embedding: &VocabParallelEmbedding) -> ParallelLmHead {
        ParallelLmHead { weight: embedding.weight.clone(), vocab_size: embedding.vocab_size, tp: embedding.tp.clone() }
    }

    /// `x` `[n, hidden]` to logits `[n, vocab_size]` in the compute dtype, the
    /// same full rows on every rank.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let local = ops::linear(x, &self.weight, None)?;
        if !self.tp.is_parallel() {
            return Ok(local);
        }
        let logits = self.tp.all_gather_columns(&local)?;
        if logits.dim(1) == self.vocab_size {
            return Ok(logits);
        }
        Ok(logits.narrow(1, 0, self.vocab_size)?.contiguous()?)
    }
}
