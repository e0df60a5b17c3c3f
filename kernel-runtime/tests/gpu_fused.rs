//! The decode-path kernels of issue 12 against the CPU reference, on the same
//! random inputs (gated: they run only with MINISGL_GPU_TESTS=1 on a machine
//! with a GPU; MINISGL_GPU_TESTS=cpu dry-runs them with the CPU standing in):
//!
//! - `rope_store` (q/k norm + RoPE + KV store in one launch), with and without
//!   the norm, against the unfused CPU sequence: head dims 64/80/128/256, full
//!   and partial rotary, the scalar path (rotated halves that are not whole
//!   vectors), page sizes 1/16/64, 1/3/64/1000 tokens, int32 and int64 indices, a
//!   slot outside the cache (skipped);
//! - RMSNorm's launch shapes at decode row counts (1/3/64/1000 rows: every
//!   widening of the shape rule), plain, fused-add and per head;
//! - `skinny_gemm` at every row count 1..=16 it takes, both tile widths, bias,
//!   strided x and odd n, and `linear` with the skinny path on and off; its
//!   weight prefetch (whole slices, part of a slice, K splits) bitwise equal to the
//!   kernel without it, and the bulk prefetch (by the copy engine) bitwise equal to
//!   the cp.async one, plain, gated and pre-norm;
//! - `linear_silu_mul` / `skinny_gemm_silu_mul` (SiLU-and-mul in the gated
//!   skinny kernel's epilogue) against the CPU pair and bitwise against
//!   `skinny_gemm` then `silu_mul` on the GPU, both tile widths, bias, odd widths,
//!   and the fallback outside the rule;
//! - `fused_add_rms_norm_linear` (the pre-norm residual step inside the skinny
//!   kernel) against the CPU's two steps and the two GPU ops, gated or not;
//! - decode attention with its splits merged by the decode launch's last blocks,
//!   bitwise against the combine launch, over the fixed-split plans of CUDA
//!   graphs and the host plan, run twice (the counters must be left zero).
//!
//! Outputs are compared by relative L2 error (1e-5 f32, 1e-2 bf16/f16) and, for
//! the caches and q, element by element against a bound of a few roundings times
//! the reference's RMS, so that a single unwritten head fails. Fresh GPU outputs
//! are poisoned with NaN bytes first; the caches start from the same random
//! contents on both devices, so rows the op must not touch are compared too.

mod common;

use anyhow::{ensure, Context, Result};
use common::{
    assert_close, enabled_or_dry_run as enabled, gpu, poison_next_alloc, random, rng, target, tol, view_like,
};
use kernel_runtime::ops::{self, AttnKernel, PagedAttnMeta, QkNorm, RopeStore};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

const CPU: Device = Device::Cpu;
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const EPS: f32 = 1e-6;

/// The same bytes in a new host buffer.
/// Held by the tests that flip a process-wide dispatch switch (`ops::set_skinny_*`)
/// or compare two dispatches bit for bit: the test harness runs tests on several
/// threads, and one test's switch must not change another's kernels midway (a
/// bitwise comparison failed that way at m = 7 on the GPU, sixth session, call 3).
fn switches() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn host_copy(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_bytes(&t.to_host_bytes()?, t.dtype(), t.shape(), CPU)?)
}

/// `assert_close`, and every element within `k` roundings of the reference RMS
/// (so that one missing or misplaced row fails even in a large buffer).
fn assert_close_elementwise(what: &str, got: &Tensor, want: &Tensor, dtype: DType) -> Result<()> {
    assert_close(what, got, want, tol(dtype))?;
    let (g, w) = (got.to_f32_vec()?, want.to_f32_vec()?);
    let rms = (w.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / w.len().max(1) as f64).sqrt();
    let ulp = match dtype {
        DType::F32 => 1e-6,
        DType::F16 => 1.0 / 2048.0,
        _ => 1.0 / 256.0,
    };
    let bound = 16.0 * ulp * rms.max(1e-3);
    if let Some(i) = g.iter().zip(&w).position(|(a, b)| !a.is_finite() || (f64::from(*a) - f64::from(*b)).abs() > bound)
    {
        anyhow::bail!("{what}: element {i} is {}, expected {} (bound {bound:.2e})", g[i], w[i]);
    }
    Ok(())
}

