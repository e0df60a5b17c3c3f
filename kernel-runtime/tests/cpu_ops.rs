//! The CPU reference of the dense and attention ops against naive f64
//! implementations written here, on random inputs, for f32/f16/bf16.
//!
//! The f64 references read the inputs after they were rounded to the tested dtype,
//! so the only differences allowed are f32 arithmetic and the one rounding of the
//! output: a relative tolerance of a few f32 ulps for f32, and half an ulp of the
//! output dtype (plus that) for f16/bf16. Inputs are strided views where the ops
//! allow them (q/k/v as views of one fused QKV tensor, as the models produce).

use anyhow::Result;
use kernel_runtime::ops::{self, PagedAttnMeta};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const CPU: Device = Device::Cpu;
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Uniform values in [-scale, scale), never all zeros.
fn randv(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-scale..scale)).collect()
}

/// A tensor of `dtype` holding `data` (rounded).
fn tensor(data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Ok(Tensor::from_slice(data, shape, CPU)?.to_dtype(dtype)?)
}

/// The values of a float tensor as f64, row-major (after rounding to its dtype).
fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect())
}

/// Relative tolerance of one output rounding to `dtype`, plus f32 arithmetic.
fn rel_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2f64.powi(-11) + 2e-5,
        _ => 2f64.powi(-8) + 2e-5,
    }
}

/// Asserts `|got - want| <= rel * |want| + abs` element-wise, with context.
fn assert_close(what: &str, got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * w.abs() + abs, "{what}: element {i}: got {g}, want {w} (rel {rel}, abs {abs})");
    }
}

// ---- linear ---------------------------------------------------------------------

fn check_linear(dtype: DType, m: usize, k: usize, n: usize, bias: bool, seed: u64) -> Result<()> {
    let mut r = rng(seed);
    // x is a column window of a wider tensor: row stride k + 3.
    let wide = tensor(&randv(&mut r, m * (k + 3), 1.0), &[m, k + 3], dtype)?;
    let x = wide.narrow(1, 2, k)?;
    let w = tensor(&randv(&mut r, n * k, 1.0), &[n, k], dtype)?;
    let b = tensor(&randv(&mut r, n, 1.0), &[n], dtype)?;
    let out = ops::linear(&x, &w, bias.then_some(&b))?;
    assert_eq!(out.shape(), [m, n]);
    assert_eq!(out.dtype(), dtype);
    let (xv, wv, bv) = (values(&x)?, values(&w)?, values(&b)?);
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|l| xv[i * k + l] * wv[j * k + l]).sum();
            want[i * n + j] = dot + if bias { bv[j] } else { 0.0 };
        }
    }
    // Cancellation in a dot product: scale the absolute part by sqrt(k).
    let abs = 1e-5 * (k as f64).sqrt() + if dtype == DType::F32 { 0.0 } else { rel_tol(dtype) };
    assert_close(&format!("linear {dtype} {m}x{k}x{n} bias={bias}"), &values(&out)?, &want, rel_tol(dtype), abs);
    Ok(())
}

#[test]
fn linear_matches_f64() -> Result<()> {
    for dtype in FLOATS {
        // Decode-sized (split over columns), prefill-sized (gemm's own threads),
        // odd sizes, a single column, and an empty inner dimension.
        for (i, &(m, k, n)) in
            [(1, 64, 1000), (3, 100, 513), (40, 96, 130), (17, 33, 1), (2, 0, 8), (200, 64, 64)].iter().enumerate()
        {
            for bias in [false, true] {
                check_linear(dtype, m, k, n, bias, 10 + i as u64)?;
            }
        }
    }
    Ok(())
}

// ---- norms -----------------------------------------------------------------------

fn rms_ref(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(x, w)| x * inv * w).collect()
}

#[test]
fn rms_norm_matches_f64() -> Result<()> {
    let mut r = rng(1);
    for dtype in FLOATS {
        for &(t, h) in &[(1, 64), (7, 96), (300, 256)] {
            let wide = tensor(&randv(&mut r, t * (h + 8), 2.0), &[t, h + 8], dtype)?;
            let x = wide.narrow(1, 8, h)?;
            let w = tensor(&randv(&mut r, h, 1.5), &[h], dtype)?;
            let out = ops::rms_norm(&x, &w, 1e-6)?;
            let (xv, wv) = (values(&x)?, values(&w)?);
            let want: Vec<f64> = xv.chunks(h).flat_map(|row| rms_ref(row, &wv, 1e-6)).collect();
            assert_close(&format!("rms_norm {dtype} {t}x{h}"), &values(&out)?, &want, rel_tol(dtype), 1e-6);
        }
    }
    Ok(())
}

