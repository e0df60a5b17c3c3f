//! The CPU reference of the MoE ops against naive f64 implementations written
//! here: routing (ties, renormalisation on and off, f32 and 16-bit logits), the
//! sort by expert (experts with no tokens, dropped ids, every tile height), the
//! fused experts and the naive composition of dense ops, and the weighted sum.
//!
//! The f64 references read the inputs after rounding to the tested dtype. Routing
//! ids must match exactly and weights to 1e-6; the layout exactly; the expert
//! outputs within a relative L2 error of 1e-5 in f32 (f32 arithmetic) and of the
//! intermediate roundings for 16-bit dtypes.

use anyhow::{ensure, Result};
use kernel_runtime::ops::{self, moe::MOE_BLOCK_M, MoeRouting};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CPU: Device = Device::Cpu;

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn randv(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-scale..scale)).collect()
}

fn tensor(data: &[f32], shape: &[usize], dtype: DType) -> Result<Tensor> {
    Ok(Tensor::from_slice(data, shape, CPU)?.to_dtype(dtype)?)
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect())
}

fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Top-k of one row in f64: experts by logit descending, ties to the lower index.
fn route_f64(logits: &[f64], k: usize, renormalize: bool) -> (Vec<i32>, Vec<f64>) {
    let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|v| (v - mx).exp()).sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let ids: Vec<i32> = order[..k].iter().map(|&e| e as i32).collect();
    let mut w: Vec<f64> = order[..k].iter().map(|&e| (logits[e] - mx).exp() / sum).collect();
    if renormalize {
        let s: f64 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    (ids, w)
}

#[test]
fn routing_matches_f64_with_ties_and_both_normalisations() -> Result<()> {
    let mut r = rng(1);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (t, e, k) in [(1, 8, 2), (7, 64, 4), (33, 128, 8), (5, 3, 3), (4, 512, 32)] {
            for renormalize in [false, true] {
                // Logits on a coarse grid so that ties are frequent.
                let logits: Vec<f32> = (0..t * e).map(|_| (r.gen_range(-8..8) as f32) * 0.25).collect();
                let lt = tensor(&logits, &[t, e], dtype)?;
                let routing = ops::moe_route(&lt, k, renormalize)?;
                let (ids, w) = (routing.topk_ids.to_vec::<i32>()?, routing.topk_weights.to_vec::<f32>()?);
                for (row, l) in values(&lt)?.chunks(e).enumerate() {
                    let (want_ids, want_w) = route_f64(l, k, renormalize);
                    let what = format!("{dtype} t={t} e={e} k={k} renormalize={renormalize} token {row}");
                    ensure!(
                        ids[row * k..(row + 1) * k] == want_ids[..],
                        "{what}: ids {:?}, want {want_ids:?}",
                        &ids[row * k..(row + 1) * k]
                    );
                    for (g, w) in w[row * k..(row + 1) * k].iter().zip(&want_w) {
                        ensure!((f64::from(*g) - w).abs() <= 1e-6 * w.abs().max(1e-30), "{what}: weight {g}, want {w}");
                    }
                }
            }
        }
    }
    // Bad arguments are errors, not panics.
    let lt = tensor(&[0.0; 8], &[2, 4], DType::F32)?;
    assert!(ops::moe_route(&lt, 5, true).is_err());
    assert!(ops::moe_route(&lt, 0, true).is_err());
    Ok(())
}

/// The layout of moe_align, written plainly.
fn align_naive(ids: &[i32], e: usize, bm: usize, tm: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) {
    let n = ids.len() as i32;
    let mut offsets = vec![0i32];
    let mut sorted = Vec::new();
    let mut blocks = Vec::new();
    let mut tiles = vec![0, tm as i32];
    for x in 0..e as i32 {
        let start = sorted.len();
        sorted.extend((0..n).filter(|&p| ids[p as usize] == x));
        while sorted.len() % bm != 0 {
            sorted.push(n);
        }
        blocks.extend(std::iter::repeat_n(x, (sorted.len() - start) / bm));
        tiles.extend((start..sorted.len()).step_by(tm).map(|r| r as i32));
        offsets.push(sorted.len() as i32);
    }
    tiles[0] = tiles.len() as i32 - 2;
    (offsets, sorted, blocks, tiles)
}