/// `[max_pos, rotary_dim]` f32: cos(p * inv_freq) then sin(p * inv_freq).
fn cos_sin_cache(max_pos: usize, rotary_dim: usize, theta: f32) -> Result<Tensor> {
    let half = rotary_dim / 2;
    let mut v = Vec::with_capacity(max_pos * rotary_dim);
    for p in 0..max_pos {
        let angles: Vec<f32> = (0..half).map(|i| p as f32 * theta.powf(-2.0 * i as f32 / rotary_dim as f32)).collect();
        v.extend(angles.iter().map(|a| a.cos()));
        v.extend(angles.iter().map(|a| a.sin()));
    }
    Ok(Tensor::from_slice(&v, &[max_pos, rotary_dim], CPU)?)
}

// ---- rope_store --------------------------------------------------------------

struct RopeStoreCase {
    hq: usize,
    hkv: usize,
    d: usize,
    rotary_dim: usize,
}

fn check_rope_store(
    r: &mut StdRng,
    dtype: DType,
    c: &RopeStoreCase,
    t: usize,
    page_size: usize,
    norm: bool,
    index: DType,
) -> Result<()> {
    let what = format!(
        "rope_store {dtype} t={t} heads={}/{} d={} rotary={} page={page_size} norm={norm} index={index}",
        c.hq, c.hkv, c.d, c.rotary_dim
    );
    let (hq, hkv, d) = (c.hq, c.hkv, c.d);
    let max_pos = 4096;
    let cs = cos_sin_cache(max_pos, c.rotary_dim, 10000.0)?;
    let num_pages = (2 * t).div_ceil(page_size) + 1;
    let num_slots = num_pages * page_size;
    // q, k, v as views of one fused QKV output, as the models have them.
    let qkv = random(r, &[t, hq + 2 * hkv, d], dtype, 0.0, 2.0)?;
    let kc = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let vc = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let qw = random(r, &[d], dtype, 1.0, 0.5)?;
    let kw = random(r, &[d], dtype, 1.0, 0.5)?;
    let pos: Vec<i64> = (0..t).map(|_| r.gen_range(0..max_pos as i64)).collect();
    let mut slots: Vec<i64> = (0..num_slots as i64).collect();
    slots.shuffle(r);
    slots.truncate(t);
    if t >= 3 {
        slots[1] = num_slots as i64 + 7; // outside the cache: skipped
    }
    let positions = Tensor::from_slice(&pos, &[t], CPU)?.to_dtype(index)?;
    let out_loc = Tensor::from_slice(&slots, &[t], CPU)?.to_dtype(index)?;

    let run = |qkv: &Tensor,
               kc: &Tensor,
               vc: &Tensor,
               positions: &Tensor,
               out_loc: &Tensor,
               cs: &Tensor,
               qw: &Tensor,
               kw: &Tensor|
     -> Result<()> {
        let q = qkv.narrow(1, 0, hq)?;
        let k = qkv.narrow(1, hq, hkv)?;
        let v = qkv.narrow(1, hq + hkv, hkv)?;
        let qk_norm = norm.then_some(QkNorm { q_weight: qw, k_weight: kw, eps: EPS });
        ops::rope_store(&RopeStore {
            q: &q,
            k: &k,
            v: &v,
            k_cache: kc,
            v_cache: vc,
            positions,
            out_loc,
            cos_sin: cs,
            qk_norm,
        })?;
        Ok(())
    };
    let (gqkv, gkc, gvc) = (gpu(&qkv)?, gpu(&kc)?, gpu(&vc)?);
    let qkv_before = qkv.to_host_bytes()?;
    run(&gqkv, &gkc, &gvc, &gpu(&positions)?, &gpu(&out_loc)?, &gpu(&cs)?, &gpu(&qw)?, &gpu(&kw)?)
        .with_context(|| what.clone())?;
    let (cqkv, ckc, cvc) = (host_copy(&qkv)?, host_copy(&kc)?, host_copy(&vc)?);
    run(&cqkv, &ckc, &cvc, &positions, &out_loc, &cs, &qw, &kw).with_context(|| what.clone())?;

    assert_close_elementwise(&format!("{what}: qkv"), &gqkv, &cqkv, dtype)?;
    assert_close_elementwise(&format!("{what}: k_cache"), &gkc, &ckc, dtype)?;
    // v is copied, so bit for bit.
    ensure!(gvc.to_host_bytes()? == cvc.to_host_bytes()?, "{what}: v_cache differs from the reference");
    // k and v themselves are only read.
    let (after, elem) = (gqkv.to_host_bytes()?, dtype.size_in_bytes());
    for tok in 0..t {
        let row = (hq + 2 * hkv) * d * elem;
        let kv = tok * row + hq * d * elem..(tok + 1) * row;
        ensure!(after[kv.clone()] == qkv_before[kv], "{what}: token {tok}'s k or v was written");
    }
    Ok(())
}

