//! Copies between host and device that do not wait for the stream: what lets the
//! host prepare step n+1 while the GPU still runs step n (overlap scheduling).
//!
//! [`Tensor::write_rows`] and [`Tensor::to_vec`] synchronise the compute stream,
//! which is right for one-off copies but would make every step wait for the one
//! before it. Here the host side of a copy is page-locked memory owned by the
//! staging object, so the driver can copy asynchronously and the host data stays
//! valid until the copy has run:
//!
//! - [`Upload`]: host data is copied into pinned memory (after the previous
//!   copies out of it have completed: an event, normally long passed), then
//!   enqueued to the device tensor; the call returns at once;
//! - [`Readback`]: a device tensor is enqueued to pinned memory with an event
//!   behind it; [`Readback::wait`] blocks on that event only.
//!
//! On the CPU both are plain copies.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Page-locked host memory with an event recorded after the last copy that
/// uses it.
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    event: sys::CUevent,
    /// An event was recorded and not yet waited for.
    pending: bool,
    device: Arc<CudaDevice>,
}

// SAFETY: the pinned block and the event are owned by this value alone; the
// driver allows using them from any thread once the context is bound.
unsafe impl Send for Pinned {}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pinned({} bytes)", self.bytes)
    }
}

impl Pinned {
    fn new(device: &Arc<CudaDevice>, bytes: usize) -> Result<Pinned> {
        device.bind()?;
        let bytes = bytes.max(64);
        // SAFETY: the context is current; the size is non-zero. The block is freed
        // once, in `drop`.
        let ptr = unsafe { result::malloc_host(bytes, 0) }.map_err(Error::driver("allocating pinned memory"))?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(Error::driver("creating an event"))?;
        Ok(Pinned { ptr: ptr.cast(), bytes, event, pending: false, device: device.clone() })
    }

    /// Waits until the copies recorded so far have completed.
    fn settle(&mut self) -> Result<()> {
        if self.pending {
            // SAFETY: the event was created by `new` and recorded on the live stream.
            unsafe { result::event::synchronize(self.event) }.map_err(Error::driver("waiting for a copy"))?;
            self.pending = false;
        }
        Ok(())
    }

    fn record(&mut self) -> Result<()> {
        // SAFETY: the event and the stream belong to this device's live context.
        unsafe { result::event::record(self.event, self.device.cu_stream()) }
            .map_err(Error::driver("recording an event"))?;
        self.pending = true;
        Ok(())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Copies still in flight read or write the block: let them finish first.
        let _ = self.settle();
        // SAFETY: allocated by `malloc_host` and created by `event::create` in `new`,
        // released once here after the copies using them completed.
        unsafe {
            let _ = result::free_host(self.ptr.cast());
            let _ = result::event::destroy(self.event);
        }
    }
}

/// Host-to-device copies staged through pinned memory (see the module header).
#[derive(Debug)]
pub struct Upload {
    pinned: Option<Pinned>,
    /// Bytes of `pinned` used by the copies of the current batch.
    used: usize,
}

impl Upload {
    /// Staging for copies to tensors of `device`.
    pub fn new(device: Device) -> Result<Upload> {
        let pinned = match device {
            Device::Cpu => None,
            Device::Cuda(ordinal) => Some(Pinned::new(&crate::cuda::device(ordinal)?, 1 << 16)?),
        };
        Ok(Upload { pinned, used: 0 })
    }

    /// Starts a new batch of copies: waits until the copies of the previous batch
    /// have read the pinned memory (enqueued a step ago, so normally long done).
    pub fn begin(&mut self) -> Result<()> {
        if let Some(p) = self.pinned.as_mut() {
            p.settle()?;
        }
        self.used = 0;
        Ok(())
    }

