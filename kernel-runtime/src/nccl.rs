//! NCCL communicators over libnccl.so.2, opened at run time.
//!
//! The bindings are generated from csrc/include/minisgl/nccl227.h; this module is
//! the safe layer: a [`Communicator`] per rank, collectives on tensors enqueued on
//! the device's compute stream, and [`group`] for fusing several collectives.

use std::ffi::CStr;
use std::sync::{Arc, OnceLock};

use crate::cuda::{self, CudaDevice};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::nccl as sys;
use crate::tensor::Tensor;

static LIBRARY: OnceLock<std::result::Result<sys::NcclLibrary, String>> = OnceLock::new();

/// The NCCL library: `$MINISGL_NCCL_LIB`, else `libnccl.so.2` from the loader path.
pub fn library() -> Result<&'static sys::NcclLibrary> {
    LIBRARY
        .get_or_init(|| {
            let name = std::env::var("MINISGL_NCCL_LIB").unwrap_or_else(|_| "libnccl.so.2".into());
            // SAFETY: loads NCCL, whose initialisers have no preconditions; every
            // function of nccl227.h must resolve (from_library checks them all).
            unsafe { sys::NcclLibrary::new(&name) }
                .map_err(|e| format!("cannot load {name} ({e}): install NCCL or set MINISGL_NCCL_LIB to its path"))
        })
        .as_ref()
        .map_err(|e| Error::Nccl { what: "loading".into(), message: e.clone() })
}

fn check(lib: &sys::NcclLibrary, rc: sys::ncclResult_t, what: &str) -> Result<()> {
    if rc == sys::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let msg = unsafe { CStr::from_ptr(lib.ncclGetErrorString(rc)) }.to_string_lossy().into_owned();
    Err(Error::Nccl { what: what.into(), message: format!("{msg} (code {rc})") })
}

/// NCCL's version as an integer (e.g. 22803 for 2.28.3).
pub fn version() -> Result<i32> {
    let lib = library()?;
    let mut v = 0;
    // SAFETY: the out-pointer is valid.
    check(lib, unsafe { lib.ncclGetVersion(&mut v) }, "ncclGetVersion")?;
    Ok(v)
}

/// The bootstrap token rank 0 creates and every rank passes to [`Communicator::init_rank`].
#[derive(Clone, Copy)]
pub struct UniqueId(sys::ncclUniqueId);

impl UniqueId {
    /// A fresh id (rank 0 makes it).
    pub fn new() -> Result<UniqueId> {
        let lib = library()?;
        let mut id = sys::ncclUniqueId::default();
        // SAFETY: the out-pointer is valid.
        check(lib, unsafe { lib.ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
        Ok(UniqueId(id))
    }

    /// The raw bytes, to send to other processes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal.iter().map(|&c| c as u8).collect()
    }

    /// Rebuilds an id from [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let mut id = sys::ncclUniqueId::default();
        if bytes.len() != id.internal.len() {
            return Err(Error::Nccl {
                what: "unique id".into(),
                message: format!("{} bytes, expected {}", bytes.len(), id.internal.len()),
            });
        }
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = *s as std::ffi::c_char;
        }
        Ok(UniqueId(id))
    }
}

/// One rank of an NCCL communicator, bound to one CUDA device.
pub struct Communicator {
    comm: sys::ncclComm_t,
    rank: usize,
    world_size: usize,
    device: Arc<CudaDevice>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time
// (methods take &self but the engine drives one rank from one thread).
unsafe impl Send for Communicator {}

fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclFloat32,
        DType::F16 => sys::ncclFloat16,
        DType::BF16 => sys::ncclBfloat16,
        DType::I32 => sys::ncclInt32,
        DType::I64 => sys::ncclInt64,
        DType::U8 => sys::ncclUint8,
    }
}

impl Communicator {
    /// Joins communicator `id` as `rank` of `world_size` on CUDA device `ordinal`
    /// (every rank calls this, concurrently, from its own thread or process).
    pub fn init_rank(ordinal: usize, world_size: usize, rank: usize, id: &UniqueId) -> Result<Communicator> {
        if rank >= world_size {
            return Err(Error::Nccl {
                what: "init".into(),
                message: format!("rank {rank} is not below the world size {world_size}"),
            });
        }
        let lib = library()?;
        let device = cuda::device(ordinal)?;
        device.bind()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; the device's context is current.
        let status = unsafe { lib.ncclCommInitRank(&mut comm, world_size as i32, id.0, rank as i32) };
        check(lib, status, "ncclCommInitRank")?;
        Ok(Communicator { comm, rank, world_size, device })
    }

