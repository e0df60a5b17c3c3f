//! CPU reference of the dense ops (see `crate::ops::dense` for their contracts).
//!
//! Every op reads its inputs as f32 (f16/bf16 widened exactly), computes in f32 and
//! rounds once when it writes its output, so the bf16/f16 results differ from the
//! f32 ones only by that last rounding. Unlike the plain loops of `cpu::mod`, these
//! functions run the models of `--device cpu`, so the heavy ones are tuned a
//! little: [`linear`] is the `gemm` crate's f32 GEMM (split over rayon for
//! decode-sized batches, where `gemm` itself would run a single-threaded GEMV),
//! and the row-wise ops run their rows in parallel when there are enough of them.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::cpu::{read_f32, write_f32};
use crate::dtype::{DType, FloatElement};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Elements of work per rayon task in the row-wise ops: below this, splitting
/// costs more than it saves.
const MIN_ELEMS_PER_TASK: usize = 16 * 1024;

/// Rows per rayon task for rows of `row_len` elements.
fn min_rows(row_len: usize) -> usize {
    (MIN_ELEMS_PER_TASK / row_len.max(1)).max(1)
}

/// Runs `$f::<T>(args)` with `T` the element type of a float dtype.
macro_rules! float_dispatch {
    ($op:expr, $dtype:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            other => Err(Error::arg($op, format!("dtype {other} is not a float type"))),
        }
    };
}

/// Sum of squares with eight independent accumulators (so that LLVM vectorises
/// it; a single running sum is a serial dependency chain in strict IEEE order).
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    acc.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>()
}

/// `1 / sqrt(mean(x^2) + eps)`.
#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt()
}

// ---- linear --------------------------------------------------------------------

/// Below this many output rows the GEMM is split over its output columns (see the
/// module docs); at and above it `gemm` parallelises on its own.
const SPLIT_N_BELOW_M: usize = 16;
/// Output columns per task when splitting over columns.
const MIN_COLS_PER_TASK: usize = 256;

/// An f32 matrix operand: a pointer into host memory with its strides.
#[derive(Clone, Copy)]
struct MatRef<'a> {
    data: &'a [f32],
    row_stride: isize,
    col_stride: isize,
}

