//! `rope_store`: the attention prologue of a layer as one op: the optional
//! per-head RMSNorm of q and k (Qwen3's `q_norm` / `k_norm`), the rotary
//! embedding of q and k (neox layout, as [`super::dense::rope`]), and the store of the
//! rotated k and of v into the paged KV caches at the step's slots (as
//! [`super::store::store_kv`]).
//!
//! On CUDA it is one launch (csrc/kernels/rope_store.cu) instead of four; on the
//! CPU it is the unfused sequence (`head_rms_norm`, `rope`, `store_kv`) on a copy
//! of k, so the CPU backend computes exactly what it did before the fusion.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub use crate::op_types::fused::{QkNorm, RopeStore};

use super::check::common_device;

const OP: &str = "rope_store";
const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// `q = rope(norm(q))` in place, `k_cache[out_loc] = rope(norm(k))`,
/// `v_cache[out_loc] = v` (norm only with `args.qk_norm`; see [`RopeStore`] for
/// the shapes). k and v are not written. Matches the unfused sequence
/// `head_rms_norm(q), head_rms_norm(k), rope(q, k), store_kv(k, v)` exactly on the
/// CPU and, for 16-bit types on CUDA, within one rounding of the intermediate
/// (the kernel keeps the normalised values in f32). Positions outside the
/// cos/sin table are an error on the CPU and leave the head unrotated on CUDA.
pub fn rope_store(args: &RopeStore<'_>) -> Result<()> {
    let (device, num_slots) = check_rope_store(args)?;
    let RopeStore { q, k, k_cache, v_cache, .. } = *args;
    let [t, _hq, d] = q.dims::<3>(OP, "q")?;
    let hkv = k.dim(1);
    if t == 0 || hkv == 0 || d == 0 {
        // Nothing to store; q may still have heads to rotate.
        if t > 0 && d > 0 {
            return unfused(args);
        }
        return Ok(());
    }
    let kc = k_cache.reshape(&[num_slots, hkv, d])?;
    let vc = v_cache.reshape(&[num_slots, hkv, d])?;
    match device {
        Device::Cpu => unfused(&RopeStore { k_cache: &kc, v_cache: &vc, ..*args }),
        Device::Cuda(_) => crate::gpu::rope_store(&RopeStore { k_cache: &kc, v_cache: &vc, ..*args }),
    }
}

/// The checks of [`rope_store`]: the device of the op and the caches' slot count.
pub(crate) fn check_rope_store(args: &RopeStore<'_>) -> Result<(Device, usize)> {
    let RopeStore { q, k, v, k_cache, v_cache, positions, out_loc, cos_sin, qk_norm } = *args;
    let mut named = vec![
        ("q", q),
        ("k", k),
        ("v", v),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("positions", positions),
        ("out_loc", out_loc),
        ("cos_sin", cos_sin),
    ];
    if let Some(n) = &qk_norm {
        named.extend([("q_weight", n.q_weight), ("k_weight", n.k_weight)]);
    }
    let device = common_device(OP, &named)?;
    let [t, _hq, d] = q.dims::<3>(OP, "q")?;
    let [_, hkv, _] = k.dims::<3>(OP, "k")?;
    k.expect_shape(OP, "k", &[t, hkv, d])?;
    v.expect_shape(OP, "v", &[t, hkv, d])?;
    q.expect_dtype(OP, "q", FLOATS)?;
    for (name, x) in [("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)] {
        x.expect_dtype(OP, name, &[q.dtype()])?;
    }
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        if d > 1 && x.strides()[2] != 1 {
            return Err(Error::arg(OP, format!("argument `{name}` must have unit stride in its last dimension")));
        }
    }
    k_cache.expect_contiguous(OP, "k_cache")?;
    v_cache.expect_contiguous(OP, "v_cache")?;
    if k_cache.shape() != v_cache.shape() {
        return Err(Error::arg(
            OP,
            format!("argument `v_cache` has shape {:?}, `k_cache` has {:?}", v_cache.shape(), k_cache.shape()),
        ));
    }
    let cache_rank = k_cache.rank();
    if cache_rank < 3 || k_cache.shape()[cache_rank - 2..] != [hkv, d] {
        return Err(Error::arg(
            OP,
            format!("argument `k_cache` has shape {:?}, expected [..., {hkv}, {d}]", k_cache.shape()),
        ));
    }
    let num_slots = k_cache.numel() / (hkv * d).max(1);
    for (name, x) in [("positions", positions), ("out_loc", out_loc)] {
        x.expect_dtype(OP, name, &[DType::I32, DType::I64])?
            .expect_shape(OP, name, &[t])?
            .expect_contiguous(OP, name)?;
    }
    let [_max_pos, rotary_dim] = cos_sin.dims::<2>(OP, "cos_sin")?;
    cos_sin.expect_dtype(OP, "cos_sin", &[DType::F32])?.expect_contiguous(OP, "cos_sin")?;
    if rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > d {
        return Err(Error::arg(
            OP,
            format!("rotary dimension {rotary_dim} must be even and at most the head dimension {d}"),
        ));
    }
    if let Some(n) = &qk_norm {
        for (name, w) in [("q_weight", n.q_weight), ("k_weight", n.k_weight)] {
            w.expect_shape(OP, name, &[d])?.expect_dtype(OP, name, &[q.dtype()])?.expect_contiguous(OP, name)?;
        }
    }
    for (name, x) in [("k", k), ("v", v)] {
        if x.same_buffer(k_cache) || x.same_buffer(v_cache) {
            return Err(Error::arg(OP, format!("argument `{name}` must not share memory with the caches")));
        }
    }
    Ok((device, num_slots))
}

