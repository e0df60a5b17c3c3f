//! The CUDA dense and attention ops against the CPU reference, on the same random
//! inputs (gated: they run only with MINISGL_GPU_TESTS=1 on a machine with a GPU).
//!
//! Every case builds its inputs once on the host, rounded to the tested dtype,
//! copies them to the GPU bit for bit, runs the op on both devices and compares
//! by relative L2 error: at most 1e-5 for f32 (1e-4 for attention, whose
//! summation order differs most), 1e-2 for bf16/f16; casts, copies and argmax must
//! match exactly. GPU outputs are poisoned with NaN (all-ones bytes) first: in-place
//! outputs directly, fresh ones by handing the caching allocator a poisoned block of
//! the output's size right before the op. In-place ops on views are compared over
//! the whole underlying buffer, so a stray write outside the view fails too.
//!
//! With MINISGL_GPU_TESTS=cpu the CPU stands in for the GPU: a dry run of the
//! tests themselves (views, offsets, comparisons) on a machine without one.
//!
//! `paged_attention_cuda_core_products` reruns the attention matrix in a child
//! process with MINISGL_ATTENTION_MMA=0 (the CUDA-core instance for bf16/f16,
//! compiled with NVRTC), a cross-check of the tensor-core fragment layouts.

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::{enabled_or_dry_run, gpu, poison_next_alloc, random, rng, target, tol, view_like};
use kernel_runtime::ops::{self, AttnKernel, PagedAttnMeta};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

const CPU: Device = Device::Cpu;
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A GPU tensor full of 0xff bytes.
fn poisoned(shape: &[usize], dtype: DType) -> Result<Tensor> {
    let n: usize = shape.iter().product::<usize>() * dtype.size_in_bytes();
    Ok(Tensor::from_bytes(&vec![0xffu8; n], dtype, shape, target())?)
}

/// ||got - want|| / ||want|| over f32 values (infinite when got holds a NaN/inf).
fn rel_l2(got: &Tensor, want: &Tensor) -> Result<f64> {
    ensure!(got.shape() == want.shape(), "shapes {:?} and {:?} differ", got.shape(), want.shape());
    let (g, w) = (got.to_f32_vec()?, want.to_f32_vec()?);
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in g.iter().zip(&w) {
        if !a.is_finite() {
            return Ok(f64::INFINITY);
        }
        num += (f64::from(*a) - f64::from(*b)).powi(2);
        den += f64::from(*b).powi(2);
    }
    Ok(if den == 0.0 { num.sqrt() } else { (num / den).sqrt() })
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> Result<()> {
    let err = rel_l2(got, want).with_context(|| what.to_owned())?;
    ensure!(err <= tol, "{what}: relative L2 error {err:.3e} > {tol:.0e}");
    Ok(())
}

fn assert_same_bytes(what: &str, got: &Tensor, want: &Tensor) -> Result<()> {
    let (g, w) = (got.to_host_bytes()?, want.to_host_bytes()?);
    ensure!(g.len() == w.len(), "{what}: {} bytes, expected {}", g.len(), w.len());
    if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
        bail!("{what}: byte {i} is {:#04x}, expected {:#04x}", g[i], w[i]);
    }
    Ok(())
}

// ---- linear ------------------------------------------------------------------

