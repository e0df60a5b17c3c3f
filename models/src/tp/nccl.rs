//! The GPU collectives: NCCL, through `kernel_runtime::nccl::Communicator`.
//!
//! Collectives are enqueued on the device's compute stream like every other op,
//! so they need no host synchronisation and CUDA graphs capture them (NCCL
//! supports capture since 2.9). One rank is one process and one GPU.

use std::sync::Mutex;

use kernel_runtime::nccl::{Communicator, UniqueId};
use kernel_runtime::Tensor;

use crate::error::Result;
use crate::tp::collective::Collective;

/// One rank's NCCL communicator.
pub struct NcclCollective {
    rank: usize,
    world_size: usize,
    /// NCCL calls on one communicator must not interleave; the engine drives a
    /// rank from one thread, the lock makes that a guarantee.
    comm: Mutex<Communicator>,
}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclCollective {{ rank: {}, world_size: {} }}", self.rank, self.world_size)
    }
}

impl NcclCollective {
    /// Joins the communicator `id` (made by rank 0, handed out by the
    /// rendezvous) as `rank` of `world_size` on CUDA device `ordinal`; blocks
    /// until every rank has joined.
    pub fn init(ordinal: usize, world_size: usize, rank: usize, id: &UniqueId) -> Result<NcclCollective> {
        let comm = Communicator::init_rank(ordinal, world_size, rank, id)?;
        Ok(NcclCollective { rank, world_size, comm: Mutex::new(comm) })
    }

    fn comm(&self) -> std::sync::MutexGuard<'_, Communicator> {
        self.comm.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    /// NCCL's ring or tree sum (in the tensor's dtype; deterministic for a
    /// fixed topology and size, as NCCL documents).
    fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        Ok(self.comm().all_reduce_sum(t)?)
    }

    fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()> {
        Ok(self.comm().all_gather(out, input)?)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        Ok(self.comm().broadcast(t, root)?)
    }
}
