//! `prefetch_l2`: a hint that asks the GPU's L2 cache to fetch tensors (the
//! weights of the next projections) while the kernels enqueued before them leave
//! HBM idle, so that the projection finds them in the cache. Nothing is computed
//! or written, the cache may drop any of it, and on the CPU it does nothing.

use super::check::common_device;
use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;

/// Enqueues an L2 prefetch of the storage of each tensor (contiguous, all on one
/// device); a no-op for CPU tensors and for an empty list.
pub fn prefetch_l2(tensors: &[&Tensor]) -> Result<()> {
    const OP: &str = "prefetch_l2";
    if tensors.is_empty() {
        return Ok(());
    }
    for t in tensors {
        t.expect_contiguous(OP, "tensors")?;
    }
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|t| ("tensors", *t)).collect();
    match common_device(OP, &named)? {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => crate::gpu::prefetch_l2(tensors),
    }
}
