//! CPU reference of the dense ops (see `crate::ops::dense` for their contracts).

use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn not_yet(op: &'static str) -> Error {
    Error::Launch { op, message: "no CPU implementation yet".into() }
}

pub(crate) fn linear(_out: &Tensor, _x: &Tensor, _w: &Tensor, _bias: Option<&Tensor>) -> Result<()> {
    Err(not_yet("linear"))
}
pub(crate) fn rms_norm(_out: &Tensor, _x: &Tensor, _w: &Tensor, _eps: f32) -> Result<()> {
    Err(not_yet("rms_norm"))
}
pub(crate) fn fused_add_rms_norm(_x: &Tensor, _residual: &Tensor, _w: &Tensor, _eps: f32) -> Result<()> {
    Err(not_yet("fused_add_rms_norm"))
}
pub(crate) fn head_rms_norm(_x: &Tensor, _w: &Tensor, _eps: f32) -> Result<()> {
    Err(not_yet("head_rms_norm"))
}
pub(crate) fn rope(_q: &Tensor, _k: &Tensor, _positions: &Tensor, _cos_sin: &Tensor) -> Result<()> {
    Err(not_yet("rope"))
}
pub(crate) fn silu_mul(_out: &Tensor, _x: &Tensor) -> Result<()> {
    Err(not_yet("silu_mul"))
}
pub(crate) fn argmax(_out: &Tensor, _x: &Tensor) -> Result<()> {
    Err(not_yet("argmax"))
}
