//! The token embedding and the LM head.
//!
//! Both are `[vocab_size, hidden]` matrices; with `tie_word_embeddings` the head
//! shares the embedding's tensor (no copy). `vocab_size` is the config's, which
//! may exceed the tokenizer's (padded vocabularies): the extra rows are real rows
//! of the matrices, and their logits are simply never produced by the tokenizer.

use kernel_runtime::{ops, Tensor};

use crate::error::Result;
use crate::weights::VarBuilder;

/// Token embedding (`embed_tokens`); "vocab parallel" because under tensor
/// parallelism each rank holds a vocabulary range (`ops::embedding` already
/// takes its start and zeroes ids outside it).
#[derive(Debug, Clone)]
pub struct VocabParallelEmbedding {
    weight: Tensor,
    vocab_start: i64,
}

impl VocabParallelEmbedding {
    /// Loads `name.weight` `[vocab_size, hidden]`.
    pub fn load(vb: &VarBuilder<'_>, name: &str, vocab_size: usize, hidden: usize) -> Result<VocabParallelEmbedding> {
        Ok(VocabParallelEmbedding { weight: vb.pp(name).get("weight", &[vocab_size, hidden])?, vocab_start: 0 })
    }

    /// The embedding rows of `ids` `[t]`: a new `[t, hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(ops::embedding(&self.weight, ids, self.vocab_start)?)
    }

    /// The `[vocab_size, hidden]` matrix (for a tied LM head).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

/// The LM head: hidden states to logits over the vocabulary.
#[derive(Debug, Clone)]
pub struct ParallelLmHead {
    weight: Tensor,
}

impl ParallelLmHead {
    /// Loads `name.weight` `[vocab_size, hidden]`.
    pub fn load(vb: &VarBuilder<'_>, name: &str, vocab_size: usize, hidden: usize) -> Result<ParallelLmHead> {
        Ok(ParallelLmHead { weight: vb.pp(name).get("weight", &[vocab_size, hidden])? })
    }

    /// A head sharing the embedding matrix (`tie_word_embeddings`).
    pub fn tied(embedding: &VocabParallelEmbedding) -> ParallelLmHead {
        ParallelLmHead { weight: embedding.weight().clone() }
    }

    /// `x` `[n, hidden]` to logits `[n, vocab_size]` in the compute dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::linear(x, &self.weight, None)?)
    }
}