#[test]
fn fused_add_rms_norm_matches_f64() -> Result<()> {
    let mut r = rng(2);
    for dtype in FLOATS {
        for &(t, h) in &[(1, 64), (5, 80), (129, 256)] {
            let x = tensor(&randv(&mut r, t * h, 2.0), &[t, h], dtype)?;
            let res = tensor(&randv(&mut r, t * h, 2.0), &[t, h], dtype)?;
            let w = tensor(&randv(&mut r, h, 1.5), &[h], dtype)?;
            let (xv, rv, wv) = (values(&x)?, values(&res)?, values(&w)?);
            ops::fused_add_rms_norm(&x, &res, &w, 1e-5)?;
            let sum: Vec<f64> = xv.iter().zip(&rv).map(|(a, b)| a + b).collect();
            let want: Vec<f64> = sum.chunks(h).flat_map(|row| rms_ref(row, &wv, 1e-5)).collect();
            let what = format!("fused_add_rms_norm {dtype} {t}x{h}");
            assert_close(&format!("{what} residual"), &values(&res)?, &sum, rel_tol(dtype), 0.0);
            assert_close(&format!("{what} x"), &values(&x)?, &want, rel_tol(dtype), 1e-6);
        }
    }
    Ok(())
}

/// A fused QKV output `[t, (hq + 2 hkv) d]` and its q, k, v views `[t, heads, d]`.
fn qkv_views(
    r: &mut StdRng,
    t: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dtype: DType,
    scale: f32,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let width = (hq + 2 * hkv) * d;
    let qkv = tensor(&randv(r, t * width, scale), &[t, width], dtype)?;
    // The fresh qkv tensor starts at offset 0 of its buffer.
    let view = |start: usize, heads: usize| qkv.as_strided(&[t, heads, d], &[width, d, 1], start * d);
    let (q, k, v) = (view(0, hq)?, view(hq, hkv)?, view(hq + hkv, hkv)?);
    Ok((qkv, q, k, v))
}

#[test]
fn head_rms_norm_on_qkv_views_matches_f64() -> Result<()> {
    let mut r = rng(3);
    for dtype in FLOATS {
        for &(t, hq, hkv, d) in &[(1, 4, 2, 64), (9, 8, 2, 128), (33, 3, 1, 64)] {
            let (qkv, q, k, _v) = qkv_views(&mut r, t, hq, hkv, d, dtype, 2.0)?;
            let before = values(&qkv)?;
            let wq = tensor(&randv(&mut r, d, 1.5), &[d], dtype)?;
            let wk = tensor(&randv(&mut r, d, 1.5), &[d], dtype)?;
            ops::head_rms_norm(&q, &wq, 1e-6)?;
            ops::head_rms_norm(&k, &wk, 1e-6)?;
            let (wqv, wkv) = (values(&wq)?, values(&wk)?);
            let width = (hq + 2 * hkv) * d;
            let mut want = before.clone();
            for i in 0..t {
                for h in 0..hq + hkv {
                    let w = if h < hq { &wqv } else { &wkv };
                    let row = &before[i * width + h * d..][..d];
                    want[i * width + h * d..][..d].copy_from_slice(&rms_ref(row, w, 1e-6));
                }
            }
            // v is untouched (exactly).
            assert_close(
                &format!("head_rms_norm {dtype} t={t} hq={hq} d={d}"),
                &values(&qkv)?,
                &want,
                rel_tol(dtype),
                1e-6,
            );
        }
    }
    Ok(())
}

// ---- rotary ----------------------------------------------------------------------

/// A `[max_pos, rotary_dim]` cos/sin table (cos half then sin half), base 10000.
fn cos_sin_table(max_pos: usize, rotary_dim: usize) -> Result<Tensor> {
    let half = rotary_dim / 2;
    let mut table = vec![0f32; max_pos * rotary_dim];
    for p in 0..max_pos {
        for i in 0..half {
            let angle = p as f64 / 10000f64.powf(2.0 * i as f64 / rotary_dim as f64);
            table[p * rotary_dim + i] = angle.cos() as f32;
            table[p * rotary_dim + half + i] = angle.sin() as f32;
        }
    }
    Ok(Tensor::from_slice(&table, &[max_pos, rotary_dim], CPU)?)
}