#[test]
fn linear_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(1);
    for dtype in FLOATS {
        for (m, n, k) in [(1, 256, 512), (7, 1000, 384), (64, 512, 4096), (300, 384, 1000), (16, 16, 1)] {
            for bias in [false, true] {
                for strided in [false, true] {
                    let what = format!("linear {dtype} m={m} n={n} k={k} bias={bias} strided={strided}");
                    // A strided x is a column slice of a wider matrix (row stride k + 40).
                    let wide = random(&mut r, &[m, k + 40], dtype, 0.0, 1.0)?;
                    let x = if strided { wide.narrow(1, 24, k)? } else { wide.narrow(1, 0, k)?.contiguous()? };
                    let w = random(&mut r, &[n, k], dtype, 0.0, 1.0 / (k as f32).sqrt())?;
                    let b = if bias { Some(random(&mut r, &[n], dtype, 0.0, 1.0)?) } else { None };
                    let want = ops::linear(&x, &w, b.as_ref())?;
                    let gx = if strided { view_like(&gpu(&wide)?, &x, 24)? } else { gpu(&x)? };
                    let gb = b.as_ref().map(gpu).transpose()?;
                    poison_next_alloc(m * n * dtype.size_in_bytes())?;
                    let got = ops::linear(&gx, &gpu(&w)?, gb.as_ref())?;
                    assert_close(&what, &got, &want, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

// ---- norms -------------------------------------------------------------------

const EPS: f32 = 1e-6;

#[test]
fn rms_norm_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(2);
    for dtype in FLOATS {
        for h in [64, 100, 128, 1000, 2048, 4096, 5120, 8192] {
            for t in [1, 7, 130] {
                // Dense rows, rows with a gap (a column slice), and a transposed view.
                for layout in ["dense", "row-stride", "transposed"] {
                    let what = format!("rms_norm {dtype} t={t} h={h} {layout}");
                    let w = random(&mut r, &[h], dtype, 1.0, 0.5)?;
                    let (x, gx) = match layout {
                        "dense" => {
                            let x = random(&mut r, &[t, h], dtype, 0.0, 2.0)?;
                            let gx = gpu(&x)?;
                            (x, gx)
                        }
                        "row-stride" => {
                            let wide = random(&mut r, &[t, h + 16], dtype, 0.0, 2.0)?;
                            let x = wide.narrow(1, 8, h)?;
                            let gx = view_like(&gpu(&wide)?, &x, 8)?;
                            (x, gx)
                        }
                        _ => {
                            let tr = random(&mut r, &[h, t], dtype, 0.0, 2.0)?;
                            let x = tr.permute(&[1, 0])?;
                            let gx = gpu(&tr)?.permute(&[1, 0])?;
                            (x, gx)
                        }
                    };
                    let want = ops::rms_norm(&x, &w, EPS)?;
                    poison_next_alloc(t * h * dtype.size_in_bytes())?;
                    let got = ops::rms_norm(&gx, &gpu(&w)?, EPS)?;
                    assert_close(&what, &got, &want, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn fused_add_rms_norm_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(3);
    for dtype in FLOATS {
        for h in [64, 100, 896, 2048, 4096, 8192] {
            for t in [1, 7, 130] {
                let what = format!("fused_add_rms_norm {dtype} t={t} h={h}");
                let x = random(&mut r, &[t, h], dtype, 0.0, 1.0)?;
                let res = random(&mut r, &[t, h], dtype, 0.0, 3.0)?;
                let w = random(&mut r, &[h], dtype, 1.0, 0.5)?;
                let (gx, gres) = (gpu(&x)?, gpu(&res)?);
                ops::fused_add_rms_norm(&x, &res, &w, EPS)?;
                ops::fused_add_rms_norm(&gx, &gres, &gpu(&w)?, EPS)?;
                assert_close(&format!("{what}: x"), &gx, &x, tol(dtype))?;
                assert_close(&format!("{what}: residual"), &gres, &res, tol(dtype))?;
            }
        }
    }
    Ok(())
}

#[test]
fn head_rms_norm_on_a_qkv_view_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(4);
    for dtype in FLOATS {
        for d in [64, 128, 256] {
            for t in [1, 33] {
                for (hq, hk) in [(16, 4), (8, 8)] {
                    let what = format!("head_rms_norm {dtype} t={t} d={d} heads={hq}/{hk}");
                    // q and k as views of one fused [t, hq + 2 hk, d] QKV output.
                    let qkv = random(&mut r, &[t, hq + 2 * hk, d], dtype, 0.0, 2.0)?;
                    let gqkv = gpu(&qkv)?;
                    let wq = random(&mut r, &[d], dtype, 1.0, 0.5)?;
                    let wk = random(&mut r, &[d], dtype, 1.0, 0.5)?;
                    for (start, heads, w) in [(0, hq, &wq), (hq, hk, &wk)] {
                        let view = qkv.narrow(1, start, heads)?;
                        ops::head_rms_norm(&view, w, EPS)?;
                        let gview = view_like(&gqkv, &view, start * d)?;
                        ops::head_rms_norm(&gview, &gpu(w)?, EPS)?;
                    }
                    assert_close(&what, &gqkv, &qkv, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

// ---- rope --------------------------------------------------------------------

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

#[test]
fn rope_on_qkv_views_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(5);
    let max_pos = 4096;
    for dtype in FLOATS {
        for (d, rotary_dim) in [(64, 64), (128, 128), (128, 64), (64, 24), (256, 256)] {
            let cs = cos_sin_cache(max_pos, rotary_dim, 10000.0)?;
            let gcs = gpu(&cs)?;
            for t in [1, 7, 300] {
                for index_dtype in [DType::I32, DType::I64] {
                    let (hq, hk) = (8, 2);
                    let what = format!("rope {dtype} t={t} d={d} rotary={rotary_dim} positions={index_dtype}");
                    let qkv = random(&mut r, &[t, hq + 2 * hk, d], dtype, 0.0, 1.0)?;
                    let pos: Vec<i64> = (0..t).map(|_| r.gen_range(0..max_pos as i64)).collect();
                    let positions = Tensor::from_slice(&pos, &[t], CPU)?.to_dtype(index_dtype)?;
                    let gqkv = gpu(&qkv)?;
                    let (q, k) = (qkv.narrow(1, 0, hq)?, qkv.narrow(1, hq, hk)?);
                    ops::rope(&q, &k, &positions, &cs)?;
                    let (gq, gk) = (view_like(&gqkv, &q, 0)?, view_like(&gqkv, &k, hq * d)?);
                    ops::rope(&gq, &gk, &gpu(&positions)?, &gcs)?;
                    assert_close(&what, &gqkv, &qkv, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

// ---- activation, argmax ------------------------------------------------------

#[test]
fn silu_mul_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(6);
    for dtype in FLOATS {
        for inter in [64, 100, 1408, 11008] {
            for t in [1, 5, 64, 300] {
                let what = format!("silu_mul {dtype} t={t} inter={inter}");
                let x = random(&mut r, &[t, 2 * inter], dtype, 0.0, 4.0)?;
                let want = ops::silu_mul(&x)?;
                poison_next_alloc(t * inter * dtype.size_in_bytes())?;
                let got = ops::silu_mul(&gpu(&x)?)?;
                assert_close(&what, &got, &want, tol(dtype))?;
            }
        }
    }
    Ok(())
}

#[test]
fn argmax_matches_cpu_exactly_with_first_index_on_ties() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(7);
    for dtype in FLOATS {
        for v in [1, 7, 1000, 32000, 151_936, 262_144] {
            for b in [1, 3, 64] {
                let what = format!("argmax {dtype} b={b} v={v}");
                let mut vals: Vec<f32> = (0..b * v).map(|_| r.gen_range(-10.0..10.0)).collect();
                // Row i gets a tie of two maxima (100 is exact in every dtype) at
                // random places: the first one must win.
                for row in 0..b {
                    if v > 1 && row % 2 == 0 {
                        let (mut i, mut j) = (r.gen_range(0..v), r.gen_range(0..v));
                        if i == j {
                            j = (i + 1) % v;
                        }
                        if i > j {
                            std::mem::swap(&mut i, &mut j);
                        }
                        vals[row * v + i] = 100.0;
                        vals[row * v + j] = 100.0;
                    }
                }
                let x = Tensor::from_slice(&vals, &[b, v], CPU)?.to_dtype(dtype)?;
                let want = ops::argmax(&x)?;
                poison_next_alloc(b * 4)?;
                let got = ops::argmax(&gpu(&x)?)?;
                let (g, w) = (got.to_vec::<i32>()?, want.to_vec::<i32>()?);
                ensure!(g == w, "{what}: got {:?}, expected {:?}", &g[..g.len().min(8)], &w[..w.len().min(8)]);
            }
        }
    }
    Ok(())
}

// ---- cast, copy --------------------------------------------------------------

#[test]
fn cast_matches_cpu_bit_for_bit() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(8);
    for from in FLOATS {
        for to in FLOATS {
            for (shape, transposed) in
                [(vec![37, 129], false), (vec![129, 37], true), (vec![1], false), (vec![3, 5, 7, 9], false)]
            {
                let what = format!("cast {from} -> {to} {shape:?} transposed={transposed}");
                // Values over a wide range, with subnormal-sized ones for f16.
                let n: usize = shape.iter().product();
                let vals: Vec<f32> =
                    (0..n).map(|i| r.gen_range(-1.0f32..1.0) * 10f32.powi((i % 12) as i32 - 8)).collect();
                let base = Tensor::from_slice(&vals, &shape, CPU)?.to_dtype(from)?;
                let (src, gsrc) = if transposed {
                    (base.permute(&[1, 0])?, gpu(&base)?.permute(&[1, 0])?)
                } else {
                    (base.clone(), gpu(&base)?)
                };
                let want = src.to_dtype(to)?;
                let got = gsrc.to_dtype(to)?;
                assert_same_bytes(&what, &got, &want)?;
            }
        }
    }
    Ok(())
}

#[test]
fn strided_copies_match_cpu_bit_for_bit() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(9);
    for dtype in [DType::U8, DType::BF16, DType::F32, DType::I64] {
        let n = 5 * 7 * 9;
        let bytes: Vec<u8> = (0..n * dtype.size_in_bytes()).map(|_| r.gen()).collect();
        let base = Tensor::from_bytes(&bytes, dtype, &[5, 7, 9], CPU)?;
        let gbase = gpu(&base)?;
        // A permuted source into a dense destination (Tensor::contiguous).
        let want = base.permute(&[2, 0, 1])?.contiguous()?;
        let got = gbase.permute(&[2, 0, 1])?.contiguous()?;
        assert_same_bytes(&format!("copy {dtype} permuted source"), &got, &want)?;
        // A dense source into a strided destination inside a bigger buffer.
        let big_bytes: Vec<u8> = (0..5 * 7 * 16 * dtype.size_in_bytes()).map(|_| r.gen()).collect();
        let big = Tensor::from_bytes(&big_bytes, dtype, &[5, 7, 16], CPU)?;
        let gbig = gpu(&big)?;
        let dst = big.narrow(2, 3, 9)?;
        ops::copy(&dst, &base)?;
        ops::copy(&view_like(&gbig, &dst, 3)?, &gbase)?;
        assert_same_bytes(&format!("copy {dtype} strided destination"), &gbig, &big)?;
        // A broadcast source (stride 0).
        let row = base.narrow(0, 0, 1)?;
        let bcast = row.as_strided(&[4, 7, 9], &[0, 9, 1], 0)?;
        let want = bcast.contiguous()?;
        let got = gbase.as_strided(&[4, 7, 9], &[0, 9, 1], 0)?.contiguous()?;
        assert_same_bytes(&format!("copy {dtype} broadcast source"), &got, &want)?;
    }
    Ok(())
}

// ---- paged attention ---------------------------------------------------------

/// One batch: (new tokens, kv length) per sequence.
fn attention_batches() -> Vec<(&'static str, Vec<(usize, usize)>)> {
    vec![
        // Prefill without prefix, chunked prefill over a cached prefix, and decodes
        // (the shortest possible, and long ones), in one ragged batch.
        ("mixed", vec![(37, 37), (100, 612), (1, 1), (1, 4096), (1, 1000), (64, 2000), (0, 50)]),
        // Decode only: one warp per block, split-KV and the combine phase.
        ("decode", vec![(1, 4096), (1, 17), (1, 1), (1, 2500)]),
        ("single-decode", vec![(1, 4096)]),
        // One prefill: many q tiles, the causal diagonal.
        ("prefill", vec![(256, 256)]),
    ]
}

struct AttnCase {
    dtype: DType,
    page_size: usize,
    head_dim: usize,
    heads: (usize, usize),
}

/// Runs `case` over `batch` on the CPU and, on the device, with each of `kernels`.
fn check_attention(
    r: &mut StdRng,
    case: &AttnCase,
    batch_name: &str,
    batch: &[(usize, usize)],
    kernels: &[AttnKernel],
) -> Result<()> {
    let AttnCase { dtype, page_size, head_dim: d, heads: (hq, hkv) } = *case;
    let q_lens: Vec<usize> = batch.iter().map(|b| b.0).collect();
    let kv_lens: Vec<usize> = batch.iter().map(|b| b.1).collect();
    let t: usize = q_lens.iter().sum();
    let b = batch.len();
    // Pages: each sequence gets its own, in a random order, plus spare pages.
    let pages_per_seq: Vec<usize> = kv_lens.iter().map(|kv| kv.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1).max(1) + 1;
    let num_pages = pages_per_seq.iter().sum::<usize>() + 5;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    order.shuffle(r);
    let mut table = vec![-1i32; b * max_pages];
    let mut next = 0;
    for (s, &n) in pages_per_seq.iter().enumerate() {
        table[s * max_pages..][..n].copy_from_slice(&order[next..next + n]);
        next += n;
    }
    let mut indptr = vec![0i32];
    for &q in &q_lens {
        indptr.push(indptr.last().copied().unwrap_or(0) + q as i32);
    }
    let kv_i32: Vec<i32> = kv_lens.iter().map(|&k| k as i32).collect();
    let (ti, tk, tt) = (
        Tensor::from_slice(&indptr, &[b + 1], CPU)?,
        Tensor::from_slice(&kv_i32, &[b], CPU)?,
        Tensor::from_slice(&table, &[b, max_pages], CPU)?,
    );
    // q as a view of a fused QKV output; caches random everywhere.
    let qkv = random(r, &[t, hq + 2 * hkv, d], dtype, 0.0, 1.0)?;
    let q = qkv.narrow(1, 0, hq)?;
    let k_cache = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let v_cache = random(r, &[num_pages, page_size, hkv, d], dtype, 0.0, 1.0)?;
    let scale = 1.0 / (d as f32).sqrt();

    let want = Tensor::zeros(&[t, hq, d], dtype, CPU)?;
    let meta = PagedAttnMeta {
        q_indptr: &ti,
        kv_lens: &tk,
        block_table: &tt,
        q_lens_host: &q_lens,
        kv_lens_host: &kv_lens,
        decode_splits: None,
    };
    ops::paged_attention(&want, &q, &k_cache, &v_cache, &meta, scale)?;

    let (gi, gk, gt) = (gpu(&ti)?, gpu(&tk)?, gpu(&tt)?);
    let gq = view_like(&gpu(&qkv)?, &q, 0)?;
    let (gkc, gvc) = (gpu(&k_cache)?, gpu(&v_cache)?);
    let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
    for &kernel in kernels {
        // The decode kernel also runs the fixed-split plan of CUDA graphs (each
        // sequence cut into equal chunks on the device), with counts that leave
        // some sequences unsplit and some splits empty.
        let splits: &[Option<usize>] =
            if kernel == AttnKernel::Decode { &[None, Some(1), Some(3), Some(40)] } else { &[None] };
        for &decode_splits in splits {
            let gmeta = PagedAttnMeta {
                q_indptr: &gi,
                kv_lens: &gk,
                block_table: &gt,
                q_lens_host: &q_lens,
                kv_lens_host: &kv_lens,
                decode_splits,
            };
            let what = format!(
                "paged_attention[{kernel:?}, splits {decode_splits:?}] {dtype} page={page_size} d={d} heads={hq}/{hkv} batch={batch_name}"
            );
            let got = poisoned(&[t, hq, d], dtype)?;
            ops::paged_attention_with(&got, &gq, &gkc, &gvc, &gmeta, scale, kernel).with_context(|| what.clone())?;
            assert_close(&what, &got, &want, tol)?;
        }
    }
    Ok(())
}

#[test]
fn paged_attention_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(10);
    let mut failures = Vec::new();
    let mut cases = 0;
    for dtype in FLOATS {
        for page_size in [1, 16] {
            for head_dim in [64, 128] {
                for heads in [(8, 2), (4, 4)] {
                    for (name, batch) in attention_batches() {
                        let case = AttnCase { dtype, page_size, head_dim, heads };
                        cases += 1;
                        if let Err(e) =
                            check_attention(&mut r, &case, name, &batch, &[AttnKernel::Auto, AttnKernel::Tile])
                        {
                            failures.push(format!("{e:#}"));
                        }
                    }
                }
            }
        }
    }
    // head_dim 256 and a page of 256 tokens, once each.
    for (dtype, page_size, head_dim) in [(DType::BF16, 16, 256), (DType::F16, 256, 128)] {
        for (name, batch) in attention_batches() {
            cases += 1;
            let case = AttnCase { dtype, page_size, head_dim, heads: (8, 2) };
            if let Err(e) = check_attention(&mut r, &case, name, &batch, &[AttnKernel::Auto, AttnKernel::Tile]) {
                failures.push(format!("{e:#}"));
            }
        }
    }
    ensure!(failures.is_empty(), "{} of {cases} attention cases failed:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

/// Decode batches: (new tokens, kv length) per sequence, ragged, with and without
/// splits; `multi` has two new tokens (8 rows at GQA 4).
fn decode_batches(r: &mut StdRng, group: usize, max_rows: usize) -> Vec<(String, Vec<(usize, usize)>)> {
    let mut out = vec![
        ("ragged".to_owned(), vec![(1, 1), (1, 17), (1, 300), (1, 4096), (1, 2500), (1, 63), (1, 65), (0, 40)]),
        ("one-short".to_owned(), vec![(1, 1)]),
    ];
    let many: Vec<(usize, usize)> = (0..64).map(|_| (1, r.gen_range(1..=2000))).collect();
    out.push(("64-random".to_owned(), many));
    if group <= 4 {
        out.push(("multi".to_owned(), vec![(2, 100), (1, 5000), (2, 2), (1, 1)]));
    }
    if group <= 4 && max_rows >= 16 {
        // 16 rows on the tensor-core block (or 12: a partial tile).
        out.push(("multi-16".to_owned(), vec![(16 / group, 300), (12 / group, 12 / group), (1, 777)]));
    }
    out
}

/// Query rows per kv head the decode kernel holds for `dtype`: 16 on the
/// tensor-core block (bf16/f16 unless MINISGL_DECODE_MMA=0), else 8.
fn max_rows(dtype: DType) -> usize {
    let mma = std::env::var("MINISGL_DECODE_MMA").map_or(true, |v| v.trim() != "0");
    if dtype != DType::F32 && mma {
        16
    } else {
        8
    }
}

/// The decode kernel against the CPU reference: page sizes 1, 16, 64, 256; head
/// dimensions 64, 128, 256; GQA ratios 1, 2, 4, 8; contexts 1 to 32768; ragged
/// batches with and without splits; bf16 throughout, f16 and f32 (compiled at run
/// time) on a subset.
#[test]
fn decode_attention_matches_cpu() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let mut r = rng(11);
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut run = |r: &mut StdRng, case: AttnCase, name: &str, batch: &[(usize, usize)]| {
        cases += 1;
        if let Err(e) = check_attention(r, &case, name, batch, &[AttnKernel::Decode]) {
            failures.push(format!("{e:#}"));
        }
    };
    for page_size in [1, 16, 64, 256] {
        for head_dim in [64, 128, 256] {
            for group in [1, 2, 4, 8] {
                for (name, batch) in decode_batches(&mut r, group, max_rows(DType::BF16)) {
                    run(
                        &mut r,
                        AttnCase { dtype: DType::BF16, page_size, head_dim, heads: (2 * group, 2) },
                        &name,
                        &batch,
                    );
                }
            }
        }
        // The longest context, once per page size.
        run(
            &mut r,
            AttnCase { dtype: DType::BF16, page_size, head_dim: 128, heads: (8, 2) },
            "32k",
            &[(1, 32768), (1, 3)],
        );
    }
    for dtype in [DType::F16, DType::F32] {
        for head_dim in [64, 128, 256] {
            for group in [1, 4] {
                for (name, batch) in decode_batches(&mut r, group, max_rows(dtype)) {
                    run(&mut r, AttnCase { dtype, page_size: 16, head_dim, heads: (2 * group, 2) }, &name, &batch);
                }
            }
        }
    }
    println!("decode attention: {cases} cases");
    ensure!(
        failures.is_empty(),
        "{} of {cases} decode attention cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn decode_attention_cuda_core_blocks() -> Result<()> {
    if !enabled_or_dry_run() || target() == CPU {
        return Ok(());
    }
    // The same matrix on the CUDA-core blocks for bf16/f16 too (compiled at run time).
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args(["decode_attention_matches_cpu", "--exact", "--nocapture", "--test-threads=1"])
        .env("MINISGL_DECODE_MMA", "0")
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success() && text.contains("1 passed"), "the CUDA-core decode run failed:\n{text}");
    Ok(())
}

#[test]
fn decode_attention_refuses_batches_it_cannot_hold() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    if target() == CPU {
        return Ok(()); // the CPU reference serves every batch
    }
    let mut r = rng(12);
    let e = check_attention(
        &mut r,
        &AttnCase { dtype: DType::BF16, page_size: 16, head_dim: 128, heads: (8, 2) },
        "prefill",
        &[(5, 10)],
        &[AttnKernel::Decode],
    )
    .expect_err("20 rows per kv head must be refused");
    ensure!(format!("{e:#}").contains("at most 8 rows"), "{e:#}");
    Ok(())
}

#[test]
fn paged_attention_cuda_core_products() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args(["paged_attention_matches_cpu", "--exact", "--nocapture", "--test-threads=1"])
        .env("MINISGL_ATTENTION_MMA", "0")
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success() && text.contains("1 passed"), "the CUDA-core attention run failed:\n{text}");
    Ok(())
}

// ---- fill_uniform ------------------------------------------------------------

#[test]
fn fill_uniform_on_the_gpu_equals_the_cpu_bit_for_bit() -> Result<()> {
    if !enabled_or_dry_run() {
        return Ok(());
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (n, seed, center, half) in [(1usize, 1u64, 0.0f32, 1.0f32), (1000, 7, 1.0, 0.1), (3 << 20, 42, 0.0, 0.054)]
        {
            let cpu = Tensor::zeros(&[n], dtype, Device::Cpu)?;
            ops::fill_uniform(&cpu, seed, center, half)?;
            let dev = Tensor::zeros(&[n], dtype, target())?;
            ops::fill_uniform(&dev, seed, center, half)?;
            ensure!(
                dev.to_host_bytes()? == cpu.to_host_bytes()?,
                "fill_uniform {dtype} n={n} seed={seed}: devices differ"
            );
        }
        // A row range of a matrix (how merged dummy weights are made) is filled as its own tensor.
        let whole = Tensor::zeros(&[96, 48], dtype, target())?;
        ops::fill_uniform(&whole.narrow(0, 32, 64)?, 5, 0.0, 1.0)?;
        let alone = Tensor::zeros(&[64, 48], dtype, Device::Cpu)?;
        ops::fill_uniform(&alone, 5, 0.0, 1.0)?;
        ensure!(
            whole.narrow(0, 32, 64)?.contiguous()?.to_host_bytes()? == alone.to_host_bytes()?,
            "{dtype}: view fill"
        );
        ensure!(whole.narrow(0, 0, 32)?.to_f32_vec()?.iter().all(|v| *v == 0.0), "{dtype}: wrote outside the view");
    }
    Ok(())
}
