//! A caching device allocator: `cuMemAlloc` only when no cached block fits.
//!
//! Freed blocks go to a free list keyed by size and are handed out again to the
//! next request of a similar size, so a forward pass that repeats the shapes of the
//! previous one never calls the driver allocator. All work runs on one stream per
//! device, so a block freed after its last use was enqueued can be reused by work
//! enqueued later without a synchronisation (stream order protects it).

use std::collections::BTreeMap;

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
}

/// The free lists of one device.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    free: BTreeMap<usize, Vec<sys::CUdeviceptr>>,
    stats: AllocStats,
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
        assert_eq!(a.stats(), AllocStats { in_use_bytes: 5120, cached_bytes: 0, driver_allocs: 0 });
    }
}
