//! CPU reference of paged attention (see `crate::ops::attention` for the contract).
//!
//! The plain algorithm, with nothing fused or tiled as a GPU kernel would: for each
//! sequence, gather its K and V rows out of the pages (following its block-table
//! row) into contiguous f32 buffers, then for every (new token, query head) pair
//! compute the causal scores against the KV head of its GQA group, a softmax in
//! f32 with the maximum subtracted, and the weighted sum of V. Pairs run in
//! parallel (rayon); the output is rounded once to its dtype at the end.
//!
//! Besides the checks `ops::paged_attention` makes on shapes, this reads the
//! device-side metadata (`q_indptr`, `kv_lens`, `block_table`) and rejects values
//! that disagree with the host copies or point outside the cache, so that a bad
//! batch built by the engine is an error here rather than a wrong answer.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::cpu::dense::read_indices;
use crate::cpu::{read_f32, write_f32};
use crate::dtype::{DType, FloatElement};
use crate::error::{Error, Result};
use crate::op_types::attention::PagedAttnMeta;
use crate::tensor::Tensor;

const OP: &str = "paged_attention";

/// Dot product with eight independent accumulators (vectorisable, see
/// `dense::sum_squares`).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Rows `0..kv_len` of one sequence out of a paged cache, as f32 `[kv_len, row]`.
fn gather_typed<T: FloatElement>(cache: &Tensor, pages: &[usize], kv_len: usize) -> Result<Vec<f32>> {
    let [page_size, heads, d] = [cache.dim(1), cache.dim(2), cache.dim(3)];
    let row = heads * d;
    // SAFETY: read-only access to a contiguous host tensor.
    let cs = unsafe { cache.host_slice::<T>()? };
    let mut out = Vec::with_capacity(kv_len * row);
    for (i, &page) in pages.iter().enumerate() {
        let rows = page_size.min(kv_len - i * page_size);
        let start = page * page_size * row;
        out.extend(cs[start..start + rows * row].iter().map(|v| v.to_f32()));
    }
    Ok(out)
}

fn gather(cache: &Tensor, pages: &[usize], kv_len: usize) -> Result<Vec<f32>> {
    match cache.dtype() {
        DType::F32 => gather_typed::<f32>(cache, pages, kv_len),
        DType::F16 => gather_typed::<f16>(cache, pages, kv_len),
        DType::BF16 => gather_typed::<bf16>(cache, pages, kv_len),
        other => Err(Error::arg(OP, format!("cache dtype {other} is not a float type"))),
    }
}

/// `out = softmax(q K^T * scale + causal mask) V` over the paged caches.
pub(crate) fn paged_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
) -> Result<()> {
    let [t, hq, d] = [q.dim(0), q.dim(1), q.dim(2)];
    let [num_pages, page_size, hkv] = [k_cache.dim(0), k_cache.dim(1), k_cache.dim(2)];
    let group = hq / hkv;
    let max_pages = meta.block_table.dim(1);

    let q_indptr = read_indices(OP, meta.q_indptr)?;
    let kv_lens = read_indices(OP, meta.kv_lens)?;
    let block_table = read_indices(OP, &meta.block_table.reshape(&[meta.block_table.numel()])?)?;

    let qf = read_f32(q)?;
    let mut outf = vec![0f32; t * hq * d];
    for (s, (&q_len, &kv_len)) in meta.q_lens_host.iter().zip(meta.kv_lens_host).enumerate() {
        let (q0, q1) = (q_indptr[s], q_indptr[s + 1]);
        if q0 < 0 || q1 < q0 || q1 as usize > t || (q1 - q0) as usize != q_len {
            return Err(Error::arg(
                OP,
                format!("q_indptr[{s}..={}] = {q0}..{q1} disagrees with {q_len} query tokens of {t} rows", s + 1),
            ));
        }
        if kv_lens[s] != kv_len as i64 {
            return Err(Error::arg(OP, format!("kv_lens[{s}] = {} disagrees with the host copy {kv_len}", kv_lens[s])));
        }
        if q_len == 0 {
            continue;
        }
        let pages = block_table[s * max_pages..][..kv_len.div_ceil(page_size)]
            .iter()
            .map(|&p| {
                usize::try_from(p).ok().filter(|&p| p < num_pages).ok_or_else(|| {
                    Error::arg(OP, format!("sequence {s} refers to page {p} of a cache of {num_pages} pages"))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let kf = gather(k_cache, &pages, kv_len)?;
        let vf = gather(v_cache, &pages, kv_len)?;
        let (q0, prefix) = (q0 as usize, kv_len - q_len);

        outf[q0 * hq * d..(q0 + q_len) * hq * d].par_chunks_mut(d).enumerate().for_each_init(
            || Vec::with_capacity(kv_len),
            |scores, (r, o)| {
                let (j, h) = (r / hq, r % hq);
                let g = h / group;
                let qrow = &qf[((q0 + j) * hq + h) * d..][..d];
                // Causal: new token j sits at position prefix + j and sees 0..=that.
                let visible = prefix + j + 1;
                scores.clear();
                let mut max = f32::NEG_INFINITY;
                for p in 0..visible {
                    let s = dot(qrow, &kf[(p * hkv + g) * d..][..d]) * scale;
                    max = max.max(s);
                    scores.push(s);
                }
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                for (p, &w) in scores.iter().enumerate() {
                    let w = w * inv;
                    for (o, v) in o.iter_mut().zip(&vf[(p * hkv + g) * d..][..d]) {
                        *o += w * v;
                    }
                }
            },
        );
    }
    write_f32(out, &outf)
}
