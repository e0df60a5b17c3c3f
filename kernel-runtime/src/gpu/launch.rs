//! What every CUDA launcher of `gpu` shares: the device of a tensor, the
//! dispatch of one kernel instance (AOT library or loaded cubin), and the checks
//! and sizes the launchers compute. Kept apart from `gpu/mod.rs` so that the
//! launchers do not import the module that re-exports them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels::{self, LoadedFunction, Resolved};
use crate::sys::kernels::{msgl_stream, KernelLibrary};
use crate::tensor::Tensor;

/// The CUDA device of `t` (ops have already checked that every tensor is on it).
pub(super) fn device_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a Arc<CudaDevice>> {
    t.cuda_device().ok_or_else(|| Error::arg(op, format!("expected a CUDA tensor, got one on {}", t.device())))
}

/// Resolves `family[values]` on `dev` and runs it: through the AOT library's C
/// launcher (`library`, given the launchers and the compute stream, returning the
/// status), or through the loaded cubin (`function`).
pub(super) fn dispatch(
    op: &'static str,
    dev: &CudaDevice,
    family: &str,
    values: &[(&str, i64)],
    library: impl FnOnce(&KernelLibrary, msgl_stream) -> i32,
    function: impl FnOnce(&LoadedFunction) -> Result<()>,
) -> Result<()> {
    let instance = kernels::Registry::get()?.family(family)?.instance(values)?;
    match kernels::resolve(dev, family, &instance)? {
        Resolved::Library(lib) => {
            dev.bind()?;
            let status = library(lib.launchers(), dev.cu_stream().cast());
            kernels::check_status(lib, op, status)
        }
        Resolved::Function(f) => function(&f),
    }
}

/// Whether `t`'s first element and every stride of a non-trivial dimension are
/// multiples of `align` bytes, with a unit (or irrelevant) innermost stride: what a
/// kernel reading rows with `align`-byte vectors needs.
pub(super) fn rows_aligned(t: &Tensor, align: usize) -> bool {
    let elem = t.dtype().size_in_bytes();
    let last = t.rank().saturating_sub(1);
    let inner_ok = t.rank() == 0 || t.dim(last) <= 1 || t.strides()[last] == 1;
    inner_ok
        && (t.device_ptr() as usize).is_multiple_of(align)
        && t.shape().iter().zip(t.strides()).take(last).all(|(&d, &s)| d <= 1 || (s * elem).is_multiple_of(align))
}

/// The msgl_dtype code of a float dtype, as an instance parameter value.
pub(super) fn dtype_code(t: &Tensor) -> i64 {
    i64::from(t.dtype().abi_code())
}

/// Elements in one 16-byte vector of `t`'s dtype.
pub(super) fn vec_elems(t: &Tensor) -> usize {
    16 / t.dtype().size_in_bytes()
}

/// A u32 grid dimension, or an error naming the op when the work is too large.
pub(super) fn grid_u32(op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| Error::arg(op, format!("{blocks} blocks exceed the grid limit")))
}

/// A process-wide switch read from the environment once (`off` when the
/// variable is `0`), which tests and benchmarks can override.
pub(super) struct Switch {
    /// 0 unread, 1 on, 2 off.
    state: AtomicU8,
    var: &'static str,
    /// The setting when the variable is unset.
    default_on: bool,
}

impl Switch {
    /// On unless the variable is `0`.
    pub(super) const fn new(var: &'static str) -> Switch {
        Switch { state: AtomicU8::new(0), var, default_on: true }
    }

    /// Off unless the variable is `1`.
    pub(super) const fn off_by_default(var: &'static str) -> Switch {
        Switch { state: AtomicU8::new(0), var, default_on: false }
    }

    /// Overrides the variable (`None`: back to it).
    pub(super) fn set(&self, on: Option<bool>) {
        self.state.store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
    }

