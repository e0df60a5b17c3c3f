//! CUDA graphs: record the work a closure enqueues on a device's compute stream
//! once, replay it with one launch.
//!
//! A graph replays the same kernels with the same arguments, so everything it
//! reads must sit at the addresses it was captured with (the caller's persistent
//! input buffers) and everything it allocates comes from the device's graph pool
//! (see `alloc`), which eager work never touches. The closure must not
//! synchronise the stream or copy between host and device (the capture fails
//! with the driver's error, and the stream is left as it was).

use std::sync::Arc;

use cudarc::driver::sys;

use super::CudaDevice;
use crate::error::{Error, Result};

/// A captured, instantiated graph of one device's compute stream.
pub struct Graph {
    graph: cudarc::driver::CudaGraph,
    device: Arc<CudaDevice>,
}

// SAFETY: a graph and its executable are not internally synchronised, so they
// must not be used from two threads at once; `Graph` is not `Sync` and replays
// take `&mut self`, so uses are serialised by its owner. Nothing in it is tied
// to the thread that captured it (the context is bound before every call).
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("device", &self.device.ordinal()).finish_non_exhaustive()
    }
}

impl Graph {
    /// Enqueues one replay on the device's compute stream.
    pub fn replay(&mut self) -> Result<()> {
        self.device.bind()?;
        self.graph.launch().map_err(Error::driver("replaying a CUDA graph"))
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

/// Ends capture mode of the device's allocator however the capture ends.
struct CaptureMode<'a>(&'a CudaDevice);

impl Drop for CaptureMode<'_> {
    fn drop(&mut self) {
        if let Ok(mut memory) = self.0.alloc.lock() {
            memory.set_capturing(false);
        }
    }
}

impl CudaDevice {
    /// Captures what `record` enqueues on the compute stream into a graph (not
    /// run: replay it with [`Graph::replay`]), and returns it with `record`'s
    /// value. Allocations made meanwhile come from the graph pool. The stream is
    /// drained first; on an error of `record` or of the capture, no graph is made.
    pub fn capture<T, E: From<Error>>(
        self: &Arc<Self>,
        record: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<(Graph, T), E> {
        self.synchronize()?;
        self.bind()?;
        let mode = CaptureMode(self);
        self.alloc.lock().map_err(|_| Error::NoCuda("allocator poisoned".into()))?.set_capturing(true);
        // Relaxed: other threads may keep using the driver (the server's
        // tokenizer threads do not, but a test harness might) and allocation
        // calls stay allowed while capturing.
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(Error::driver("starting a CUDA graph capture"))?;
        let recorded = record();
        // The capture always ends, so that the stream is usable again.
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        drop(mode);
        let value = recorded?;
        let graph = ended
            .map_err(Error::driver("ending a CUDA graph capture"))?
            .ok_or_else(|| Error::NoCuda("the CUDA graph capture recorded no work".into()))?;
        Ok((Graph { graph, device: self.clone() }, value))
    }

    /// Whether a capture is running on the compute stream (what was enqueued
    /// meanwhile is recorded, not run).
    pub fn is_capturing(&self) -> bool {
        self.alloc.lock().map(|m| m.is_capturing()).unwrap_or(false)
    }
}