#[test]
fn rope_on_qkv_views_matches_f64() -> Result<()> {
    let mut r = rng(4);
    let max_pos = 300;
    for dtype in FLOATS {
        for &(t, hq, hkv, d, rotary_dim, pos64) in
            &[(1, 4, 2, 64, 64, false), (13, 8, 2, 128, 128, true), (20, 3, 1, 64, 32, false)]
        {
            let (qkv, q, k, _v) = qkv_views(&mut r, t, hq, hkv, d, dtype, 2.0)?;
            let before = values(&qkv)?;
            let pos: Vec<usize> = (0..t).map(|_| r.gen_range(0..max_pos)).collect();
            let positions = if pos64 {
                Tensor::from_slice(&pos.iter().map(|&p| p as i64).collect::<Vec<_>>(), &[t], CPU)?
            } else {
                Tensor::from_slice(&pos.iter().map(|&p| p as i32).collect::<Vec<_>>(), &[t], CPU)?
            };
            let table = cos_sin_table(max_pos, rotary_dim)?;
            ops::rope(&q, &k, &positions, &table)?;
            let tv = values(&table)?;
            let width = (hq + 2 * hkv) * d;
            let half = rotary_dim / 2;
            let mut want = before.clone();
            for (i, &p) in pos.iter().enumerate() {
                for h in 0..hq + hkv {
                    let base = i * width + h * d;
                    for j in 0..half {
                        let (c, s) = (tv[p * rotary_dim + j], tv[p * rotary_dim + half + j]);
                        let (x1, x2) = (before[base + j], before[base + half + j]);
                        want[base + j] = x1 * c - x2 * s;
                        want[base + half + j] = x2 * c + x1 * s;
                    }
                }
            }
            assert_close(
                &format!("rope {dtype} t={t} d={d} rotary={rotary_dim}"),
                &values(&qkv)?,
                &want,
                rel_tol(dtype),
                2e-6,
            );
        }
    }
    // A position past the table is an error, not a wild read.
    let q = Tensor::zeros(&[1, 1, 64], DType::F32, CPU)?;
    let bad = Tensor::from_slice(&[max_pos as i32], &[1], CPU)?;
    let err = ops::rope(&q, &q.clone(), &bad, &cos_sin_table(max_pos, 64)?).unwrap_err().to_string();
    assert!(err.contains("position 300"), "{err}");
    Ok(())
}

// ---- activation, argmax --------------------------------------------------------

#[test]
fn silu_mul_matches_f64() -> Result<()> {
    let mut r = rng(5);
    for dtype in FLOATS {
        for &(t, i) in &[(1, 64), (3, 100), (70, 512)] {
            let x = tensor(&randv(&mut r, t * 2 * i, 6.0), &[t, 2 * i], dtype)?;
            let out = ops::silu_mul(&x)?;
            let xv = values(&x)?;
            let want: Vec<f64> = xv
                .chunks(2 * i)
                .flat_map(|row| (0..i).map(move |j| row[j] / (1.0 + (-row[j]).exp()) * row[i + j]))
                .collect();
            assert_close(&format!("silu_mul {dtype} {t}x{i}"), &values(&out)?, &want, rel_tol(dtype), 1e-6);
        }
    }
    Ok(())
}

#[test]
fn argmax_takes_the_first_maximum() -> Result<()> {
    let mut r = rng(6);
    for dtype in FLOATS {
        let (b, v) = (9, 1000);
        let mut data = randv(&mut r, b * v, 4.0);
        // Row 1: a tie between two maxima; row 2: the maximum at the end.
        data[v + 10] = 9.0;
        data[v + 20] = 9.0;
        data[3 * v - 1] = 9.5;
        let x = tensor(&data, &[b, v], dtype)?;
        let got = ops::argmax(&x)?.to_vec::<i32>()?;
        let xv = values(&x)?;
        let want: Vec<i32> = xv
            .chunks(v)
            .map(|row| {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                row.iter().position(|&x| x == max).unwrap_or(0) as i32
            })
            .collect();
        assert_eq!(got, want, "argmax {dtype}");
        assert_eq!((got[1], got[2]), (10, v as i32 - 1));
    }
    Ok(())
}

// ---- paged attention -----------------------------------------------------------

