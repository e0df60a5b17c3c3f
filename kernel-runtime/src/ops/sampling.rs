//! `sample`: one next token per row of logits, on the device that holds them
//! (csrc/kernels/sampling.cu on CUDA, `cpu::sampling` on the host), so a decode
//! step returns token ids rather than a copy of the logits; and
//! `apply_token_mask` (csrc/kernels/token_mask.cu), which sets the logits a
//! constrained row may not sample to -inf before it samples.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::staging::Upload;
use crate::tensor::Tensor;

pub use crate::op_types::sampling::SampleRow;

/// Samples one token per row of `logits` (`[rows, vocab]`, float, unit stride in
/// the last dimension) with `params[r]` for row r; returns the token ids.
pub fn sample(logits: &Tensor, params: &[SampleRow]) -> Result<Vec<u32>> {
    check(logits, params)?;
    if params.is_empty() {
        return Ok(Vec::new());
    }
    match logits.device() {
        Device::Cpu => crate::cpu::sampling::sample(logits, params),
        Device::Cuda(_) => crate::gpu::sample(logits, params),
    }
}

/// [`sample`] into `out` (`[rows]` i32 on the device of the logits), without
/// waiting for the device: on a GPU the settings go up through `upload` and the
/// ids stay on the device (read them with a [`crate::staging::Readback`]), so
/// the host can prepare the next step meanwhile.
pub fn sample_into(logits: &Tensor, params: &[SampleRow], out: &Tensor, upload: &mut Upload) -> Result<()> {
    check(logits, params)?;
    check_out(logits, params, out)?;
    if params.is_empty() {
        return Ok(());
    }
    match logits.device() {
        Device::Cpu => sample_on_host(logits, params, out),
        Device::Cuda(_) => crate::gpu::sample_into(logits, params, out, upload),
    }
}

/// The settings of [`sample`]'s rows, checked and put on a device once, for
/// launches that reuse them without a host copy each ([`sample_with`]: a bench,
/// a captured graph).
#[derive(Clone, Debug)]
pub struct SampleTable {
    rows: Vec<SampleRow>,
    /// On a GPU, the `[rows, 5]` f32 table the kernel reads.
    table: Option<Tensor>,
}

impl SampleTable {
    /// Checks `params` as [`sample`] does and copies them to `device` (waiting
    /// for the copy).
    pub fn new(params: &[SampleRow], device: Device) -> Result<SampleTable> {
        check_rows(params)?;
        let table = match device {
            Device::Cpu => None,
            Device::Cuda(_) => Some(crate::gpu::sample_table(params, device)?),
        };
        Ok(SampleTable { rows: params.to_vec(), table })
    }

    /// The settings, one per row.
    pub fn rows(&self) -> &[SampleRow] {
        &self.rows
    }
}

/// [`sample_into`] with the settings of a [`SampleTable`] on the device of the
/// logits: one launch and no host copy, so it can be captured in a CUDA graph.
pub fn sample_with(logits: &Tensor, params: &SampleTable, out: &Tensor) -> Result<()> {
    const OP: &str = "sample";
    check(logits, &params.rows)?;
    check_out(logits, &params.rows, out)?;
    if params.rows.is_empty() {
        return Ok(());
    }
    match (logits.device(), &params.table) {
        (Device::Cpu, _) => sample_on_host(logits, &params.rows, out),
        (Device::Cuda(_), Some(table)) if table.device() == logits.device() => {
            crate::gpu::sample_with(logits, table, out)
        }
        _ => Err(Error::arg(OP, "the settings table is not on the device of `logits`")),
    }
}

fn sample_on_host(logits: &Tensor, params: &[SampleRow], out: &Tensor) -> Result<()> {
    let ids: Vec<i32> = crate::cpu::sampling::sample(logits, params)?.into_iter().map(|t| t as i32).collect();
    out.write_rows(&ids, ids.len())
}

fn check_out(logits: &Tensor, params: &[SampleRow], out: &Tensor) -> Result<()> {
    const OP: &str = "sample";
    out.expect_shape(OP, "out", &[params.len()])?.expect_dtype(OP, "out", &[DType::I32])?;
    out.expect_contiguous(OP, "out")?;
    if out.device() != logits.device() {
        return Err(Error::arg(OP, "argument `out` is not on the device of `logits`"));
    }
    Ok(())
}

fn check(logits: &Tensor, params: &[SampleRow]) -> Result<()> {
    const OP: &str = "sample";
    let [rows, vocab] = logits.dims::<2>(OP, "logits")?;
    logits.expect_dtype(OP, "logits", &[DType::F32, DType::F16, DType::BF16])?;
    if params.len() != rows {
        return Err(Error::arg(OP, format!("{} parameter rows for {rows} logits rows", params.len())));
    }
    if vocab == 0 || vocab > (1 << 31) - 2 {
        return Err(Error::arg(OP, format!("argument `logits` has {vocab} columns")));
    }
    if rows > 1 && logits.strides()[1] != 1 {
        return Err(Error::arg(OP, "argument `logits` must have unit stride in its last dimension"));
    }
    check_rows(params)
}

fn check_rows(params: &[SampleRow]) -> Result<()> {
    const OP: &str = "sample";
    for (r, p) in params.iter().enumerate() {
        let bad = if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            Some("temperature")
        } else if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            Some("top_p")
        } else if !(0.0..=1.0).contains(&p.min_p) {
            Some("min_p")
        } else if !(0.0..1.0).contains(&p.u) {
            Some("u")
        } else if p.top_k > 1 << 24 {
            Some("top_k")
        } else {
            None
        };
        if let Some(field) = bad {
            return Err(Error::arg(OP, format!("row {r}: `{field}` is out of range in {p:?}")));
        }
    }
    Ok(())
}

/// Sets `logits[rows[i], t]` (`[num_rows, vocab]`, float, unit stride in the last
/// dimension; changed in place) to -inf wherever mask `i` does not allow token
/// `t`: `mask` holds `rows.len()` masks of `words_per_row` packed words (bit
/// `t % 32` of word `t / 32`; tokens past the words are disallowed). Rows not
/// in `rows` are untouched.
pub fn apply_token_mask(logits: &Tensor, mask: &[u32], words_per_row: usize, rows: &[u32]) -> Result<()> {
    const OP: &str = "apply_token_mask";
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    logits.expect_dtype(OP, "logits", &[DType::F32, DType::F16, DType::BF16])?;
    if vocab == 0 || vocab > (1 << 31) - 2 {
        return Err(Error::arg(OP, format!("argument `logits` has {vocab} columns")));
    }
    if num_rows > 1 && logits.strides()[1] != 1 {
        return Err(Error::arg(OP, "argument `logits` must have unit stride in its last dimension"));
    }
    if mask.len() != rows.len() * words_per_row {
        return Err(Error::arg(OP, format!("{} mask words for {} rows of {words_per_row}", mask.len(), rows.len())));
    }
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= num_rows) {
        return Err(Error::arg(OP, format!("row {r} is outside the {num_rows} logits rows")));
    }
    if rows.is_empty() {
        return Ok(());
    }
    match logits.device() {
        Device::Cpu => crate::cpu::sampling::apply_token_mask(logits, mask, words_per_row, rows),
        Device::Cuda(_) => crate::gpu::apply_token_mask(logits, mask, words_per_row, rows),
    }
}
