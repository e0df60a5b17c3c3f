//! CUDA implementations of the dense ops (called by `crate::ops` after their
//! argument checks): cuBLASLt GEMMs and the kernels of csrc/kernels/.

use crate::error::{Error, Result};
use crate::ops::PagedAttnMeta;
use crate::tensor::Tensor;

fn not_yet(op: &'static str) -> Error {
    Error::Launch { op, message: "no CUDA implementation yet".into() }
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
pub(crate) fn paged_attention(
    _out: &Tensor,
    _q: &Tensor,
    _k_cache: &Tensor,
    _v_cache: &Tensor,
    _meta: &PagedAttnMeta<'_>,
    _scale: f32,
) -> Result<()> {
    Err(not_yet("paged_attention"))
}
