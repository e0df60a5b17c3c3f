//! A caching device allocator: `cuMemAlloc` only when no cached block fits.
//!
//! Freed blocks go to a free list keyed by size and are handed out again to the
//! next request of a similar size, so a forward pass that repeats the shapes of the
//! previous one never calls the driver allocator. All work runs on one stream per
//! device, so a block freed after its last use was enqueued can be reused by work
//! enqueued later without a synchronisation (stream order protects it).
//!
//! CUDA graphs get a pool of their own ([`DeviceMemory`]; PyTorch's "private
//! pool"): what a captured graph allocates is written by every replay of it, so
//! those blocks must never serve eager work. While a capture runs, every
//! allocation comes from the graph pool; a graph-pool block freed (during the
//! capture or after) goes back to that pool, never to the eager one, and the
//! pool never hands memory back to the driver. Graphs of one device replay one
//! at a time on its one stream, so they may share the pool's blocks.

use std::collections::{BTreeMap, HashSet};

use cudarc::driver::{result, sys};

use crate::error::{Error, Result};

/// Requests below this are rounded to 512 bytes; larger ones to 1 MiB... see [`round_size`].
const SMALL: usize = 1 << 20;

/// Counters of the allocator (for tests and `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes handed out and not yet freed.
    pub in_use_bytes: usize,
    /// Bytes held in the free lists.
    pub cached_bytes: usize,
    /// Calls to the driver allocator so far.
    pub driver_allocs: u64,
    /// Bytes the CUDA graph pool holds (in use or free; never released).
    pub graph_pool_bytes: usize,
}

/// The free lists of one device.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    free: BTreeMap<usize, Vec<sys::CUdeviceptr>>,
    stats: AllocStats,
    /// Never return cached blocks to the driver (the graph pool: captured
    /// graphs still address its free blocks).
    keep_blocks: bool,
}

/// The size class of a request: 512-byte granularity below 1 MiB, 2 MiB above, so
/// that similar requests share blocks.
pub fn round_size(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    if bytes < SMALL {
        bytes.div_ceil(512) * 512
    } else {
        bytes.div_ceil(2 << 20) * (2 << 20)
    }
}

impl CachingAllocator {
    /// A block of at least `bytes` (rounded by [`round_size`]); the returned size is
    /// what must be passed back to [`CachingAllocator::free`].
    ///
    /// The device's context must be current on this thread.
    pub fn alloc(&mut self, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        let size = round_size(bytes);
        // Best fit among cached blocks no more than 1/8 larger than asked for.
        let limit = size + size / 8;
        if let Some((&found, _)) = self.free.range(size..=limit).find(|(_, v)| !v.is_empty()) {
            if let Some(ptr) = self.free.get_mut(&found).and_then(Vec::pop) {
                self.stats.cached_bytes -= found;
                self.stats.in_use_bytes += found;
                return Ok((ptr, found));
            }
        }
        // SAFETY: the caller made the device's context current; the size is non-zero.
        let ptr = match unsafe { result::malloc_sync(size) } {
            Ok(p) => p,
            Err(e) if self.keep_blocks => {
                return Err(Error::Driver { what: format!("allocating {size} bytes for a CUDA graph"), source: e })
            }
            Err(_) => {
                // Out of memory with blocks cached: give them back and try once more.
                self.release_cached()?;
                // SAFETY: as above.
                unsafe { result::malloc_sync(size) }.map_err(|e| Error::Driver {
                    what: format!("allocating {size} bytes (in use {} bytes)", self.stats.in_use_bytes),
                    source: e,
                })?
            }
        };
        self.stats.driver_allocs += 1;
        self.stats.in_use_bytes += size;
        Ok((ptr, size))
    }

    /// Returns a block (of the size [`CachingAllocator::alloc`] reported) to the cache.
    pub fn free(&mut self, ptr: sys::CUdeviceptr, size: usize) {
        self.stats.in_use_bytes = self.stats.in_use_bytes.saturating_sub(size);
        self.stats.cached_bytes += size;
        self.free.entry(size).or_default().push(ptr);
    }

    /// Frees every cached block with the driver.
    ///
    /// The device's context must be current and no enqueued work may still use a
    /// cached block (callers synchronise the stream first).
    pub fn release_cached(&mut self) -> Result<()> {
        for (size, ptrs) in std::mem::take(&mut self.free) {
            for p in ptrs {
                // SAFETY: `p` came from malloc_sync, is not in use (it is in the free
                // list) and is freed once (it was just taken out of the list).
                unsafe { result::free_sync(p) }.map_err(Error::driver("freeing cached memory"))?;
                self.stats.cached_bytes -= size;
            }
        }
        Ok(())
    }

