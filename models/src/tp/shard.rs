//! The arithmetic of tensor parallelism: which part of each dimension a rank owns.
//!
//! Megatron's rules, as vLLM, SGLang and mini-sglang apply them:
//!
//! - attention heads split evenly (`num_attention_heads % tp == 0`);
//! - KV heads split evenly when there are at least as many as ranks
//!   (`num_key_value_heads % tp == 0`), else each rank holds one KV head,
//!   replicated over `tp / num_key_value_heads` consecutive ranks (then
//!   `tp % num_key_value_heads == 0`); either way every query head of a rank
//!   finds its KV head on the same rank;
//! - the MLP's intermediate size (dense and per expert) splits evenly;
//! - the vocabulary splits into `ceil(vocab / tp)` rows per rank, the last
//!   ranks' ranges short or empty: the embedding and the LM head are padded to
//!   the same rows on every rank so that the logits all-gather is uniform.
//!
//! Errors are plain strings naming the sizes; the loaders wrap them with the
//! config's path.

use std::ops::Range;

use crate::config::ModelConfig;
use crate::error::Result as ModelResult;

/// This rank's place in a tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    rank: usize,
    size: usize,
}

/// The attention heads of one rank: query heads and KV heads (global indices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadShard {
    pub q: Range<usize>,
    pub kv: Range<usize>,
}

/// One rank's rows of the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VocabShard {
    /// First token id of the rank.
    pub start: usize,
    /// Real rows (token ids `start..start + len`), possibly fewer than `padded`.
    pub len: usize,
    /// Rows every rank holds (`ceil(vocab / tp)`): the real ones, then zeros.
    pub padded: usize,
}

impl Shard {
    /// The one rank of a model that is not split.
    pub fn single() -> Shard {
        Shard { rank: 0, size: 1 }
    }

    /// Rank `rank` of `size`.
    pub fn new(rank: usize, size: usize) -> Result<Shard, String> {
        if size == 0 || rank >= size {
            return Err(format!("rank {rank} is not in a tensor-parallel group of {size}"));
        }
        Ok(Shard { rank, size })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group (`--tp`).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the model is split at all.
    pub fn is_split(&self) -> bool {
        self.size > 1
    }

    /// This rank's equal part of `n` things called `what` (an error naming
    /// `what` when `n` does not divide).
    pub fn split(&self, n: usize, what: &str) -> Result<Range<usize>, String> {
        if !n.is_multiple_of(self.size) {
            return Err(format!("{what} = {n} does not split evenly over --tp {}", self.size));
        }
        let per = n / self.size;
        Ok(self.rank * per..(self.rank + 1) * per)
    }

    /// The heads of this rank (see the module docs for the KV replication).
    pub fn heads(&self, num_heads: usize, num_kv_heads: usize) -> Result<HeadShard, String> {
        if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(format!(
                "num_attention_heads = {num_heads} is not a multiple of num_key_value_heads = {num_kv_heads}"
            ));
        }
        let q = self.split(num_heads, "num_attention_heads")?;
        let kv = if num_kv_heads >= self.size {
            self.split(num_kv_heads, "num_key_value_heads")?
        } else {
            if !self.size.is_multiple_of(num_kv_heads) {
                return Err(format!(
                    "num_key_value_heads = {num_kv_heads} is fewer than --tp {} and does not divide it \
                     (each KV head must be replicated on the same number of ranks)",
                    self.size
                ));
            }
            let head = self.rank / (self.size / num_kv_heads);
            head..head + 1
        };
        Ok(HeadShard { q, kv })
    }

    /// This rank's rows of a vocabulary of `vocab_size`.
    pub fn vocab(&self, vocab_size: usize) -> VocabShard {
        let padded = vocab_size.div_ceil(self.size);
        let start = (self.rank * padded).min(vocab_size);
        let len = padded.min(vocab_size - start);
        VocabShard { start, len, padded }
    }
}