    /// Like [`Tensor::write_rows`] (a row-major `[rows, cols]` block into the
    /// leading rows and columns of the contiguous `dst`), without waiting for the
    /// stream. Copies of one batch (since [`Self::begin`]) must fit together; the
    /// staging grows when they do not (waiting for the stream once).
    pub fn write_rows<T: Element>(&mut self, dst: &Tensor, data: &[T], cols: usize) -> Result<()> {
        const OP: &str = "upload";
        let Some(pinned) = self.pinned.as_mut() else {
            return dst.write_rows(data, cols);
        };
        dst.check_write_rows::<T>(OP, data.len(), cols)?;
        if data.is_empty() {
            return Ok(());
        }
        let Some(dev) = dst.cuda_device() else {
            return Err(Error::arg(OP, "the staging is for a GPU, the tensor is on the host"));
        };
        if dev.ordinal() != pinned.device.ordinal() {
            return Err(Error::arg(OP, "the tensor is on another GPU than the staging"));
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let start = self.used.next_multiple_of(64);
        if start + bytes.len() > pinned.bytes {
            // Grow: the copies enqueued from the old block must finish before it goes.
            let new = Pinned::new(dev, (start + bytes.len()).next_power_of_two())?;
            pinned.settle()?;
            dev.synchronize()?;
            *pinned = new;
        }
        let pinned = self.pinned.as_mut().expect("checked above");
        // SAFETY: `start + bytes.len() <= pinned.bytes` (grown above), and no copy
        // enqueued since `begin` reads this range (each copy has its own range).
        let host = unsafe {
            let dst_ptr = pinned.ptr.add(start);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst_ptr, bytes.len());
            std::slice::from_raw_parts(dst_ptr, bytes.len())
        };
        self.used = start + bytes.len();
        let elem = std::mem::size_of::<T>();
        let width = dst.write_rows_width();
        let rows = data.len() / cols;
        dev.copy_htod_2d_async(dst.device_ptr(), width * elem, host, cols * elem, rows)?;
        pinned.record()
    }
}

/// Device-to-host copies into pinned memory, waited for later (see the module
/// header).
#[derive(Debug)]
pub struct Readback {
    pinned: Option<Pinned>,
    /// Host copies (CPU tensors are read at once).
    host: Vec<u8>,
    len: usize,
}

impl Readback {
    /// Staging for copies from tensors of `device`.
    pub fn new(device: Device) -> Result<Readback> {
        let pinned = match device {
            Device::Cpu => None,
            Device::Cuda(ordinal) => Some(Pinned::new(&crate::cuda::device(ordinal)?, 1 << 12)?),
        };
        Ok(Readback { pinned, host: Vec::new(), len: 0 })
    }

    /// Enqueues a copy of the contiguous `src` to the host, behind the work that
    /// computes it, without waiting. A copy enqueued before and not waited for is
    /// waited for first.
    pub fn start(&mut self, src: &Tensor) -> Result<()> {
        const OP: &str = "readback";
        src.expect_contiguous(OP, "src")?;
        let bytes = src.numel() * src.dtype().size_in_bytes();
        self.len = bytes;
        let Some(pinned) = self.pinned.as_mut() else {
            self.host = src.to_host_bytes()?;
            return Ok(());
        };
        let Some(dev) = src.cuda_device() else {
            return Err(Error::arg(OP, "the staging is for a GPU, the tensor is on the host"));
        };
        pinned.settle()?;
        if bytes > pinned.bytes {
            *pinned = Pinned::new(dev, bytes.next_power_of_two())?;
        }
        let pinned = self.pinned.as_mut().expect("checked above");
        if bytes == 0 {
            return Ok(());
        }
        dev.bind()?;
        // SAFETY: the pinned block holds at least `bytes` bytes and no other copy
        // uses it (settled above); `src` is a live contiguous device tensor of
        // `bytes` bytes. The host reads the block only after the event below.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(pinned.ptr, bytes);
            result::memcpy_dtoh_async(dst, src.device_ptr(), dev.cu_stream())
        }
        .map_err(Error::driver("copying to the host"))?;
        pinned.record()
    }

    /// Waits for the copy [`Self::start`] enqueued and returns its elements.
    pub fn wait<T: Element>(&mut self) -> Result<Vec<T>> {
        let n = self.len / std::mem::size_of::<T>();
        let mut out = vec![T::zeroed(); n];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        match self.pinned.as_mut() {
            None => dst.copy_from_slice(&self.host[..self.len]),
            Some(p) => {
                p.settle()?;
                // SAFETY: the copy into the first `len` bytes completed (event waited).
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(p.ptr, self.len) });
            }
        }
        Ok(out)
    }
}
