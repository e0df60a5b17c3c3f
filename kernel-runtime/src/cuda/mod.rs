//! CUDA devices: context, the compute stream and memory.
//!
//! One [`CudaDevice`] per ordinal lives for the whole process ([`device`]). All
//! work of a device is enqueued on its one compute stream, which is what makes the
//! caching allocator's reuse safe and CUDA-graph capture simple. cudarc is used
//! with dynamic loading: on a machine without a driver, [`device`] returns
//! [`Error::NoCuda`] instead of panicking.
//!
//! This is the floor the rest of the CUDA side stands on: the per-device state of
//! the layers above (loaded kernel functions in `kernels`, the cuBLASLt handle in
//! `gpu::gemm`) is kept by those layers, keyed by [`CudaDevice::ordinal`], so this
//! module imports neither.

pub mod alloc;
pub mod graph;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::error::{Error, Result};

pub use alloc::AllocStats;

/// One CUDA device with its compute stream and allocator.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    alloc: Mutex<alloc::DeviceMemory>,
    /// Compute capability (major, minor).
    capability: (i32, i32),
    sm_count: i32,
    name: String,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("ordinal", &self.ordinal).field("name", &self.name).finish()
    }
}

static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();

/// Whether the CUDA driver library (libcuda.so) can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library; no driver call is made.
    unsafe { sys::is_culib_present() }
}

/// The number of CUDA devices, or an error when there is no driver.
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(no_driver());
    }
    result::init().map_err(Error::driver("initialising the driver"))?;
    let n = result::device::get_count().map_err(Error::driver("counting devices"))?;
    Ok(n.max(0) as usize)
}

fn no_driver() -> Error {
    Error::NoCuda(
        "no CUDA driver on this machine (libcuda.so.1 was not found): run with --device cpu, or install the NVIDIA driver"
            .into(),
    )
}

/// The process-wide handle of CUDA device `ordinal`, created on first use.
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    let devices = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = devices.lock().map_err(|_| Error::NoCuda("the device table was poisoned by a panic".into()))?;
    if let Some(d) = map.get(&ordinal) {
        d.bind()?;
        return Ok(d.clone());
    }
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoCuda(if count == 0 {
            "no CUDA device found (the driver is installed but sees no GPU): run with --device cpu".into()
        } else {
            format!("CUDA device {ordinal} requested but only {count} present")
        }));
    }
    let ctx = CudaContext::new(ordinal).map_err(Error::driver(format!("creating a context on device {ordinal}")))?;
    let stream = ctx.new_stream().map_err(Error::driver("creating the compute stream"))?;
    let capability = ctx.compute_capability().map_err(Error::driver("reading the compute capability"))?;
    let sm_count = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(Error::driver("reading the multiprocessor count"))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    let dev = Arc::new(CudaDevice {
        ordinal,
        ctx,
        stream,
        alloc: Mutex::new(alloc::DeviceMemory::default()),
        capability,
        sm_count,
        name,
    });
    map.insert(ordinal, dev.clone());
    Ok(dev)
}