    /// One communicator per listed device, all in this process (single-process
    /// tensor parallelism and tests).
    pub fn init_all(ordinals: &[usize]) -> Result<Vec<Communicator>> {
        let lib = library()?;
        let devices = ordinals.iter().map(|&o| cuda::device(o)).collect::<Result<Vec<_>>>()?;
        let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
        let list: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        // SAFETY: `comms` and `list` have ordinals.len() entries.
        let status = unsafe { lib.ncclCommInitAll(comms.as_mut_ptr(), list.len() as i32, list.as_ptr()) };
        check(lib, status, "ncclCommInitAll")?;
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, device))| Communicator { comm, rank, world_size: ordinals.len(), device })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn check_tensor(&self, op: &'static str, what: &str, t: &Tensor) -> Result<()> {
        t.expect_device(op, what, Device::Cuda(self.device.ordinal()))?;
        t.expect_contiguous(op, what)?;
        Ok(())
    }

    /// Sums `t` over all ranks, in place.
    pub fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        self.check_tensor("all_reduce", "t", t)?;
        let lib = library()?;
        self.device.bind()?;
        let ptr = t.device_ptr() as *mut std::ffi::c_void;
        // SAFETY: `t` is a contiguous device tensor on this rank's device; NCCL reads
        // and writes numel elements in stream order.
        let rc = unsafe {
            lib.ncclAllReduce(
                ptr,
                ptr,
                t.numel(),
                nccl_dtype(t.dtype()),
                sys::ncclSum,
                self.comm,
                self.device.cu_stream().cast(),
            )
        };
        check(lib, rc, "ncclAllReduce")
    }

    /// Gathers every rank's `input` into `out` (`[world_size * input.numel()]`
    /// elements, rank-major).
    pub fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()> {
        self.check_tensor("all_gather", "out", out)?;
        self.check_tensor("all_gather", "input", input)?;
        if out.numel() != input.numel() * self.world_size || out.dtype() != input.dtype() {
            return Err(Error::arg(
                "all_gather",
                format!("`out` must hold {} x {} {} elements", self.world_size, input.numel(), input.dtype()),
            ));
        }
        let lib = library()?;
        self.device.bind()?;
        // SAFETY: both tensors are contiguous on this device with the sizes checked.
        let rc = unsafe {
            lib.ncclAllGather(
                input.device_ptr() as *const _,
                out.device_ptr() as *mut _,
                input.numel(),
                nccl_dtype(input.dtype()),
                self.comm,
                self.device.cu_stream().cast(),
            )
        };
        check(lib, rc, "ncclAllGather")
    }

    /// Copies rank `root`'s `t` into every rank's `t`.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.check_tensor("broadcast", "t", t)?;
        let lib = library()?;
        self.device.bind()?;
        let ptr = t.device_ptr() as *mut std::ffi::c_void;
        // SAFETY: as in all_reduce_sum.
        let rc = unsafe {
            lib.ncclBroadcast(
                ptr,
                ptr,
                t.numel(),
                nccl_dtype(t.dtype()),
                root as i32,
                self.comm,
                self.device.cu_stream().cast(),
            )
        };
        check(lib, rc, "ncclBroadcast")
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Ok(lib) = library() {
            // SAFETY: the communicator was created by init and is destroyed once.
            unsafe {
                let _ = lib.ncclCommDestroy(self.comm);
            }
        }
    }
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd (collectives issued inside are
/// launched together, as one rank driving several devices needs).
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let lib = library()?;
    // SAFETY: no arguments.
    check(lib, unsafe { lib.ncclGroupStart() }, "ncclGroupStart")?;
    let r = f();
    // SAFETY: matches the ncclGroupStart above.
    let end = check(lib, unsafe { lib.ncclGroupEnd() }, "ncclGroupEnd");
    let r = r?;
    end?;
    Ok(r)
}
