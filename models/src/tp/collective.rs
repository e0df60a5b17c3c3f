//! The collectives the parallel layers call, and [`TpGroup`], what a layer holds.
//!
//! [`Collective`] is declared here, by its consumer (the layers), with two
//! implementations beside it: NCCL on GPUs (`nccl`) and TCP between processes on
//! the CPU backend (`tcp`). A layer of a model that is not split holds
//! [`TpGroup::single`] and calls nothing.

use std::sync::Arc;

use kernel_runtime::Tensor;

use crate::error::Result;
use crate::tp::shard::Shard;

/// The collectives of one rank of a tensor-parallel group. Every rank calls the
/// same collectives in the same order with tensors of the same shape and dtype.
pub trait Collective: Send + Sync + std::fmt::Debug {
    /// This rank.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn world_size(&self) -> usize;

    /// Sums the contiguous `t` over all ranks, in place. The result is the same
    /// on every rank and, for a given backend, from run to run.
    fn all_reduce_sum(&self, t: &Tensor) -> Result<()>;

    /// Every rank's contiguous `input` into `out` (`world_size * input.numel()`
    /// elements, rank-major).
    fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()>;

    /// Rank `root`'s `t` into every rank's `t`.
    fn broadcast(&self, t: &Tensor, root: usize) -> Result<()>;
}

/// A rank's shard and its collectives, as the layers hold them.
#[derive(Debug, Clone)]
pub struct TpGroup {
    shard: Shard,
    comm: Option<Arc<dyn Collective>>,
}

impl TpGroup {
    /// A model that is not split: no collectives at all.
    pub fn single() -> TpGroup {
        TpGroup { shard: Shard::single(), comm: None }
    }

    /// The group `comm` belongs to (also with one rank: then the collectives run
    /// anyway, which is how the tensor-parallel path is tested on one GPU).
    pub fn new(comm: Arc<dyn Collective>) -> std::result::Result<TpGroup, String> {
        let shard = Shard::new(comm.rank(), comm.world_size())?;
        Ok(TpGroup { shard, comm: Some(comm) })
    }

    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Whether collectives run (a communicator is attached).
    pub fn is_parallel(&self) -> bool {
        self.comm.is_some()
    }

    /// Sums `t` over the ranks in place (nothing without a communicator).
    pub fn all_reduce(&self, t: &Tensor) -> Result<()> {
        match &self.comm {
            Some(c) => c.all_reduce_sum(t),
            None => Ok(()),
        }
    }

    /// `x` `[n, cols]` of every rank side by side: a new `[n, size * cols]`
    /// (rank r's columns at `r * cols`); `x` itself without a communicator.
    pub fn all_gather_columns(&self, x: &Tensor) -> Result<Tensor> {
        let Some(comm) = &self.comm else { return Ok(x.clone()) };
        let [n, cols] = x.dims::<2>("all_gather_columns", "x")?;
        let size = self.shard.size();
        let x = x.contiguous()?;
        let gathered = Tensor::empty(&[size, n, cols], x.dtype(), x.device())?;
        comm.all_gather(&gathered, &x)?;
        if size == 1 {
            return Ok(gathered.reshape(&[n, cols])?);
        }
        // Rank-major [size, n, cols] to row-major [n, size * cols].
        Ok(gathered.permute(&[1, 0, 2])?.contiguous()?.reshape(&[n, size * cols])?)
    }
}