#[test]
fn align_is_a_stable_padded_sort_with_tiles() -> Result<()> {
    let mut r = rng(2);
    for (t, e, k) in [(1usize, 128usize, 8usize), (3, 8, 2), (64, 64, 4), (300, 128, 8), (1000, 8, 2), (17, 512, 1)] {
        for tm in [16, 32, 64, 128] {
            // Only even experts are used, so half receive no tokens; a few ids are
            // dropped (-1 and e, outside the experts).
            let mut ids: Vec<i32> = (0..t * k).map(|_| 2 * r.gen_range(0..e.div_ceil(2)) as i32).collect();
            for i in (0..ids.len()).step_by(11) {
                ids[i] = if i % 2 == 0 { -1 } else { e as i32 };
            }
            let it = Tensor::from_slice(&ids, &[t, k], CPU)?;
            let a = ops::moe_align(&it, e, MOE_BLOCK_M, tm)?;
            let (offsets, sorted, blocks, tiles) = align_naive(&ids, e, MOE_BLOCK_M, tm);
            let what = format!("t={t} e={e} k={k} tile_m={tm}");
            ensure!(a.expert_offsets.to_vec::<i32>()? == offsets, "{what}: offsets");
            let total = *offsets.last().unwrap_or(&0) as usize;
            ensure!(a.sorted_ids.to_vec::<i32>()?[..total] == sorted[..], "{what}: sorted ids");
            ensure!(a.block_experts.to_vec::<i32>()?[..total / MOE_BLOCK_M] == blocks[..], "{what}: block experts");
            ensure!(a.tiles.to_vec::<i32>()?[..tiles.len()] == tiles[..], "{what}: tiles");
        }
    }
    let it = Tensor::from_slice(&[0i32; 4], &[2, 2], CPU)?;
    assert!(ops::moe_align(&it, 8, 16, 24).is_err(), "tile_m must be a multiple of block_m");
    Ok(())
}