/// `dst[m, n] (+)= lhs[m, k] @ rhs[k, n]` for `(m, n, k) = mnk`, where `dst` is
/// row-major with `n` columns; `accumulate` keeps what `dst` holds (the bias).
fn gemm_f32(
    mnk: (usize, usize, usize),
    dst: &mut [f32],
    accumulate: bool,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    parallel: bool,
) {
    let (m, n, k) = mnk;
    debug_assert!(dst.len() >= m * n);
    let parallelism = if parallel { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    // SAFETY: `dst` holds m x n row-major elements (asserted by the callers' sizes);
    // `lhs` and `rhs` describe m x k and k x n matrices whose every element lies in
    // their slices (the strides come from bounds-checked tensor views, or from
    // contiguous buffers of exactly that size); dst is a distinct allocation.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride,
            lhs.row_stride,
            rhs.data.as_ptr(),
            rhs.col_stride,
            rhs.row_stride,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// `out = x @ w^T + bias` (see `ops::linear`).
pub(crate) fn linear(out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    let (m, k, n) = (x.dim(0), x.dim(1), w.dim(0));

    // x: borrowed as is when it is f32 (any strides), widened otherwise.
    let x_owned;
    let lhs = if x.dtype() == DType::F32 {
        // SAFETY: read-only access to a host tensor (ops' ordering rule).
        let data = unsafe { x.host_slice::<f32>()? };
        MatRef { data, row_stride: x.strides()[0] as isize, col_stride: x.strides()[1] as isize }
    } else {
        x_owned = read_f32(x)?;
        MatRef { data: &x_owned, row_stride: k as isize, col_stride: 1 }
    };
    // w [n, k] contiguous, read as the k x n matrix w^T.
    let w_owned;
    let w_data: &[f32] = if w.dtype() == DType::F32 {
        // SAFETY: as above.
        unsafe { w.host_slice::<f32>()? }
    } else {
        w_owned = read_f32(w)?;
        &w_owned
    };
    let rhs = MatRef { data: w_data, row_stride: 1, col_stride: k as isize };

    let mut acc = vec![0f32; m * n];
    let accumulate = match bias {
        Some(b) => {
            let b = read_f32(b)?;
            for row in acc.chunks_exact_mut(n) {
                row.copy_from_slice(&b);
            }
            true
        }
        None => false,
    };

    if k == 0 {
        // Nothing to multiply: the output is the bias (or zeros).
    } else if m < SPLIT_N_BELOW_M && n >= 2 * MIN_COLS_PER_TASK && rayon::current_num_threads() > 1 {
        // Decode-sized batch: one task per block of output columns (weight rows).
        let block = n.div_ceil(rayon::current_num_threads() * 4).max(MIN_COLS_PER_TASK);
        let parts: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(block))
            .into_par_iter()
            .map(|bi| {
                let (c0, c1) = (bi * block, ((bi + 1) * block).min(n));
                let nb = c1 - c0;
                let mut part = vec![0f32; m * nb];
                if accumulate {
                    for (dst, src) in part.chunks_exact_mut(nb).zip(acc.chunks_exact(n)) {
                        dst.copy_from_slice(&src[c0..c1]);
                    }
                }
                let rhs_block = MatRef { data: &rhs.data[c0 * k..c1 * k], ..rhs };
                gemm_f32((m, nb, k), &mut part, accumulate, lhs, rhs_block, false);
                (c0, part)
            })
            .collect();
        for (c0, part) in parts {
            let nb = part.len() / m;
            for (dst, src) in acc.chunks_exact_mut(n).zip(part.chunks_exact(nb)) {
                dst[c0..c0 + nb].copy_from_slice(src);
            }
        }
    } else {
        gemm_f32((m, n, k), &mut acc, accumulate, lhs, rhs, true);
    }
    write_f32(out, &acc)
}

// ---- RMSNorm -------------------------------------------------------------------

fn rms_norm_typed<T: FloatElement>(out: &Tensor, x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    let h = x.dim(1);
    if h == 0 {
        return Ok(());
    }
    let (s0, s1) = (x.strides()[0], x.strides()[1]);
    let w = read_f32(w)?;
    // SAFETY: x is read and out (a fresh contiguous tensor, another buffer) written
    // under the ops' ordering rule.
    let (xs, os) = unsafe { (x.host_slice::<T>()?, out.host_slice_mut::<T>()?) };
    os.par_chunks_mut(h).with_min_len(min_rows(h)).enumerate().for_each_init(
        || vec![0f32; h],
        |row, (i, o)| {
            for (j, r) in row.iter_mut().enumerate() {
                *r = xs[i * s0 + j * s1].to_f32();
            }
            let inv = inv_rms(row, eps);
            for ((o, r), w) in o.iter_mut().zip(row.iter()).zip(&w) {
                *o = T::from_f32(r * inv * w);
            }
        },
    );
    Ok(())
}

/// `out = x / rms(x) * w` (see `ops::rms_norm`).
pub(crate) fn rms_norm(out: &Tensor, x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    float_dispatch!("rms_norm", x.dtype(), rms_norm_typed(out, x, w, eps))
}

fn fused_add_rms_norm_typed<T: FloatElement>(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    let h = x.dim(1);
    if h == 0 {
        return Ok(());
    }
    let w = read_f32(w)?;
    // SAFETY: x and residual are contiguous tensors in distinct buffers (checked by
    // the op), each written through its own slice only.
    let (xs, rs) = unsafe { (x.host_slice_mut::<T>()?, residual.host_slice_mut::<T>()?) };
    xs.par_chunks_mut(h).zip(rs.par_chunks_mut(h)).with_min_len(min_rows(h)).for_each_init(
        || vec![0f32; h],
        |sum, (xr, rr)| {
            for ((s, x), r) in sum.iter_mut().zip(xr.iter()).zip(rr.iter_mut()) {
                *s = x.to_f32() + r.to_f32();
                *r = T::from_f32(*s);
            }
            // NOTE: the norm is taken of the f32 sum, not of the rounded residual
            // (FlashInfer's fused_add_rmsnorm does the same); for f32 they agree.
            let inv = inv_rms(sum, eps);
            for ((x, s), w) in xr.iter_mut().zip(sum.iter()).zip(&w) {
                *x = T::from_f32(s * inv * w);
            }
        },
    );
    Ok(())
}

/// `residual += x; x = rms_norm(residual) * w`, in place (see `ops::fused_add_rms_norm`).
pub(crate) fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    float_dispatch!("fused_add_rms_norm", x.dtype(), fused_add_rms_norm_typed(x, residual, w, eps))
}

fn head_rms_norm_typed<T: FloatElement>(x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    let [t, heads, d] = [x.dim(0), x.dim(1), x.dim(2)];
    let (s0, s1) = (x.strides()[0], x.strides()[1]);
    let w = read_f32(w)?;
    // SAFETY: exclusive write access to a host tensor (ops' ordering rule). The
    // view may interleave with other views of its buffer (a fused QKV output), so
    // it is one slice walked serially rather than split across threads.
    let xs = unsafe { x.host_slice_mut::<T>()? };
    let mut row = vec![0f32; d];
    for i in 0..t {
        for h in 0..heads {
            let r = &mut xs[i * s0 + h * s1..][..d];
            for (dst, src) in row.iter_mut().zip(r.iter()) {
                *dst = src.to_f32();
            }
            let inv = inv_rms(&row, eps);
            for ((dst, v), w) in r.iter_mut().zip(&row).zip(&w) {
                *dst = T::from_f32(v * inv * w);
            }
        }
    }
    Ok(())
}

/// Per-head RMSNorm in place (see `ops::head_rms_norm`).
pub(crate) fn head_rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    float_dispatch!("head_rms_norm", x.dtype(), head_rms_norm_typed(x, w, eps))
}

// ---- rotary embedding ----------------------------------------------------------

