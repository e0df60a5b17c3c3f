//! L2 prefetch on CUDA (csrc/kernels/l2_prefetch.cu): asks the cache to fetch
//! weights ahead of the projection that reads them, on the device's side stream
//! (forked from the compute stream where the prefetch is enqueued; nothing on the
//! compute stream waits for it).
//!
//! The launch shape is chosen here: one warp a block, and pieces of the ranges
//! sized so that the whole grid holds about one piece a thread on every SM (4 KiB
//! at least, whole pages of 4 KiB): a prefetch issued from a few SMs would be
//! bound by their copy engines rather than by HBM.

use crate::error::Result;
use crate::sys::kernels::{msgl_l2_prefetch_params, MSGL_L2_PREFETCH_REGIONS};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch_on, grid_u32};

/// l2_prefetch.cu's kPrefetchThreads.
const THREADS: usize = 32;
/// The smallest piece one thread prefetches.
const MIN_PIECE: usize = 4096;
const REGIONS: usize = MSGL_L2_PREFETCH_REGIONS as usize;

/// `(start, bytes)` of a range trimmed inward to 16-byte boundaries (a prefetch
/// needs 16-byte aligned addresses and sizes; the few bytes at either end stay
/// unfetched rather than reaching past the allocation).
fn trimmed(ptr: u64, bytes: usize) -> (u64, usize) {
    let start = ptr.next_multiple_of(16);
    let end = (ptr + bytes as u64) / 16 * 16;
    if end <= start {
        (start, 0)
    } else {
        (start, (end - start) as usize)
    }
}

/// `(piece_bytes, pieces)`: pieces of at least [`MIN_PIECE`] bytes, whole 4 KiB
/// pages, about one a thread over `sms` SMs of one warp each.
fn pieces(ranges: &[usize], sms: usize) -> (usize, usize) {
    let total: usize = ranges.iter().sum();
    let piece = total.div_ceil(sms.max(1) * THREADS).next_multiple_of(MIN_PIECE).max(MIN_PIECE);
    (piece, ranges.iter().map(|b| b.div_ceil(piece)).sum())
}

/// Prefetches the storage of every tensor of `tensors` (contiguous, on one CUDA
/// device: checked by the op) into the L2 cache, in launches of up to four ranges.
pub(crate) fn prefetch_l2(tensors: &[&Tensor]) -> Result<()> {
    const OP: &str = "prefetch_l2";
    let Some(first) = tensors.first() else { return Ok(()) };
    let dev = device_of(OP, first)?;
    for group in tensors.chunks(REGIONS) {
        let mut p = msgl_l2_prefetch_params {
            ptr: [std::ptr::null(); REGIONS],
            bytes: [0; REGIONS],
            chunk_bytes: 0,
            count: 0,
            reserved: 0,
        };
        let mut sizes = Vec::with_capacity(REGIONS);
        for t in group {
            let (start, bytes) = trimmed(t.device_ptr(), t.numel() * t.dtype().size_in_bytes());
            if bytes == 0 {
                continue;
            }
            let r = p.count as usize;
            p.ptr[r] = start as *const _;
            p.bytes[r] = bytes as i64;
            p.count += 1;
            sizes.push(bytes);
        }
        if p.count == 0 {
            continue;
        }
        let (piece, total_pieces) = pieces(&sizes, dev.sm_count().max(1) as usize);
        p.chunk_bytes = piece as i64;
        let grid = grid_u32(OP, total_pieces.div_ceil(THREADS))?;
        let bulk = i32::from(dev.capability().0 >= 9);
        // On the side stream: the kernels after it on the compute stream must not
        // wait for it (a grid's end waits for its prefetches to land, which would put
        // the whole fetch on the step's critical path).
        dev.on_side_stream(|side| {
            dispatch_on(
                OP,
                dev,
                side,
                "l2_prefetch",
                &[("BULK", i64::from(bulk))],
                |lib, stream| {
                    // SAFETY: `p` holds ranges inside live device tensors (trimmed to
                    // 16-byte boundaries); the kernel only issues cache prefetches of them.
                    unsafe { lib.msgl_l2_prefetch(&p, grid as i32, bulk, stream) }
                },
                |f| {
                    // SAFETY: as above; `p` is the params struct the entry takes, `side`
                    // the device's side stream.
                    unsafe { f.launch_on(dev, side, grid, THREADS as u32, 0, &p) }
                },
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_trimmed_inward_to_16_bytes() {
        assert_eq!(trimmed(256, 4096), (256, 4096));
        assert_eq!(trimmed(260, 4096), (272, 4080));
        assert_eq!(trimmed(256, 4100), (256, 4096));
        assert_eq!(trimmed(260, 8), (272, 0));
        assert_eq!(trimmed(0, 0), (0, 0));
    }

    #[test]
    fn pieces_spread_a_range_over_every_sm() {
        // Llama-3-8B's o_proj (32 MiB) on 132 SMs: 8 KiB pieces, 4096 of them (128 warps).
        assert_eq!(pieces(&[32 << 20], 132), (8192, 4096));
        // Small ranges take the smallest piece; each range is cut on its own.
        assert_eq!(pieces(&[4096, 100, 5000], 132), (4096, 4));
        // A piece is a whole number of 4 KiB pages and no piece count exceeds ~one a thread.
        let (piece, n) = pieces(&[23 << 20, 1 << 20], 132);
        assert_eq!(piece % MIN_PIECE, 0);
        assert!(n <= 132 * THREADS + 2, "{n}");
    }
}