/// The reference: the unfused ops on a copy of k (the op does not write k).
fn unfused(args: &RopeStore<'_>) -> Result<()> {
    let k = Tensor::empty(args.k.shape(), args.k.dtype(), args.k.device())?;
    super::convert::copy(&k, args.k)?;
    if let Some(n) = &args.qk_norm {
        super::dense::head_rms_norm(args.q, n.q_weight, n.eps)?;
        super::dense::head_rms_norm(&k, n.k_weight, n.eps)?;
    }
    super::dense::rope(args.q, &k, args.positions, args.cos_sin)?;
    if k.dim(1) == 0 || k.dim(2) == 0 {
        return Ok(());
    }
    super::store::store_kv(args.k_cache, args.v_cache, args.out_loc, &k, args.v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: Device = Device::Cpu;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn table(max_pos: usize, rotary_dim: usize) -> Tensor {
        let half = rotary_dim / 2;
        let mut v = vec![0f32; max_pos * rotary_dim];
        for p in 0..max_pos {
            for i in 0..half {
                let a = p as f32 * 10000f32.powf(-((2 * i) as f32) / rotary_dim as f32);
                v[p * rotary_dim + i] = a.cos();
                v[p * rotary_dim + half + i] = a.sin();
            }
        }
        Tensor::from_slice(&v, &[max_pos, rotary_dim], CPU).unwrap()
    }

    /// The fused op on a QKV view equals the unfused sequence on another copy, for
    /// both variants, partial rotary, page sizes 1 and 4 and a skipped slot.
    #[test]
    fn cpu_rope_store_equals_the_unfused_sequence() {
        for (norm, rotary_dim, page_size) in [(true, 8, 1), (false, 8, 4), (true, 4, 4)] {
            let (t, hq, hkv, d, pages) = (3, 4, 2, 8, 8);
            let qkv = Tensor::from_slice(&values(t * (hq + 2 * hkv) * d, 7), &[t, hq + 2 * hkv, d], CPU).unwrap();
            let qkv2 = deep_copy(&qkv);
            let cache = |seed| {
                Tensor::from_slice(&values(pages * page_size * hkv * d, seed), &[pages, page_size, hkv, d], CPU)
                    .unwrap()
            };
            let (kc, vc) = (cache(1), cache(2));
            let (kc2, vc2) = (deep_copy(&kc), deep_copy(&vc));
            let positions = Tensor::from_slice(&[5i32, 0, 9], &[t], CPU).unwrap();
            let out_loc = Tensor::from_slice(&[3i64, (pages * page_size) as i64 + 2, 0], &[t], CPU).unwrap();
            let cos_sin = table(16, rotary_dim);
            let qw = Tensor::from_slice(&values(d, 3), &[d], CPU).unwrap();
            let kw = Tensor::from_slice(&values(d, 4), &[d], CPU).unwrap();
            let qk_norm = norm.then_some(QkNorm { q_weight: &qw, k_weight: &kw, eps: 1e-6 });
            let views = |x: &Tensor| {
                (x.narrow(1, 0, hq).unwrap(), x.narrow(1, hq, hkv).unwrap(), x.narrow(1, hq + hkv, hkv).unwrap())
            };
            let (q, k, v) = views(&qkv);
            let k_before = k.contiguous().unwrap().to_f32_vec().unwrap();
            rope_store(&RopeStore {
                q: &q,
                k: &k,
                v: &v,
                k_cache: &kc,
                v_cache: &vc,
                positions: &positions,
                out_loc: &out_loc,
                cos_sin: &cos_sin,
                qk_norm,
            })
            .unwrap();
            let (q2, k2, v2) = views(&qkv2);
            if let Some(n) = &qk_norm {
                crate::ops::dense::head_rms_norm(&q2, n.q_weight, n.eps).unwrap();
                crate::ops::dense::head_rms_norm(&k2, n.k_weight, n.eps).unwrap();
            }
            crate::ops::dense::rope(&q2, &k2, &positions, &cos_sin).unwrap();
            crate::ops::store::store_kv(&kc2, &vc2, &out_loc, &k2, &v2).unwrap();
            assert_eq!(q.contiguous().unwrap().to_f32_vec().unwrap(), q2.contiguous().unwrap().to_f32_vec().unwrap());
            assert_eq!(kc.to_f32_vec().unwrap(), kc2.to_f32_vec().unwrap());
            assert_eq!(vc.to_f32_vec().unwrap(), vc2.to_f32_vec().unwrap());
            assert_eq!(k.contiguous().unwrap().to_f32_vec().unwrap(), k_before, "k must not be written");
        }
    }

    /// A copy in a new buffer (`contiguous` shares a contiguous tensor's buffer).
    fn deep_copy(src: &Tensor) -> Tensor {
        let dst = Tensor::empty(src.shape(), src.dtype(), src.device()).unwrap();
        crate::ops::convert::copy(&dst, src).unwrap();
        dst
    }

    #[test]
    fn bad_arguments_are_errors_naming_them() {
        let (t, hq, hkv, d) = (2, 2, 1, 8);
        let q = Tensor::zeros(&[t, hq, d], DType::F32, CPU).unwrap();
        let k = Tensor::zeros(&[t, hkv, d], DType::F32, CPU).unwrap();
        let v = Tensor::zeros(&[t, hkv, d], DType::F32, CPU).unwrap();
        let kc = Tensor::zeros(&[4, 1, hkv, d], DType::F32, CPU).unwrap();
        let vc = Tensor::zeros(&[4, 1, hkv, d], DType::F32, CPU).unwrap();
        let pos = Tensor::from_slice(&[0i32, 1], &[t], CPU).unwrap();
        let cs = table(4, 8);
        let base = RopeStore {
            q: &q,
            k: &k,
            v: &v,
            k_cache: &kc,
            v_cache: &vc,
            positions: &pos,
            out_loc: &pos,
            cos_sin: &cs,
            qk_norm: None,
        };
        rope_store(&base).unwrap();
        let wide = Tensor::zeros(&[4, 1, 2, d], DType::F32, CPU).unwrap();
        let e = rope_store(&RopeStore { k_cache: &wide, v_cache: &wide, ..base }).unwrap_err().to_string();
        assert!(e.contains("k_cache"), "{e}");
        let half = Tensor::zeros(&[t, hkv, d], DType::F16, CPU).unwrap();
        let e = rope_store(&RopeStore { v: &half, ..base }).unwrap_err().to_string();
        assert!(e.contains("`v`"), "{e}");
        let short = Tensor::from_slice(&[0i32], &[1], CPU).unwrap();
        let e = rope_store(&RopeStore { out_loc: &short, ..base }).unwrap_err().to_string();
        assert!(e.contains("out_loc"), "{e}");
        let w = Tensor::zeros(&[4], DType::F32, CPU).unwrap();
        let e = rope_store(&RopeStore { qk_norm: Some(QkNorm { q_weight: &w, k_weight: &w, eps: 1e-6 }), ..base })
            .unwrap_err()
            .to_string();
        assert!(e.contains("q_weight"), "{e}");
    }
}
