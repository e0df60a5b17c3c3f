//! Tensor parallelism: how a model splits over ranks, and the collectives that
//! put the pieces back together.
//!
//! | module | what |
//! | --- | --- |
//! | [`shard`] | [`Shard`]: a rank's heads, KV heads, intermediate columns and vocabulary rows |
//! | [`collective`] | the [`Collective`] trait the layers call, and [`TpGroup`], what a layer holds |
//! | [`tcp`] | the CPU backend's collectives: ranks as processes (or threads) over TCP |
//! | [`nccl`] | the GPU collectives over NCCL |
//!
//! Which layer calls what (Megatron's scheme): the embedding is vocab-parallel
//! (each rank its rows, zeros for the others' ids, all-reduce); q/k/v and
//! gate/up are column-parallel (no collective); o_proj and down_proj (and the
//! experts' down projection) are row-parallel, followed by an all-reduce; the
//! LM head is vocab-parallel, its logits all-gathered into the full row on
//! every rank. Norms and the MoE router are replicated.

pub mod collective;
pub mod nccl;
pub mod shard;
pub mod tcp;

pub use collective::{Collective, TpGroup};
pub use shard::{rank_config, HeadShard, Shard, VocabShard};
pub use tcp::TcpCollective;