/// Reads an int32/int64 host tensor of rank 1 as i64 values.
pub(crate) fn read_indices(op: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    let s0 = t.strides().first().copied().unwrap_or(1);
    // SAFETY: read-only access to a host tensor.
    unsafe {
        Ok(match t.dtype() {
            DType::I32 => {
                let s = t.host_slice::<i32>()?;
                (0..t.numel()).map(|i| i64::from(s[i * s0])).collect()
            }
            DType::I64 => {
                let s = t.host_slice::<i64>()?;
                (0..t.numel()).map(|i| s[i * s0]).collect()
            }
            other => return Err(Error::arg(op, format!("indices have dtype {other}, expected i32|i64"))),
        })
    }
}

fn rope_typed<T: FloatElement>(x: &Tensor, positions: &[usize], cos_sin: &[f32], rotary_dim: usize) -> Result<()> {
    let heads = x.dim(1);
    let (s0, s1) = (x.strides()[0], x.strides()[1]);
    let half = rotary_dim / 2;
    // SAFETY: exclusive write access to this view; q and k (which may share a
    // buffer) are rotated one after the other, never through two live slices.
    let xs = unsafe { x.host_slice_mut::<T>()? };
    for (i, &p) in positions.iter().enumerate() {
        let (cos, sin) = cos_sin[p * rotary_dim..][..rotary_dim].split_at(half);
        for h in 0..heads {
            let r = &mut xs[i * s0 + h * s1..][..rotary_dim];
            let (a, b) = r.split_at_mut(half);
            for j in 0..half {
                let (x1, x2) = (a[j].to_f32(), b[j].to_f32());
                a[j] = T::from_f32(x1 * cos[j] - x2 * sin[j]);
                b[j] = T::from_f32(x2 * cos[j] + x1 * sin[j]);
            }
        }
    }
    Ok(())
}

/// Neox-layout rotary embedding of q and k in place (see `ops::rope`).
pub(crate) fn rope(q: &Tensor, k: &Tensor, positions: &Tensor, cos_sin: &Tensor) -> Result<()> {
    const OP: &str = "rope";
    let [max_pos, rotary_dim] = [cos_sin.dim(0), cos_sin.dim(1)];
    let positions = read_indices(OP, positions)?
        .into_iter()
        .map(|p| {
            usize::try_from(p).ok().filter(|&p| p < max_pos).ok_or_else(|| {
                Error::arg(OP, format!("position {p} is outside the cos/sin cache of {max_pos} positions"))
            })
        })
        .collect::<Result<Vec<usize>>>()?;
    // SAFETY: read-only access to a host tensor.
    let table = unsafe { cos_sin.host_slice::<f32>()? };
    float_dispatch!(OP, q.dtype(), rope_typed(q, &positions, table, rotary_dim))?;
    float_dispatch!(OP, k.dtype(), rope_typed(k, &positions, table, rotary_dim))
}

// ---- activation and argmax -----------------------------------------------------

fn silu_mul_typed<T: FloatElement>(out: &Tensor, x: &Tensor) -> Result<()> {
    let i = out.dim(1);
    if i == 0 {
        return Ok(());
    }
    // SAFETY: x (contiguous, read) and out (fresh, contiguous, written) are
    // distinct buffers.
    let (xs, os) = unsafe { (x.host_slice::<T>()?, out.host_slice_mut::<T>()?) };
    os.par_chunks_mut(i).zip(xs.par_chunks(2 * i)).with_min_len(min_rows(2 * i)).for_each(|(o, x)| {
        let (gate, up) = x.split_at(i);
        for ((o, g), u) in o.iter_mut().zip(gate).zip(up) {
            let g = g.to_f32();
            *o = T::from_f32(g / (1.0 + (-g).exp()) * u.to_f32());
        }
    });
    Ok(())
}

/// `silu(gate) * up` (see `ops::silu_mul`).
pub(crate) fn silu_mul(out: &Tensor, x: &Tensor) -> Result<()> {
    float_dispatch!("silu_mul", x.dtype(), silu_mul_typed(out, x))
}

fn argmax_typed<T: FloatElement>(out: &Tensor, x: &Tensor) -> Result<()> {
    let v = x.dim(1);
    // SAFETY: x read, out (a fresh i32 tensor) written; distinct buffers.
    let (xs, os) = unsafe { (x.host_slice::<T>()?, out.host_slice_mut::<i32>()?) };
    os.par_iter_mut().zip(xs.par_chunks(v)).for_each(|(o, row)| {
        let mut best = (0usize, row[0].to_f32());
        for (j, val) in row.iter().enumerate().skip(1) {
            let val = val.to_f32();
            // Strictly greater keeps the first index on ties; a NaN never wins.
            if val > best.1 || best.1.is_nan() && !val.is_nan() {
                best = (j, val);
            }
        }
        *o = best.0 as i32;
    });
    Ok(())
}

/// Row-wise argmax, the first index on ties (see `ops::argmax`).
pub(crate) fn argmax(out: &Tensor, x: &Tensor) -> Result<()> {
    float_dispatch!("argmax", x.dtype(), argmax_typed(out, x))
}
