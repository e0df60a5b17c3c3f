//! Token sampling on CUDA (csrc/kernels/sampling.cu): one block of 1024 threads
//! per row (its 32 warps each own one contiguous run of the row); the per-row
//! settings go up as one small `[rows, 5]` f32 table and the token ids come back
//! as `[rows]` int32. The kernel finds each row's alignment itself, so any row
//! stride works with 16-byte loads.

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
    let dev = device_of("sample", logits)?;
    let out = Tensor::empty(&[params.len()], DType::I32, Device::Cuda(dev.ordinal()))?;
    // No staging: the plain upload waits for the stream, and so does the read below.
    launch(logits, params, &out, None)?;
    Ok(out.to_vec::<i32>()?.into_iter().map(|t| t.max(0) as u32).collect())
}

/// Enqueues the sampling of every row of `logits` into `out` (`[rows]` i32 on the
/// same device) without waiting: the settings go up through `upload`.
pub(crate) fn sample_into(
    logits: &Tensor,
    params: &[SampleRow],
    out: &Tensor,
    upload: &mut crate::staging::Upload,
) -> Result<()> {
    launch(logits, params, out, Some(upload))
}

/// The settings table of `ops::SampleTable` (waiting for the copy).
pub(crate) fn sample_table(params: &[SampleRow], device: Device) -> Result<Tensor> {
    table(params, device, None)
}

/// Enqueues the sampling of every row of `logits` into `out` with a table made
/// by [`sample_table`] on the same device.
pub(crate) fn sample_with(logits: &Tensor, prm: &Tensor, out: &Tensor) -> Result<()> {
    launch_table(logits, prm, out)
}

/// The `[rows, 5]` f32 table the kernel reads (temperature, top_k, top_p, min_p,
/// u a row), on `device`, written through `upload` or, without one, at once.
fn table(params: &[SampleRow], device: Device, upload: Option<&mut crate::staging::Upload>) -> Result<Tensor> {
    let host: Vec<f32> = params.iter().flat_map(|p| [p.temperature, p.top_k as f32, p.top_p, p.min_p, p.u]).collect();
    // A fresh block each step: the allocator hands it out again only to work
    // enqueued after the kernel that reads it (one stream), so it needs no
    // lifetime of its own.
    let prm = Tensor::empty(&[params.len(), 5], DType::F32, device)?;
    match upload {
        Some(upload) => upload.write_rows(&prm, &host, 5)?,
        None => prm.write_rows(&host, 5)?,
    }
    Ok(prm)
}

fn launch(
    logits: &Tensor,
    params: &[SampleRow],
    out: &Tensor,
    upload: Option<&mut crate::staging::Upload>,
) -> Result<()> {
    let prm = table(params, logits.device(), upload)?;
    launch_table(logits, &prm, out)
}

/// Enqueues the kernel over `logits` with the settings `prm` (made by [`table`]
/// on the device of the logits, one row per logits row) into `out`.
fn launch_table(logits: &Tensor, prm: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "sample";
    let dev = device_of(OP, logits)?;
    let [rows, vocab] = logits.dims::<2>(OP, "logits")?;
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
        // SAFETY: the views describe live device tensors: the logits and the output
        // checked by the op, and the params table of as many rows, made by `table`
        // on the same device (its block reused only for work enqueued later).
        |lib, stream| unsafe { lib.msgl_sample(&a, &b, &c, stream) },
        // SAFETY: `p` is the msgl_sample_params the entry takes, filled from the
        // same tensors.
        |f| unsafe { f.launch(dev, grid, THREADS, 0, &p) },
    )
}