    /// Current counters.
    pub fn stats(&self) -> AllocStats {
        self.stats
    }
}

/// The two pools of a device: eager work's and CUDA graphs' (see the module
/// header).
#[derive(Debug)]
pub struct DeviceMemory {
    eager: CachingAllocator,
    graph: CachingAllocator,
    /// Every block the graph pool ever handed out, so that its free goes back there.
    graph_blocks: HashSet<sys::CUdeviceptr>,
    /// A capture is running: allocations come from the graph pool.
    capturing: bool,
}

impl Default for DeviceMemory {
    fn default() -> Self {
        DeviceMemory {
            eager: CachingAllocator::default(),
            graph: CachingAllocator { keep_blocks: true, ..CachingAllocator::default() },
            graph_blocks: HashSet::new(),
            capturing: false,
        }
    }
}

impl DeviceMemory {
    /// A block from the graph pool while capturing, else from the eager pool.
    pub fn alloc(&mut self, bytes: usize) -> Result<(sys::CUdeviceptr, usize)> {
        if !self.capturing {
            return self.eager.alloc(bytes);
        }
        let (ptr, size) = self.graph.alloc(bytes)?;
        self.graph_blocks.insert(ptr);
        Ok((ptr, size))
    }

    /// Returns a block to the pool it came from.
    pub fn free(&mut self, ptr: sys::CUdeviceptr, size: usize) {
        if self.graph_blocks.contains(&ptr) {
            self.graph.free(ptr, size);
        } else {
            self.eager.free(ptr, size);
        }
    }

    /// Starts or ends a capture (allocations go to the graph pool meanwhile).
    pub fn set_capturing(&mut self, capturing: bool) {
        self.capturing = capturing;
    }

    /// Whether a capture is running.
    pub fn is_capturing(&self) -> bool {
        self.capturing
    }

    /// Frees the eager pool's cached blocks (the graph pool keeps its own).
    pub fn release_cached(&mut self) -> Result<()> {
        self.eager.release_cached()
    }

    /// The eager pool's counters, with the graph pool's size.
    pub fn stats(&self) -> AllocStats {
        let g = self.graph.stats();
        AllocStats {
            graph_pool_bytes: g.in_use_bytes + g.cached_bytes,
            driver_allocs: self.eager.stats().driver_allocs + g.driver_allocs,
            ..self.eager.stats()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_into_classes() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(SMALL - 1), SMALL);
        assert_eq!(round_size(SMALL), 2 << 20);
        assert_eq!(round_size((2 << 20) + 1), 4 << 20);
    }

    #[test]
    fn freed_blocks_are_reused_without_the_driver() {
        let mut a = CachingAllocator::default();
        // Put two fake blocks in the cache: no driver call is made for cached sizes.
        a.free(0x1000, 1024);
        a.free(0x2000, 4096);
        assert_eq!(a.stats().cached_bytes, 5120);
        assert_eq!(a.alloc(1000).unwrap(), (0x1000, 1024));
        assert_eq!(a.alloc(4000).unwrap(), (0x2000, 4096));
        assert_eq!(
            a.stats(),
            AllocStats { in_use_bytes: 5120, cached_bytes: 0, driver_allocs: 0, graph_pool_bytes: 0 }
        );
    }

    #[test]
    fn graph_blocks_go_back_to_the_graph_pool() {
        let mut m = DeviceMemory::default();
        // A block the graph pool handed out (as if allocated during a capture)...
        m.graph.free(0x1000, 1024);
        m.set_capturing(true);
        assert_eq!(m.alloc(1000).unwrap(), (0x1000, 1024));
        m.set_capturing(false);
        // ...returns to it when freed after the capture, and eager work never gets it.
        m.free(0x1000, 1024);
        m.eager.free(0x2000, 1024);
        assert_eq!(m.alloc(1000).unwrap(), (0x2000, 1024));
        assert_eq!(m.graph.stats().cached_bytes, 1024);
        assert_eq!(m.stats().graph_pool_bytes, 1024);
        m.release_cached().unwrap();
        assert_eq!(m.graph.stats().cached_bytes, 1024, "the graph pool keeps its blocks");
    }
}