#[test]
fn rope_store_matches_the_unfused_cpu_sequence() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(21);
    let cases = [
        // Qwen3-0.6B (and LLaMA-3-8B's 32/8 at head_dim 128).
        RopeStoreCase { hq: 16, hkv: 8, d: 128, rotary_dim: 128 },
        RopeStoreCase { hq: 4, hkv: 2, d: 64, rotary_dim: 64 },
        RopeStoreCase { hq: 8, hkv: 1, d: 256, rotary_dim: 256 },
        // Partial rotary: lone vectors past rotary_dim.
        RopeStoreCase { hq: 4, hkv: 2, d: 128, rotary_dim: 64 },
        // head_dim 80: five vectors per half for 16-bit types, the scalar path for f32.
        RopeStoreCase { hq: 2, hkv: 2, d: 80, rotary_dim: 80 },
        // Rotated halves of 12: the scalar path.
        RopeStoreCase { hq: 4, hkv: 2, d: 64, rotary_dim: 24 },
    ];
    for dtype in FLOATS {
        for c in &cases {
            for t in [1, 3, 64, 1000] {
                for page_size in [1, 16, 64] {
                    for norm in [true, false] {
                        let index = if (t + page_size) % 2 == 0 { DType::I32 } else { DType::I64 };
                        check_rope_store(&mut r, dtype, c, t, page_size, norm, index)?;
                    }
                }
            }
        }
    }
    Ok(())
}

// ---- RMSNorm at decode row counts -------------------------------------------

#[test]
fn rms_norms_match_cpu_at_decode_row_counts() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(22);
    for dtype in FLOATS {
        for h in [64, 100, 128, 1024, 4096] {
            for t in [1, 3, 64, 1000] {
                let what = format!("{dtype} t={t} h={h}");
                let w = random(&mut r, &[h], dtype, 1.0, 0.5)?;
                let gw = gpu(&w)?;
                let x = random(&mut r, &[t, h], dtype, 0.0, 2.0)?;
                let want = ops::rms_norm(&x, &w, EPS)?;
                poison_next_alloc(t * h * dtype.size_in_bytes())?;
                let got = ops::rms_norm(&gpu(&x)?, &gw, EPS)?;
                assert_close_elementwise(&format!("rms_norm {what}"), &got, &want, dtype)?;

                let res = random(&mut r, &[t, h], dtype, 0.0, 3.0)?;
                let (gx, gres) = (gpu(&x)?, gpu(&res)?);
                let (cx, cres) = (host_copy(&x)?, host_copy(&res)?);
                ops::fused_add_rms_norm(&cx, &cres, &w, EPS)?;
                ops::fused_add_rms_norm(&gx, &gres, &gw, EPS)?;
                assert_close_elementwise(&format!("fused_add_rms_norm {what}: x"), &gx, &cx, dtype)?;
                assert_close_elementwise(&format!("fused_add_rms_norm {what}: residual"), &gres, &cres, dtype)?;
            }
        }
        for d in [64, 128, 256] {
            for t in [1, 3, 64, 1000] {
                let (hq, hk) = (16, 8);
                let what = format!("head_rms_norm {dtype} t={t} d={d}");
                let qkv = random(&mut r, &[t, hq + 2 * hk, d], dtype, 0.0, 2.0)?;
                let gqkv = gpu(&qkv)?;
                let w = random(&mut r, &[d], dtype, 1.0, 0.5)?;
                let view = qkv.narrow(1, 0, hq)?;
                ops::head_rms_norm(&view, &w, EPS)?;
                ops::head_rms_norm(&view_like(&gqkv, &view, 0)?, &gpu(&w)?, EPS)?;
                assert_close_elementwise(&what, &gqkv, &qkv, dtype)?;
            }
        }
    }
    Ok(())
}

// ---- skinny GEMM -------------------------------------------------------------