    /// The variable's setting (its default when unset), unless [`Switch::set`]
    /// said otherwise.
    pub(super) fn get(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let on = match std::env::var(self.var) {
                    Ok(v) if v.trim() == "0" => false,
                    Ok(v) if v.trim() == "1" => true,
                    _ => self.default_on,
                };
                // A racing `set` wins: only replace "unread".
                let _ = self.state.compare_exchange(0, if on { 1 } else { 2 }, Ordering::Relaxed, Ordering::Relaxed);
                on
            }
        }
    }
}

/// `MINISGL_PDL_LAUNCH_FIRST=1`: the small kernels whose successor has a long
/// prologue (rope_store before decode attention, the split combine before the o
/// projection) let the next kernel launch before their own dependency wait
/// (device.cuh: `grid_prologue_launch_first`), so that the successor's blocks are
/// resident and run their prologue (keys, weights) while the kernel before still
/// works. Off: measured in the seventeenth session (docs/PERF.md), +1-2% on the
/// Qwen3-0.6B bs=1 graphed step alone and within the noise beside the skinny
/// GEMM's bulk prefetch (its blocks become resident earlier, its link stays).
static LAUNCH_FIRST: Switch = Switch::off_by_default("MINISGL_PDL_LAUNCH_FIRST");

/// Whether a launch of `blocks` blocks on a device of `sm_count` SMs takes
/// [`LAUNCH_FIRST`]: the switch, and a grid no wider than the SMs, so that its
/// blocks are one wave and the chain of early grids stays three deep (device.cuh).
pub(super) fn launch_first(blocks: usize, sm_count: usize) -> bool {
    launch_first_rule(blocks, sm_count, LAUNCH_FIRST.get())
}

/// [`launch_first`] with the switch given: on, and at most one block an SM.
fn launch_first_rule(blocks: usize, sm_count: usize, on: bool) -> bool {
    on && blocks <= sm_count
}

/// A buffer of `len` int32 zeros on `dev` that kernels use as counters and leave
/// zero after every launch (the decode attention's split counters, the fused MoE
/// router's ticket): made on first use under the name `name` and kept for the
/// process, since captured graphs address it. `None` while a graph capture runs
/// before it exists (allocating and clearing memory is no work to record in a
/// graph: the caller then takes a path without counters). One buffer serves every
/// launch of its kind on the device: sound because those launches are ordered on
/// the device's one stream and, under programmatic dependent launch, no two of a
/// kind are resident at once (device.cuh); concurrent streams would need one each.
pub(crate) fn persistent_zeros(name: &'static str, dev: &Arc<CudaDevice>, len: usize) -> Result<Option<Tensor>> {
    static BUFFERS: OnceLock<Mutex<HashMap<(&'static str, usize), Tensor>>> = OnceLock::new();
    let mut map = BUFFERS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .map_err(|_| Error::arg(name, "the counters' lock is poisoned"))?;
    if let Some(t) = map.get(&(name, dev.ordinal())) {
        return Ok(Some(t.clone()));
    }
    if dev.is_capturing() {
        return Ok(None);
    }
    let t = Tensor::zeros(&[len], crate::dtype::DType::I32, crate::device::Device::Cuda(dev.ordinal()))?;
    map.insert((name, dev.ordinal()), t.clone());
    Ok(Some(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_wave_launches_its_successor_first() {
        // Decode-sized launches: rope_store of one Qwen3-0.6B token (32 rows, one
        // block), the combine of a batch-1 step (16 heads, 4 blocks).
        assert!(launch_first_rule(1, 132, true) && launch_first_rule(4, 132, true));
        assert!(launch_first_rule(132, 132, true));
        // A prefill's rope_store, a wide batch's combine: past the SMs, never.
        assert!(!launch_first_rule(133, 132, true) && !launch_first_rule(4096, 132, true));
        // The switch off: never.
        assert!(!launch_first_rule(1, 132, false));
        // Off by default (the variable unset in the tests).
        if std::env::var_os("MINISGL_PDL_LAUNCH_FIRST").is_none() {
            assert!(!launch_first(1, 132));
        }
    }
}
