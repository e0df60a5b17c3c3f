//! CPU reference of paged attention (see `crate::ops::attention`).

use crate::error::{Error, Result};
use crate::ops::PagedAttnMeta;
use crate::tensor::Tensor;

pub(crate) fn paged_attention(
    _out: &Tensor,
    _q: &Tensor,
    _k_cache: &Tensor,
    _v_cache: &Tensor,
    _meta: &PagedAttnMeta<'_>,
    _scale: f32,
) -> Result<()> {
    Err(Error::Launch { op: "paged_attention", message: "no CPU implementation yet".into() })
}