/// out[t] = sum_s w[t, s] down(silu(gate x) * up x) in f64, dropped ids skipped.
fn experts_f64(
    x: &[f64],
    w13: &[f64],
    w2: &[f64],
    ids: &[i32],
    w: &[f32],
    dims: (usize, usize, usize, usize, usize),
) -> Vec<f64> {
    let (t, h, i, e, k) = dims;
    let mut out = vec![0f64; t * h];
    for token in 0..t {
        for s in 0..k {
            let ex = ids[token * k + s];
            if ex < 0 || ex as usize >= e {
                continue;
            }
            let base = ex as usize * 2 * i * h;
            let xr = &x[token * h..(token + 1) * h];
            let act: Vec<f64> = (0..i)
                .map(|j| {
                    let g: f64 = (0..h).map(|c| xr[c] * w13[base + j * h + c]).sum();
                    let u: f64 = (0..h).map(|c| xr[c] * w13[base + (i + j) * h + c]).sum();
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for c in 0..h {
                let y: f64 = (0..i).map(|j| act[j] * w2[ex as usize * h * i + c * i + j]).sum();
                out[token * h + c] += f64::from(w[token * k + s]) * y;
            }
        }
    }
    out
}

#[test]
fn fused_and_naive_experts_match_f64() -> Result<()> {
    let mut r = rng(3);
    for dtype in [DType::F32, DType::BF16] {
        // Sizes that are multiples of 8 only (what the fused GPU path's tail stages
        // take), odd expert counts, top-k from 1 to 8.
        for (t, h, i, e, k) in [
            (1, 64, 32, 8, 2),
            (9, 128, 64, 16, 4),
            (40, 64, 128, 8, 8),
            (7, 8 * 5, 8 * 3, 3, 1),
            (33, 8 * 9, 8 * 7, 17, 3),
            (300, 8 * 3, 8, 5, 2),
        ] {
            let x = tensor(&randv(&mut r, t * h, 1.0), &[t, h], dtype)?;
            let w13 = tensor(&randv(&mut r, e * 2 * i * h, 1.0 / (h as f32).sqrt()), &[e, 2 * i, h], dtype)?;
            let w2 = tensor(&randv(&mut r, e * h * i, 1.0 / (i as f32).sqrt()), &[e, h, i], dtype)?;
            // Experts 0 and 1 never receive tokens; one pair is dropped.
            let mut ids: Vec<i32> = (0..t * k).map(|_| r.gen_range(2..e) as i32).collect();
            ids[t * k / 2] = -1;
            let weights: Vec<f32> = (0..t * k).map(|_| r.gen_range(0.0..1.0)).collect();
            let routing = MoeRouting {
                topk_ids: Tensor::from_slice(&ids, &[t, k], CPU)?,
                topk_weights: Tensor::from_slice(&weights, &[t, k], CPU)?,
            };
            let want = experts_f64(&values(&x)?, &values(&w13)?, &values(&w2)?, &ids, &weights, (t, h, i, e, k));
            // 16-bit: the activation and each pair's output are rounded once.
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            for (name, got) in [
                ("fused", ops::fused_experts(&x, &w13, &w2, &routing)?),
                ("naive", ops::naive_experts(&x, &w13, &w2, &routing)?),
            ] {
                ensure!(got.shape() == [t, h] && got.dtype() == dtype);
                let err = rel_l2(&values(&got)?, &want);
                ensure!(err <= tol, "{name} {dtype} t={t} h={h} i={i} e={e} k={k}: rel L2 {err:e} > {tol:e}");
            }
        }
    }
    Ok(())
}

#[test]
fn fused_moe_is_route_then_experts() -> Result<()> {
    let mut r = rng(4);
    let (t, h, i, e, k) = (6, 64, 64, 8, 2);
    let x = tensor(&randv(&mut r, t * h, 1.0), &[t, h], DType::F32)?;
    let logits = tensor(&randv(&mut r, t * e, 2.0), &[t, e], DType::F32)?;
    let w13 = tensor(&randv(&mut r, e * 2 * i * h, 0.1), &[e, 2 * i, h], DType::F32)?;
    let w2 = tensor(&randv(&mut r, e * h * i, 0.1), &[e, h, i], DType::F32)?;
    let got = ops::fused_moe(&x, &logits, &w13, &w2, k, true)?;
    let want = ops::fused_experts(&x, &w13, &w2, &ops::moe_route(&logits, k, true)?)?;
    ensure!(got.to_vec::<f32>()? == want.to_vec::<f32>()?);
    // Mismatched shapes are errors that name the argument.
    let bad = ops::fused_moe(&x, &logits, &w13, &w2.narrow(0, 0, 4)?.contiguous()?, k, true).unwrap_err().to_string();
    assert!(bad.contains("w2"), "{bad}");
    Ok(())
}

#[test]
fn moe_sum_weights_and_skips_dropped_pairs() -> Result<()> {
    let mut r = rng(5);
    let (t, k, h, e) = (5, 3, 24, 4);
    let part = randv(&mut r, t * k * h, 1.0);
    let ids: Vec<i32> = (0..t * k).map(|p| if p % 4 == 0 { e as i32 } else { (p % e) as i32 }).collect();
    let w: Vec<f32> = (0..t * k).map(|_| r.gen_range(0.0..1.0)).collect();
    let routing = MoeRouting {
        topk_ids: Tensor::from_slice(&ids, &[t, k], CPU)?,
        topk_weights: Tensor::from_slice(&w, &[t, k], CPU)?,
    };
    for weighted in [false, true] {
        let out = Tensor::empty(&[t, h], DType::F32, CPU)?;
        ops::moe_sum(&out, &Tensor::from_slice(&part, &[t * k, h], CPU)?, &routing, e, weighted)?;
        let got = out.to_vec::<f32>()?;
        for token in 0..t {
            for c in 0..h {
                let want: f64 = (0..k)
                    .filter(|s| (ids[token * k + s] as usize) < e)
                    .map(|s| {
                        f64::from(if weighted { w[token * k + s] } else { 1.0 })
                            * f64::from(part[(token * k + s) * h + c])
                    })
                    .sum();
                ensure!(
                    (f64::from(got[token * h + c]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "weighted={weighted}"
                );
            }
        }
    }
    Ok(())
}

/// `moe_router_route` on the CPU: the router GEMM then the routing, the same ids
/// and weights as `linear` + `moe_route` (bf16, f32; 1..9 tokens; odd sizes), and a
/// clear error for a router weight of the wrong shape or dtype and a bad top-k.
#[test]
fn router_route_is_the_gemm_then_the_routing() -> Result<()> {
    let mut r = rng(7);
    for dtype in [DType::BF16, DType::F32] {
        for (t, e, k, h) in [(1, 128, 8, 256), (9, 37, 3, 200), (4, 8, 2, 64)] {
            let x = tensor(&randv(&mut r, t * h, 1.0), &[t, h], dtype)?;
            let w = tensor(&randv(&mut r, e * h, 0.2), &[e, h], dtype)?;
            for renormalize in [false, true] {
                let got = ops::moe_router_route(&x, &w, k, renormalize)?;
                let want = ops::moe_route(&ops::linear(&x, &w, None)?, k, renormalize)?;
                ensure!(got.topk_ids.to_vec::<i32>()? == want.topk_ids.to_vec::<i32>()?, "{dtype} t={t} e={e}: ids");
                ensure!(
                    got.topk_weights.to_vec::<f32>()? == want.topk_weights.to_vec::<f32>()?,
                    "{dtype} t={t} e={e}: weights"
                );
            }
        }
    }
    let x = tensor(&randv(&mut r, 2 * 64, 1.0), &[2, 64], DType::F32)?;
    let w = tensor(&randv(&mut r, 8 * 64, 1.0), &[8, 64], DType::F32)?;
    let short = tensor(&randv(&mut r, 8 * 32, 1.0), &[8, 32], DType::F32)?;
    let e = ops::moe_router_route(&x, &short, 2, true).err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(e.contains("router_w"), "a router weight of the wrong width: {e:?}");
    let e =
        ops::moe_router_route(&x, &w.to_dtype(DType::BF16)?, 2, true).err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(e.contains("router_w"), "a router weight of another dtype: {e:?}");
    let e = ops::moe_router_route(&x, &w, 9, true).err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(e.contains("top_k"), "top_k past the experts: {e:?}");
    Ok(())
}
