//! Row-wise argmax on CUDA (csrc/kernels/argmax.cu): greedy token choice.
//!
//! The split count is chosen here: a row is cut into `num_splits` slices of at
//! least 4096 elements so that the whole batch covers about two blocks per SM
//! (a batch of one with a 256k vocabulary gets about 60 blocks); with more than
//! one split a second launch reduces the per-slice winners.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::sys::kernels::msgl_argmax_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned};

/// argmax.cu's kArgmaxThreads.
const THREADS: usize = 512;
/// The fewest elements a block scans.
const MIN_SPLIT: usize = 4096;

/// `(num_splits, split_len)` for `rows` rows of `vocab` elements on `sms` SMs.
fn splits(rows: usize, vocab: usize, sms: usize) -> (usize, usize) {
    let wanted = (2 * sms).div_ceil(rows.max(1)).max(1);
    let most = (vocab / MIN_SPLIT).max(1);
    let n = wanted.min(most);
    let split_len = vocab.div_ceil(n).next_multiple_of(8);
    (vocab.div_ceil(split_len), split_len)
}

/// `out[r]` = the first index of the maximum of row r of `x` `[b, v]` (contiguous).
pub(crate) fn argmax(out: &Tensor, x: &Tensor) -> Result<()> {
    const OP: &str = "argmax";
    let dev = device_of(OP, x)?;
    let [rows, vocab] = x.dims::<2>(OP, "x")?;
    let (num_splits, split_len) = splits(rows, vocab, dev.sm_count().max(1) as usize);
    let vectorized = rows_aligned(x, 16);
    let device = Device::Cuda(dev.ordinal());
    let (pv, pi) = if num_splits > 1 {
        (
            Some(Tensor::empty(&[rows, num_splits], DType::F32, device)?),
            Some(Tensor::empty(&[rows, num_splits], DType::I32, device)?),
        )
    } else {
        (None, None)
    };
    let p = msgl_argmax_params {
        x: x.device_ptr() as *const _,
        out: out.device_ptr() as *mut i32,
        partial_value: pv.as_ref().map_or(std::ptr::null_mut(), |t| t.device_ptr() as *mut f32),
        partial_index: pi.as_ref().map_or(std::ptr::null_mut(), |t| t.device_ptr() as *mut i32),
        rows: rows as i64,
        vocab: vocab as i64,
        row_stride: vocab as i64,
        split_len: split_len as i64,
        num_splits: num_splits as i32,
        stage: 0,
        vectorized: i32::from(vectorized),
        reserved: 0,
    };
    let scan_grid = grid_u32(OP, rows * num_splits)?;
    let reduce_grid = grid_u32(OP, rows.div_ceil(THREADS / 32))?;
    let (a, b) = (out.abi(), x.abi());
    let (c, d) = (pv.as_ref().map(Tensor::abi), pi.as_ref().map(Tensor::abi));
    dispatch(
        OP,
        dev,
        "argmax",
        &[("DTYPE", dtype_code(x))],
        |lib, stream| {
            let c = c.as_ref().map_or(std::ptr::null(), |t| t as *const _);
            let d = d.as_ref().map_or(std::ptr::null(), |t| t as *const _);
            // SAFETY: the views describe live device tensors checked by the op (and the
            // scratch allocated above, which outlives the enqueued work: the caching
            // allocator only reuses it for work enqueued later on the same stream).
            unsafe { lib.msgl_argmax(&a, &b, c, d, num_splits as i32, split_len as i64, i32::from(vectorized), stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_argmax_params the entry takes, filled from the
            // tensors checked by the op and the scratch allocated above.
            unsafe { f.launch(dev, scan_grid, THREADS as u32, 0, &p) }?;
            if num_splits > 1 {
                let p1 = msgl_argmax_params { stage: 1, ..p };
                // SAFETY: as above; stage 1 reads the partials stage 0 wrote, in
                // stream order.
                unsafe { f.launch(dev, reduce_grid, THREADS as u32, 0, &p1) }?;
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_row_and_fill_the_gpu() {
        for (rows, vocab) in
            [(1, 1), (1, 7), (1, 4096), (1, 128_256), (1, 262_144), (7, 151_936), (64, 32_000), (1024, 128_256)]
        {
            let (n, len) = splits(rows, vocab, 132);
            assert!(len.is_multiple_of(8) && n >= 1, "{rows} x {vocab}");
            assert!((n - 1) * len < vocab && n * len >= vocab, "{rows} x {vocab}: {n} x {len}");
            assert!(n == 1 || len >= MIN_SPLIT, "{rows} x {vocab}: {n} x {len}");
        }
        assert!(splits(1, 262_144, 132).0 >= 60);
        assert_eq!(splits(1024, 128_256, 132).0, 1);
    }
}
