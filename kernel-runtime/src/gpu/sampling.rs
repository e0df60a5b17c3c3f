//! Token sampling on CUDA (csrc/kernels/sampling.cu): one block of 1024 threads
//! per row; the per-row settings go up as one small `[rows, 5]` f32 tensor and the
//! token ids come back as `[rows]` int32.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::op_types::sampling::SampleRow;
use crate::sys::kernels::msgl_sample_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32};

/// sampling.cu's kSampleThreads.
const THREADS: u32 = 1024;

pub(crate) fn sample(logits: &Tensor, params: &[SampleRow]) -> Result<Vec<u32>> {
    const OP: &str = "sample";
    let dev = device_of(OP, logits)?;
    let [rows, vocab] = logits.dims::<2>(OP, "logits")?;
    let device = Device::Cuda(dev.ordinal());
    let host: Vec<f32> = params.iter().flat_map(|p| [p.temperature, p.top_k as f32, p.top_p, p.min_p, p.u]).collect();
    let prm = Tensor::from_slice(&host, &[rows, 5], device)?;
    let out = Tensor::empty(&[rows], DType::I32, device)?;
    let row_stride = if rows > 1 { logits.strides()[0] } else { vocab };
    let p = msgl_sample_params {
        logits: logits.device_ptr() as *const _,
        params: prm.device_ptr() as *const f32,
        out: out.device_ptr() as *mut i32,
        vocab: vocab as i64,
        row_stride: row_stride as i64,
        num_rows: rows as i64,
    };
    let grid = grid_u32(OP, rows)?;
    let (a, b, c) = (logits.abi(), prm.abi(), out.abi());
    dispatch(
        OP,
        dev,
        "sampling",
        &[("DTYPE", dtype_code(logits))],
        // SAFETY: the views describe live device tensors: the logits checked by the
        // op, and the params and output made above, which outlive the enqueued work
        // (the out copy below synchronises the stream).
        |lib, stream| unsafe { lib.msgl_sample(&a, &b, &c, stream) },
        // SAFETY: `p` is the msgl_sample_params the entry takes, filled from the
        // same tensors.
        |f| unsafe { f.launch(dev, grid, THREADS, 0, &p) },
    )?;
    Ok(out.to_vec::<i32>()?.into_iter().map(|t| t.max(0) as u32).collect())
}