/// One attention case: page size, heads, head dim, and per sequence the cached
/// prefix and the new tokens.
struct AttnCase {
    page_size: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    seqs: &'static [(usize, usize)],
}

fn check_attention(dtype: DType, c: &AttnCase, seed: u64) -> Result<()> {
    let mut r = rng(seed);
    let AttnCase { page_size, hq, hkv, d, seqs } = *c;
    let b = seqs.len();
    let q_lens: Vec<usize> = seqs.iter().map(|s| s.1).collect();
    let kv_lens: Vec<usize> = seqs.iter().map(|s| s.0 + s.1).collect();
    let t: usize = q_lens.iter().sum();
    let max_pages = kv_lens.iter().map(|l| l.div_ceil(page_size)).max().unwrap_or(0);
    let used: usize = kv_lens.iter().map(|l| l.div_ceil(page_size)).sum();
    // Pages handed out in random order, with spare pages that must not be read.
    let num_pages = used + 3;
    let mut free: Vec<usize> = (0..num_pages).collect();
    free.shuffle(&mut r);
    let mut table = vec![-1i32; b * max_pages];
    let mut pages_of = Vec::new();
    for (s, &len) in kv_lens.iter().enumerate() {
        let pages: Vec<usize> = (0..len.div_ceil(page_size)).map(|_| free.pop().unwrap_or(0)).collect();
        for (i, &p) in pages.iter().enumerate() {
            table[s * max_pages + i] = p as i32;
        }
        pages_of.push(pages);
    }
    let shape = [num_pages, page_size, hkv, d];
    let k_cache = tensor(&randv(&mut r, shape.iter().product(), 1.0), &shape, dtype)?;
    let v_cache = tensor(&randv(&mut r, shape.iter().product(), 1.0), &shape, dtype)?;
    let (_qkv, q, _k, _v) = qkv_views(&mut r, t, hq, hkv, d, dtype, 2.0)?;
    let out = Tensor::zeros(&[t, hq, d], dtype, CPU)?;

    let mut indptr = vec![0i32];
    for &l in &q_lens {
        indptr.push(indptr[indptr.len() - 1] + l as i32);
    }
    let q_indptr = Tensor::from_slice(&indptr, &[b + 1], CPU)?;
    let kv_lens_t = Tensor::from_slice(&kv_lens.iter().map(|&l| l as i32).collect::<Vec<_>>(), &[b], CPU)?;
    let block_table = Tensor::from_slice(&table, &[b, max_pages], CPU)?;
    let meta = PagedAttnMeta {
        q_indptr: &q_indptr,
        kv_lens: &kv_lens_t,
        block_table: &block_table,
        q_lens_host: &q_lens,
        kv_lens_host: &kv_lens,
        decode_splits: None,
    };
    let scale = 1.0 / (d as f32).sqrt();
    ops::paged_attention(&out, &q, &k_cache, &v_cache, &meta, scale)?;

    // Naive f64: per sequence, token and head, walk positions through the pages.
    let (qv, kv, vv) = (values(&q.contiguous()?)?, values(&k_cache)?, values(&v_cache)?);
    let slot_row =
        |s: usize, p: usize, g: usize| ((pages_of[s][p / page_size] * page_size + p % page_size) * hkv + g) * d;
    let mut want = vec![0f64; t * hq * d];
    for s in 0..b {
        let prefix = kv_lens[s] - q_lens[s];
        for j in 0..q_lens[s] {
            let row = indptr[s] as usize + j;
            for h in 0..hq {
                let g = h / (hq / hkv);
                let qr = &qv[(row * hq + h) * d..][..d];
                let scores: Vec<f64> = (0..=prefix + j)
                    .map(|p| {
                        qr.iter().zip(&kv[slot_row(s, p, g)..][..d]).map(|(a, b)| a * b).sum::<f64>() * f64::from(scale)
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (p, w) in e.iter().enumerate() {
                    for (o, v) in want[(row * hq + h) * d..][..d].iter_mut().zip(&vv[slot_row(s, p, 0) + g * d..][..d])
                    {
                        *o += w / sum * v;
                    }
                }
            }
        }
    }
    let what = format!("paged_attention {dtype} page_size={page_size} hq={hq} hkv={hkv} d={d} seqs={seqs:?}");
    assert_close(&what, &values(&out)?, &want, rel_tol(dtype), 1e-5);
    Ok(())
}

const ATTN_CASES: &[AttnCase] = &[
    // Prefill without a prefix, decode steps, a chunk after a cached prefix.
    AttnCase { page_size: 1, hq: 4, hkv: 2, d: 64, seqs: &[(0, 5), (7, 1), (16, 16), (3, 20), (30, 1)] },
    AttnCase { page_size: 16, hq: 4, hkv: 2, d: 64, seqs: &[(0, 5), (7, 1), (16, 16), (3, 20), (30, 1)] },
    // Multi-query (one KV head), head dim 128, long sequences crossing pages.
    AttnCase { page_size: 16, hq: 8, hkv: 1, d: 128, seqs: &[(40, 1), (0, 37), (17, 15)] },
    AttnCase { page_size: 1, hq: 3, hkv: 3, d: 64, seqs: &[(2, 3)] },
    AttnCase { page_size: 4, hq: 6, hkv: 2, d: 64, seqs: &[(0, 1), (1, 1), (5, 1), (8, 1)] },
];

#[test]
fn paged_attention_matches_f64() -> Result<()> {
    for dtype in FLOATS {
        for (i, c) in ATTN_CASES.iter().enumerate() {
            check_attention(dtype, c, 100 + i as u64)?;
        }
    }
    Ok(())
}

#[test]
fn paged_attention_rejects_bad_metadata() -> Result<()> {
    let q = Tensor::zeros(&[2, 2, 64], DType::F32, CPU)?;
    let out = Tensor::zeros(&[2, 2, 64], DType::F32, CPU)?;
    let cache = Tensor::zeros(&[2, 4, 1, 64], DType::F32, CPU)?;
    let q_indptr = Tensor::from_slice(&[0i32, 2], &[2], CPU)?;
    let kv_lens = Tensor::from_slice(&[6i32], &[1], CPU)?;
    let run = |table: &[i32], kv_lens: &Tensor| {
        let block_table = Tensor::from_slice(table, &[1, 2], CPU).expect("table");
        let meta = PagedAttnMeta {
            q_indptr: &q_indptr,
            kv_lens,
            block_table: &block_table,
            q_lens_host: &[2],
            kv_lens_host: &[6],
            decode_splits: None,
        };
        ops::paged_attention(&out, &q, &cache, &cache, &meta, 0.125).map_err(|e| e.to_string())
    };
    assert!(run(&[1, 0], &kv_lens).is_ok());
    let err = run(&[1, 5], &kv_lens).unwrap_err();
    assert!(err.contains("page 5"), "{err}");
    let err = run(&[1, 0], &Tensor::from_slice(&[5i32], &[1], CPU)?).unwrap_err();
    assert!(err.contains("kv_lens[0] = 5"), "{err}");
    Ok(())
}

/// `apply_token_mask`: exactly the disallowed logits of exactly the named rows
/// become -inf (tokens past a short mask too); the others keep their bits.
#[test]
fn token_mask_sets_exactly_the_disallowed_logits() -> Result<()> {
    let mut r = rng(23);
    for dtype in FLOATS {
        let (rows, vocab) = (4, 100);
        let values = randv(&mut r, rows * vocab, 4.0);
        let x = Tensor::from_slice(&values, &[rows, vocab], CPU)?.to_dtype(dtype)?;
        let before = x.to_f32_vec()?;
        let words = 3; // Covers tokens 0..96: 96..100 are disallowed.
        let masked = [2u32, 0];
        let mask: Vec<u32> = (0..masked.len() * words).map(|_| r.gen()).collect();
        ops::apply_token_mask(&x, &mask, words, &masked)?;
        let after = x.to_f32_vec()?;
        for row in 0..rows {
            let m = masked.iter().position(|&m| m as usize == row);
            for t in 0..vocab {
                let (b, a) = (before[row * vocab + t], after[row * vocab + t]);
                let allowed = m.is_none_or(|i| t / 32 < words && mask[i * words + t / 32] >> (t % 32) & 1 == 1);
                if allowed {
                    assert_eq!(a.to_bits(), b.to_bits(), "{dtype}: row {row} token {t} changed");
                } else {
                    assert_eq!(a, f32::NEG_INFINITY, "{dtype}: row {row} token {t} not masked");
                }
            }
        }
        assert!(ops::apply_token_mask(&x, &mask, words, &[4, 0]).is_err(), "a row past the logits is refused");
        assert!(ops::apply_token_mask(&x, &mask[1..], words, &masked).is_err(), "short masks are refused");
    }
    Ok(())
}