/// `config` as rank `shard` sees it: its query and KV heads, which size its KV
/// cache and its attention kernels (everything else, the vocabulary included,
/// is the model's: the logits are all-gathered).
pub fn rank_config(config: &ModelConfig, shard: Shard) -> ModelResult<ModelConfig> {
    let heads =
        shard.heads(config.num_attention_heads, config.num_key_value_heads).map_err(|m| config.unsupported(m))?;
    let mut local = config.clone();
    local.num_attention_heads = heads.q.len();
    local.num_key_value_heads = heads.kv.len();
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(size: usize) -> Vec<Shard> {
        (0..size).map(|r| Shard::new(r, size).unwrap()).collect()
    }

    #[test]
    fn even_splits_tile_the_dimension() {
        for size in [1, 2, 4, 8] {
            let ranges: Vec<_> = shards(size).iter().map(|s| s.split(512, "intermediate_size").unwrap()).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, 512);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        }
        let err = Shard::new(1, 3).unwrap().split(512, "intermediate_size").unwrap_err();
        assert!(err.contains("intermediate_size = 512") && err.contains("--tp 3"), "{err}");
    }

    #[test]
    fn kv_heads_split_when_there_are_enough() {
        // 32 query heads over 8 KV heads on 4 ranks: 8 and 2 each.
        let h: Vec<_> = shards(4).iter().map(|s| s.heads(32, 8).unwrap()).collect();
        assert_eq!(h[1], HeadShard { q: 8..16, kv: 2..4 });
        assert_eq!(h[3], HeadShard { q: 24..32, kv: 6..8 });
    }

    #[test]
    fn kv_heads_replicate_when_fewer_than_ranks() {
        // 4 query heads over 1 KV head on 4 ranks: every rank holds the one head.
        for s in shards(4) {
            let h = s.heads(4, 1).unwrap();
            assert_eq!(h.kv, 0..1);
            assert_eq!(h.q.len(), 1);
        }
        // 8 query heads over 2 KV heads on 4 ranks: ranks 0-1 hold head 0, 2-3 head 1,
        // and each rank's query heads use that head (query head j uses j / 4).
        for s in shards(4) {
            let h = s.heads(8, 2).unwrap();
            assert_eq!(h.kv.start, s.rank() / 2);
            assert!(h.q.clone().all(|j| j / 4 == h.kv.start));
        }
        let err = Shard::new(0, 4).unwrap().heads(12, 3).unwrap_err();
        assert!(err.contains("num_key_value_heads = 3"), "{err}");
        let err = Shard::new(0, 3).unwrap().heads(4, 2).unwrap_err();
        assert!(err.contains("num_attention_heads = 4"), "{err}");
    }

    #[test]
    fn vocab_pads_the_last_ranks() {
        // 10 tokens over 4 ranks: 3 rows each, the last rank 1 real row.
        let v: Vec<_> = shards(4).iter().map(|s| s.vocab(10)).collect();
        assert_eq!(v[0], VocabShard { start: 0, len: 3, padded: 3 });
        assert_eq!(v[3], VocabShard { start: 9, len: 1, padded: 3 });
        assert_eq!(v.iter().map(|v| v.len).sum::<usize>(), 10);
        // 5 tokens over 4 ranks: 2 rows each, the last rank none at all.
        let v: Vec<_> = shards(4).iter().map(|s| s.vocab(5)).collect();
        assert_eq!(v[2], VocabShard { start: 4, len: 1, padded: 2 });
        assert_eq!(v[3], VocabShard { start: 5, len: 0, padded: 2 });
        assert_eq!(Shard::single().vocab(544), VocabShard { start: 0, len: 544, padded: 544 });
    }

    #[test]
    fn bad_groups_are_refused() {
        assert!(Shard::new(2, 2).is_err());
        assert!(Shard::new(0, 0).is_err());
    }
}
