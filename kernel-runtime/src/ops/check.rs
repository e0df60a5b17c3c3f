//! Argument checks the launchers of `ops` share. Kept apart from `ops/mod.rs`
//! so that the launchers do not import the module that re-exports them.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// All tensors are on one device; returns it.
pub(crate) fn common_device(op: &'static str, tensors: &[(&str, &Tensor)]) -> Result<Device> {
    let Some((first_name, first)) = tensors.first() else {
        return Err(Error::arg(op, "no tensors"));
    };
    for (name, t) in &tensors[1..] {
        if t.device() != first.device() {
            return Err(Error::arg(
                op,
                format!("argument `{name}` is on {} but `{first_name}` is on {}", t.device(), first.device()),
            ));
        }
    }
    Ok(first.device())
}

/// A 2-D row view `[rows, row_len]` of `t`: the first dimension indexes rows, the
/// other dimensions must be contiguous among themselves (one dense row each).
pub(crate) fn rows_view(op: &'static str, what: &str, t: &Tensor) -> Result<Tensor> {
    if t.rank() < 2 {
        return Err(Error::arg(
            op,
            format!("argument `{what}` must have at least 2 dimensions, got shape {:?}", t.shape()),
        ));
    }
    let inner = &t.shape()[1..];
    let inner_strides = &t.strides()[1..];
    let expected = crate::tensor::contiguous_strides(inner);
    let dense = inner.iter().zip(inner_strides.iter().zip(&expected)).all(|(d, (s, e))| *d == 1 || s == e);
    if !dense {
        return Err(Error::arg(
            op,
            format!("argument `{what}` must have dense rows (shape {:?}, strides {:?})", t.shape(), t.strides()),
        ));
    }
    let row: usize = inner.iter().product();
    // With a single row the outer stride is irrelevant; make it the dense one.
    let stride0 = if t.dim(0) <= 1 { row } else { t.strides()[0] };
    t.as_strided(&[t.dim(0), row], &[stride0, 1], t.offset())
}