#[test]
fn skinny_gemm_matches_cpu_linear() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(23);
    for dtype in [DType::BF16, DType::F16] {
        for (n, k) in [(4096, 1024), (1000, 512), (33, 96), (6144, 4096)] {
            for m in [1, 2, 3, 7, 8, 9, 15, 16] {
                for m_tiles in [1, 2] {
                    for (bias, strided) in [(false, false), (true, false), (false, true), (true, true)] {
                        let what = format!(
                            "skinny_gemm {dtype} m={m} n={n} k={k} m_tiles={m_tiles} bias={bias} strided={strided}"
                        );
                        // A strided x is a column slice of a wider matrix (row stride k + 40).
                        let wide = random(&mut r, &[m, k + 40], dtype, 0.0, 1.0)?;
                        let x =
                            if strided { wide.narrow(1, 16, k)? } else { random(&mut r, &[m, k], dtype, 0.0, 1.0)? };
                        let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                        let b = bias.then(|| random(&mut r, &[n], dtype, 0.0, 1.0)).transpose()?;
                        let want = ops::linear(&x, &w, b.as_ref())?;
                        let gx = if strided { view_like(&gpu(&wide)?, &x, 16)? } else { gpu(&x)? };
                        let gb = b.as_ref().map(gpu).transpose()?;
                        poison_next_alloc(m * n * dtype.size_in_bytes())?;
                        let got = ops::skinny_gemm(&gx, &gpu(&w)?, gb.as_ref(), Some(m_tiles), None)
                            .with_context(|| what.clone())?;
                        assert_close(&what, &got, &want, tol(dtype))?;
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn skinny_gemm_k_splits_match_cpu_linear_and_each_other() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(25);
    for dtype in [DType::BF16, DType::F16] {
        // Qwen3-0.6B's o_proj and down (the split's use), an odd n, and k / 32 = 3
        // (splits of 1 and 2 k-steps, blocks whose warps get none).
        for (n, k) in [(1024, 2048), (1024, 3072), (1000, 4096), (48, 96)] {
            for m in [1, 5, 16] {
                let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let b = random(&mut r, &[n], dtype, 0.0, 1.0)?;
                let want = ops::linear(&x, &w, Some(&b))?;
                let (gx, gw, gb) = (gpu(&x)?, gpu(&w)?, gpu(&b)?);
                for splits in [1, 2, 3, 4, 8].into_iter().filter(|&s| s <= k / 32) {
                    for m_tiles in [1, 2] {
                        let what = format!("skinny_gemm {dtype} m={m} n={n} k={k} m_tiles={m_tiles} k_splits={splits}");
                        let got = ops::skinny_gemm(&gx, &gw, Some(&gb), Some(m_tiles), Some(splits))
                            .with_context(|| what.clone())?;
                        assert_close(&what, &got, &want, tol(dtype))?;
                        // The cluster sums in rank order: the same launch twice is bitwise equal.
                        let again = ops::skinny_gemm(&gx, &gw, Some(&gb), Some(m_tiles), Some(splits))?;
                        ensure!(got.to_host_bytes()? == again.to_host_bytes()?, "{what}: two runs differ");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn linear_with_and_without_the_skinny_path_matches_cpu() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(24);
    for dtype in FLOATS {
        for (m, n, k) in [(1, 4096, 1024), (16, 2048, 1024), (17, 2048, 1024), (5, 1024, 1000)] {
            for bias in [false, true] {
                let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let b = bias.then(|| random(&mut r, &[n], dtype, 0.0, 1.0)).transpose()?;
                let want = ops::linear(&x, &w, b.as_ref())?;
                let (gx, gw, gb) = (gpu(&x)?, gpu(&w)?, b.as_ref().map(gpu).transpose()?);
                for on in [true, false] {
                    ops::set_skinny_gemm(Some(on));
                    poison_next_alloc(m * n * dtype.size_in_bytes())?;
                    let got = ops::linear(&gx, &gw, gb.as_ref());
                    ops::set_skinny_gemm(None);
                    assert_close(
                        &format!("linear {dtype} m={m} n={n} k={k} bias={bias} skinny={on}"),
                        &got?,
                        &want,
                        tol(dtype),
                    )?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn skinny_gemm_rejects_what_it_cannot_do() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let dev = target();
    let x = Tensor::zeros(&[17, 64], DType::BF16, dev)?;
    let w = Tensor::zeros(&[32, 64], DType::BF16, dev)?;
    let e = ops::skinny_gemm(&x, &w, None, None, None).unwrap_err().to_string();
    ensure!(e.contains("skinny_gemm"), "{e}");
    let x = Tensor::zeros(&[4, 48], DType::BF16, dev)?;
    let w = Tensor::zeros(&[32, 48], DType::BF16, dev)?;
    ensure!(ops::skinny_gemm(&x, &w, None, None, None).is_err(), "k = 48 accepted");
    let x = Tensor::zeros(&[4, 64], DType::F32, dev)?;
    let w = Tensor::zeros(&[32, 64], DType::F32, dev)?;
    ensure!(ops::skinny_gemm(&x, &w, None, None, None).is_err(), "f32 accepted");
    Ok(())
}

#[test]
fn skinny_gemm_prefetch_is_bitwise_neutral() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(26);
    for dtype in [DType::BF16, DType::F16] {
        // Qwen3-0.6B's four projections (whole slices prefetched), k = 4096 (12 of
        // 16 k-steps a warp prefetched, 6 with two tiles), k / 32 = 3 (warps with one
        // step or none), an odd n.
        for (n, k) in [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 4096), (48, 96), (1000, 512)] {
            for m in [1, 5, 16] {
                let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let want = ops::linear(&x, &w, None)?;
                let (gx, gw) = (gpu(&x)?, gpu(&w)?);
                for m_tiles in [1, 2] {
                    for splits in [1, 4].into_iter().filter(|&s| s <= k / 32) {
                        let what = format!(
                            "skinny_gemm prefetch {dtype} m={m} n={n} k={k} m_tiles={m_tiles} k_splits={splits}"
                        );
                        let run = |prefetch| {
                            ops::set_skinny_prefetch(Some(prefetch));
                            let got = ops::skinny_gemm(&gx, &gw, None, Some(m_tiles), Some(splits));
                            ops::set_skinny_prefetch(None);
                            got
                        };
                        let with = run(true).with_context(|| what.clone())?;
                        let without = run(false).with_context(|| what.clone())?;
                        assert_close(&what, &with, &want, tol(dtype))?;
                        ensure!(
                            with.to_host_bytes()? == without.to_host_bytes()?,
                            "{what}: differs without the prefetch"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// `f` with the bulk prefetch on, then off: both results (bytes).
fn bulk_and_plain(f: &dyn Fn() -> Result<Vec<u8>>) -> Result<(Vec<u8>, Vec<u8>)> {
    ops::set_skinny_bulk(Some(true));
    let bulk = f();
    ops::set_skinny_bulk(Some(false));
    let plain = f();
    ops::set_skinny_bulk(None);
    Ok((bulk?, plain?))
}

/// The bulk prefetch (the block's slice by the copy engine) gives the bits of the
/// cp.async prefetch: the plain kernel unsplit and split (Qwen3-0.6B's four
/// projections, two waves of blocks, a slice past the bulk budget that falls back,
/// odd n, warps without a k-step).
#[test]
fn skinny_bulk_prefetch_is_bitwise_neutral() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(31);
    for dtype in [DType::BF16, DType::F16] {
        // (8192, 1024): 512 blocks, two waves of two blocks an SM.
        for (n, k) in [(4096, 1024), (8192, 1024), (1024, 2048), (1024, 3072), (2048, 4096), (1000, 512), (48, 96)] {
            for m in [1, 9, 16] {
                let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let want = ops::linear(&x, &w, None)?;
                let (gx, gw) = (gpu(&x)?, gpu(&w)?);
                for m_tiles in [1, 2] {
                    for splits in [1, 2, 4].into_iter().filter(|&s| s <= k / 32) {
                        let what =
                            format!("skinny_gemm bulk {dtype} m={m} n={n} k={k} m_tiles={m_tiles} k_splits={splits}");
                        let got = || {
                            let out = ops::skinny_gemm(&gx, &gw, None, Some(m_tiles), Some(splits))?;
                            assert_close(&what, &out, &want, tol(dtype))?;
                            Ok(out.to_host_bytes()?)
                        };
                        let (bulk, plain) = bulk_and_plain(&got).with_context(|| what.clone())?;
                        ensure!(bulk == plain, "{what}: differs from the cp.async prefetch");
                    }
                }
            }
        }
    }
    Ok(())
}

/// [`skinny_bulk_prefetch_is_bitwise_neutral`] for the gated kernel (384 blocks:
/// two waves) and the pre-norm variant.
#[test]
fn skinny_bulk_prefetch_is_bitwise_neutral_gated_and_pre_norm() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(32);
    for dtype in [DType::BF16, DType::F16] {
        for (inter, k) in [(3072, 1024), (500, 96)] {
            for m in [1, 16] {
                let hx = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let hw = random(&mut r, &[2 * inter, k], dtype, 0.0, 0.05)?;
                let want = ops::linear_silu_mul(&hx, &hw, None)?;
                let (x, w) = (gpu(&hx)?, gpu(&hw)?);
                for m_tiles in [1, 2] {
                    let what = format!("skinny_gemm_silu_mul bulk {dtype} m={m} inter={inter} k={k} m_tiles={m_tiles}");
                    let got = || {
                        let out = ops::skinny_gemm_silu_mul(&x, &w, None, Some(m_tiles))?;
                        assert_close(&what, &out, &want, tol(dtype))?;
                        Ok(out.to_host_bytes()?)
                    };
                    let (bulk, plain) = bulk_and_plain(&got).with_context(|| what.clone())?;
                    ensure!(bulk == plain, "{what}: differs from the cp.async prefetch");
                }
            }
        }
        for (n, k, gated) in [(4096, 1024, false), (6144, 1024, true), (4096, 2048, false)] {
            for m in [1, 16] {
                let what = format!("fused_add_rms_norm_linear bulk {dtype} m={m} n={n} k={k} gated={gated}");
                let x = gpu(&random(&mut r, &[m, k], dtype, 0.0, 1.0)?)?;
                let res = gpu(&random(&mut r, &[m, k], dtype, 0.0, 3.0)?)?;
                let nw = gpu(&random(&mut r, &[k], dtype, 1.0, 0.5)?)?;
                let w = gpu(&random(&mut r, &[n, k], dtype, 0.0, 0.05)?)?;
                let got = || {
                    let (out, new_res) =
                        ops::fused_add_rms_norm_linear(x.clone(), res.clone(), &nw, EPS, &w, None, gated)?;
                    let mut bytes = out.to_host_bytes()?;
                    bytes.extend(new_res.to_host_bytes()?);
                    Ok(bytes)
                };
                let (bulk, plain) = bulk_and_plain(&got).with_context(|| what.clone())?;
                ensure!(bulk == plain, "{what}: differs from the cp.async prefetch");
            }
        }
    }
    Ok(())
}

#[test]
fn linear_silu_mul_is_the_unfused_pair_bit_for_bit() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(27);
    for dtype in [DType::BF16, DType::F16] {
        // Qwen3-0.6B's gate_up (the rule's case: 16 outputs a block), one that gets
        // 8 a block, k = 4096 (part of a slice prefetched), odd widths.
        for (inter, k) in [(3072, 1024), (1536, 1024), (1024, 4096), (500, 96), (33, 64)] {
            for m in [1, 2, 7, 8, 9, 16] {
                for bias in [false, true] {
                    let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                    let w = random(&mut r, &[2 * inter, k], dtype, 0.0, 0.05)?;
                    let b = bias.then(|| random(&mut r, &[2 * inter], dtype, 0.0, 1.0)).transpose()?;
                    let want = ops::linear_silu_mul(&x, &w, b.as_ref())?;
                    let (gx, gw, gb) = (gpu(&x)?, gpu(&w)?, b.as_ref().map(gpu).transpose()?);
                    // The pair the fused kernel replaces, on the GPU.
                    let pair = ops::silu_mul(&ops::skinny_gemm(&gx, &gw, gb.as_ref(), Some(1), None)?)?;
                    for m_tiles in [1, 2] {
                        let what = format!(
                            "skinny_gemm_silu_mul {dtype} m={m} inter={inter} k={k} m_tiles={m_tiles} bias={bias}"
                        );
                        poison_next_alloc(m * inter * dtype.size_in_bytes())?;
                        let got = ops::skinny_gemm_silu_mul(&gx, &gw, gb.as_ref(), Some(m_tiles))
                            .with_context(|| what.clone())?;
                        assert_close(&what, &got, &want, tol(dtype))?;
                        ensure!(
                            got.to_host_bytes()? == pair.to_host_bytes()?,
                            "{what}: differs from skinny_gemm + silu_mul"
                        );
                    }
                    // The op as dispatched: the gated kernel where the rule takes the
                    // product, linear + silu_mul elsewhere; the same bits either way.
                    let what = format!("linear_silu_mul {dtype} m={m} inter={inter} k={k} bias={bias}");
                    let got = ops::linear_silu_mul(&gx, &gw, gb.as_ref()).with_context(|| what.clone())?;
                    let unfused = ops::silu_mul(&ops::linear(&gx, &gw, gb.as_ref())?)?;
                    assert_close(&what, &got, &want, tol(dtype))?;
                    ensure!(got.to_host_bytes()? == unfused.to_host_bytes()?, "{what}: differs from linear + silu_mul");
                }
            }
        }
    }
    // Outside the rule (17 rows, f32): the two ops.
    for (dtype, m) in [(DType::BF16, 17), (DType::F32, 4)] {
        let x = random(&mut r, &[m, 1024], dtype, 0.0, 1.0)?;
        let w = random(&mut r, &[2 * 3072, 1024], dtype, 0.0, 0.05)?;
        let want = ops::linear_silu_mul(&x, &w, None)?;
        let got = ops::linear_silu_mul(&gpu(&x)?, &gpu(&w)?, None)?;
        assert_close(&format!("linear_silu_mul fallback {dtype} m={m}"), &got, &want, tol(dtype))?;
    }
    Ok(())
}

/// The pre-norm variant (the residual add and RMSNorm computed by every block of
/// the projection that follows): against the CPU's two steps, and on the GPU the
/// new residual bit for bit the norm kernel's. Where the rule takes it (k <= 2048,
/// 1-16 MiB of weights) the residual comes back in a new buffer; elsewhere the two
/// ops run in place.
#[test]
fn fused_add_rms_norm_linear_matches_the_two_steps() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let _switches = switches();
    let mut r = rng(29);
    for dtype in [DType::BF16, DType::F16] {
        // Qwen3-0.6B's qkv and gate_up (k = 1024), a k = 2048 one (Qwen3-1.7B's qkv),
        // and one past the widest rows (k = 4096: the two ops).
        for (n, k, gated) in [(4096, 1024, false), (6144, 1024, true), (4096, 2048, false), (2048, 4096, false)] {
            for m in [1, 2, 7, 8, 9, 16] {
                for bias in [false, true] {
                    let what = format!("fused_add_rms_norm_linear {dtype} m={m} n={n} k={k} gated={gated} bias={bias}");
                    let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                    let res = random(&mut r, &[m, k], dtype, 0.0, 3.0)?;
                    let nw = random(&mut r, &[k], dtype, 1.0, 0.5)?;
                    let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                    let b = bias.then(|| random(&mut r, &[n], dtype, 0.0, 1.0)).transpose()?;
                    let (want, want_res) = ops::fused_add_rms_norm_linear(
                        host_copy(&x)?,
                        host_copy(&res)?,
                        &nw,
                        EPS,
                        &w,
                        b.as_ref(),
                        gated,
                    )?;
                    let (gnw, gw, gb) = (gpu(&nw)?, gpu(&w)?, b.as_ref().map(gpu).transpose()?);
                    let run = |norm: bool| -> Result<(Tensor, Tensor, bool)> {
                        ops::set_skinny_norm(Some(norm));
                        let gres = gpu(&res)?;
                        let input = gres.clone();
                        let done = ops::fused_add_rms_norm_linear(gpu(&x)?, gres, &gnw, EPS, &gw, gb.as_ref(), gated);
                        ops::set_skinny_norm(None);
                        let (out, new_res) = done.with_context(|| what.clone())?;
                        let moved = !new_res.same_buffer(&input);
                        Ok((out, new_res, moved))
                    };
                    let (got, got_res, fused) = run(true)?;
                    // (A dry run on the CPU runs the two steps in place.)
                    let expect_fused = k <= 2048 && target() != CPU;
                    ensure!(fused == expect_fused, "{what}: fused launch {fused}, expected {expect_fused}");
                    assert_close_elementwise(&format!("{what}: residual"), &got_res, &want_res, dtype)?;
                    assert_close(&format!("{what}: out"), &got, &want, tol(dtype))?;
                    let (two, two_res, moved) = run(false)?;
                    ensure!(!moved, "{what}: the two ops update the residual in place");
                    ensure!(
                        got_res.to_host_bytes()? == two_res.to_host_bytes()?,
                        "{what}: residual differs from the norm kernel's"
                    );
                    assert_close(&format!("{what}: out against the two GPU ops"), &got, &two, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

/// A paged decode batch on the GPU: q `[b, hq, d]`, random caches, shuffled pages.
struct DecodeBatch {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    q_indptr: Tensor,
    kv_lens: Tensor,
    block_table: Tensor,
    kv_lens_host: Vec<usize>,
}

fn decode_batch(
    r: &mut StdRng,
    hq: usize,
    hkv: usize,
    d: usize,
    page_size: usize,
    kv: &[usize],
) -> Result<DecodeBatch> {
    let b = kv.len();
    let pages_per_seq: Vec<usize> = kv.iter().map(|l| l.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1).max(1);
    let num_pages = pages_per_seq.iter().sum::<usize>() + 3;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    order.shuffle(r);
    let mut table = vec![-1i32; b * max_pages];
    let mut next = 0;
    for (s, &n) in pages_per_seq.iter().enumerate() {
        table[s * max_pages..][..n].copy_from_slice(&order[next..next + n]);
        next += n;
    }
    let indptr: Vec<i32> = (0..=b as i32).collect();
    let kv_i32: Vec<i32> = kv.iter().map(|&l| l as i32).collect();
    Ok(DecodeBatch {
        q: gpu(&random(r, &[b, hq, d], DType::BF16, 0.0, 1.0)?)?,
        k_cache: gpu(&random(r, &[num_pages, page_size, hkv, d], DType::BF16, 0.0, 1.0)?)?,
        v_cache: gpu(&random(r, &[num_pages, page_size, hkv, d], DType::BF16, 0.0, 1.0)?)?,
        q_indptr: gpu(&Tensor::from_slice(&indptr, &[b + 1], CPU)?)?,
        kv_lens: gpu(&Tensor::from_slice(&kv_i32, &[b], CPU)?)?,
        block_table: gpu(&Tensor::from_slice(&table, &[b, max_pages], CPU)?)?,
        kv_lens_host: kv.to_vec(),
    })
}

#[test]
fn decode_split_merge_in_the_launch_is_the_combine_bit_for_bit() -> Result<()> {
    if !enabled() || target() == CPU {
        return Ok(());
    }
    let mut r = rng(28);
    // Qwen3-0.6B's heads (16/8) and GQA 4 at head dim 64; batch 1 as graphs run it
    // (66 splits of a 40960-token context), ragged batches, a sequence of one key.
    let batches: [(&str, Vec<usize>); 4] = [
        ("b=1 ctx=1000", vec![1000]),
        ("b=1 ctx=8500", vec![8500]),
        ("ragged", vec![1, 17, 300, 4096, 2500, 129]),
        ("64 random", (0..64).map(|i| 1 + (i * 977) % 3000).collect()),
    ];
    for (hq, hkv, d) in [(16, 8, 128), (8, 2, 64)] {
        for page_size in [1, 16] {
            for (name, kv) in &batches {
                let batch = decode_batch(&mut r, hq, hkv, d, page_size, kv)?;
                let q_lens = vec![1usize; kv.len()];
                let scale = 1.0 / (d as f32).sqrt();
                for splits in [None, Some(1), Some(3), Some(66)] {
                    let what = format!("decode attention {hq}/{hkv} d={d} page={page_size} {name} splits={splits:?}");
                    let meta = PagedAttnMeta {
                        q_indptr: &batch.q_indptr,
                        kv_lens: &batch.kv_lens,
                        block_table: &batch.block_table,
                        q_lens_host: &q_lens,
                        kv_lens_host: &batch.kv_lens_host,
                        decode_splits: splits,
                    };
                    let run = |merge| -> Result<Vec<u8>> {
                        let out = Tensor::empty(&[kv.len(), hq, d], DType::BF16, target())?;
                        ops::set_decode_split_merge(Some(merge));
                        let r = ops::paged_attention_with(
                            &out,
                            &batch.q,
                            &batch.k_cache,
                            &batch.v_cache,
                            &meta,
                            scale,
                            AttnKernel::Decode,
                        );
                        ops::set_decode_split_merge(None);
                        r?;
                        Ok(out.to_host_bytes()?)
                    };
                    let combine = run(false).with_context(|| what.clone())?;
                    let merged = run(true).with_context(|| what.clone())?;
                    // Twice: the counters were left zero by the first launch.
                    let again = run(true).with_context(|| what.clone())?;
                    ensure!(merged == combine, "{what}: the merged splits differ from the combine launch");
                    ensure!(again == merged, "{what}: a second launch differs (counters not reset?)");
                }
            }
        }
    }
    Ok(())
}