impl CudaDevice {
    /// The CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device name reported by the driver.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The real architecture NVRTC and the manifest use (`sm_90`).
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.capability.0, self.capability.1)
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> i32 {
        self.sm_count
    }

    /// The compute stream every op of this device is enqueued on.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// The cudarc stream (for cuBLAS handles and graph capture).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(Error::driver("binding the context"))
    }

    /// Blocks until every op enqueued on the compute stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(Error::driver("synchronising the compute stream"))
    }

    /// Free and total device memory, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(Error::driver("querying memory"))
    }

    /// Allocator counters.
    pub fn alloc_stats(&self) -> AllocStats {
        self.alloc.lock().map(|a| a.stats()).unwrap_or_default()
    }

    /// Returns every cached (unused) block to the driver, after the stream drains.
    pub fn release_cached_memory(&self) -> Result<()> {
        self.synchronize()?;
        self.bind()?;
        let mut a = self.alloc.lock().map_err(|_| Error::NoCuda("allocator poisoned".into()))?;
        a.release_cached()
    }

    pub(crate) fn alloc(&self, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        self.bind()?;
        let mut a = self.alloc.lock().map_err(|_| Error::NoCuda("allocator poisoned".into()))?;
        a.alloc(bytes)
    }

    pub(crate) fn free(&self, ptr: sys::CUdeviceptr, size: usize) {
        if let Ok(mut a) = self.alloc.lock() {
            a.free(ptr, size);
        }
    }

    /// Copies host bytes to device memory at `dst` and waits for the copy.
    pub(crate) fn copy_htod(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` points to at least `src.len()` bytes of this device's memory
        // (the caller's tensor bounds); the stream is synchronised before `src` can
        // be dropped.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }
            .map_err(Error::driver("copying to the device"))?;
        self.synchronize()
    }

    /// Copies `rows` rows of `row_bytes` bytes from host `src` (rows `row_bytes`
    /// apart) to device `dst` (rows `dst_pitch` bytes apart) in one 2-D copy, and
    /// waits for it.
    pub(crate) fn copy_htod_2d(
        &self,
        dst: sys::CUdeviceptr,
        dst_pitch: usize,
        src: &[u8],
        row_bytes: usize,
        rows: usize,
    ) -> Result<()> {
        if src.is_empty() || rows == 0 {
            return Ok(());
        }
        self.copy_htod_2d_async(dst, dst_pitch, src, row_bytes, rows)?;
        // `src` may be dropped by the caller once this returns.
        self.synchronize()
    }

    /// Enqueues the 2-D copy of [`Self::copy_htod_2d`] without waiting for it.
    /// The caller keeps `src` alive and unchanged until the copy has run (pinned
    /// staging memory with an event behind the copy, `staging::Upload`).
    pub(crate) fn copy_htod_2d_async(
        &self,
        dst: sys::CUdeviceptr,
        dst_pitch: usize,
        src: &[u8],
        row_bytes: usize,
        rows: usize,
    ) -> Result<()> {
        if src.is_empty() || rows == 0 {
            return Ok(());
        }
        debug_assert!(src.len() >= row_bytes * rows && dst_pitch >= row_bytes);
        self.bind()?;
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: src.as_ptr() as *const std::ffi::c_void,
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: row_bytes,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch,
            WidthInBytes: row_bytes,
            Height: rows,
        };
        // SAFETY: `src` holds `rows` rows of `row_bytes` bytes (the caller's shape
        // check), `dst` addresses `rows` rows of `dst_pitch >= row_bytes` bytes inside
        // a live allocation of this device; the caller keeps `src` alive until the
        // copy has run (see the doc comment).
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.cu_stream()) }
            .result()
            .map_err(Error::driver("copying rows to the device"))
    }

    /// Copies device bytes at `src` to the host and waits for the copy.
    pub(crate) fn copy_dtoh(&self, dst: &mut [u8], src: sys::CUdeviceptr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` points to at least `dst.len()` readable bytes on this device;
        // the stream is synchronised before `dst` is used.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }
            .map_err(Error::driver("copying to the host"))?;
        self.synchronize()
    }

    /// Enqueues a device-to-device copy of `bytes` bytes.
    pub(crate) fn copy_dtod(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie inside live allocations of this device (the
        // caller's tensor bounds).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) }
            .map_err(Error::driver("copying on the device"))
    }

    /// Enqueues a byte fill of `bytes` bytes at `dst`.
    pub(crate) fn memset(&self, dst: sys::CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range lies inside a live allocation of this device.
        unsafe { result::memset_d8_async(dst, value, bytes, self.cu_stream()) }
            .map_err(Error::driver("filling device memory"))
    }
}

/// Times GPU work on a device's compute stream with CUDA events.
pub struct EventTimer {
    start: sys::CUevent,
    end: sys::CUevent,
    device: Arc<CudaDevice>,
}

impl EventTimer {
    /// Two events on `device`.
    pub fn new(device: &Arc<CudaDevice>) -> Result<EventTimer> {
        device.bind()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).map_err(Error::driver("creating an event"))?;
        let end = result::event::create(flags).map_err(Error::driver("creating an event"))?;
        Ok(EventTimer { start, end, device: device.clone() })
    }

    /// Records the start event on the compute stream.
    pub fn start(&self) -> Result<()> {
        // SAFETY: the event and stream belong to this device's live context.
        unsafe { result::event::record(self.start, self.device.cu_stream()) }
            .map_err(Error::driver("recording an event"))
    }

    /// Records the end event, waits for it and returns the milliseconds since `start`.
    pub fn stop_ms(&self) -> Result<f32> {
        // SAFETY: as in `start`; both events were recorded before `elapsed` reads them.
        unsafe {
            result::event::record(self.end, self.device.cu_stream()).map_err(Error::driver("recording an event"))?;
            result::event::synchronize(self.end).map_err(Error::driver("waiting for an event"))?;
            result::event::elapsed(self.start, self.end).map_err(Error::driver("reading an event"))
        }
    }
}

impl Drop for EventTimer {
    fn drop(&mut self) {
        // SAFETY: the events were created by `new` and are destroyed once.
        unsafe {
            let _ = result::event::destroy(self.start);
            let _ = result::event::destroy(self.end);
        }
    }
}
