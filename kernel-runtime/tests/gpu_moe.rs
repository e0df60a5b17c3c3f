//! The CUDA MoE kernels against their references (gated: they run only with
//! MINISGL_GPU_TESTS=1 on a machine with a GPU; otherwise each test prints a
//! skip line):
//! - routing: ids exactly as the CPU reference, weights within 1e-6;
//! - the sort by expert: exactly the CPU reference's layout (offsets, sorted pairs,
//!   block experts, tiles), single-block and multi-block paths, with experts that
//!   receive no tokens and dropped ids;
//! - the fused experts against the naive composition of dense ops on CUDA
//!   (cuBLAS `linear` + `silu_mul` per expert), relative L2 <= 1e-2, for
//!   E=128 top-8 H=2048 I=768 (Qwen3-30B-A3B), E=64 top-4 H=2048 I=1408 and E=8
//!   top-2 H=1024 I=3584, at M = 1, 2, 7, 16, 64, 255, 1024, 8192 tokens, with a
//!   routing that leaves half the experts without tokens and drops a pair;
//! - every tile of the table on the same inputs (odd shapes: sizes that are
//!   multiples of 8 only, 3..256 experts, top-k 1..8, empty experts, M 1..8192;
//!   and the Qwen3-30B-A3B shapes), every mixed pair of tiles of equal rows (the
//!   gate_up and down GEMMs take different tiles), runs that repeat bit for bit,
//!   and the fused route+sort path of `fused_moe` bit for bit against route, then
//!   sort.
//! - the wgmma tiles (18.., sm_90 only: elsewhere they drop out of the tile lists)
//!   alone and paired with the mma.sync tiles of their rows, M = 1..8192 at
//!   Qwen3-30B-A3B's shapes (bf16 and f16), the odd shapes and E=8 top-2.
//!
//! Outputs are poisoned (NaN bytes) before each run: the caching allocator hands
//! the next allocation of the same size a poisoned block.

mod common;

use anyhow::{ensure, Context, Result};
use common::enabled;
use kernel_runtime::ops::{self, moe::MOE_BLOCK_M, MoePlan, MoeRouting};
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CPU: Device = Device::Cpu;
const GPU: Device = Device::Cuda(0);
const MS: [usize; 8] = [1, 2, 7, 16, 64, 255, 1024, 8192];

/// A tensor of `dtype` on `device` with values uniform in [-scale, scale): random
/// 16-bit indices into a table of 65536 values (fast enough for a gigabyte of
/// expert weights).
fn random(seed: u64, shape: &[usize], dtype: DType, scale: f32, device: Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut r = StdRng::seed_from_u64(seed);
    let table: Vec<f32> = (0..65536).map(|_| r.gen_range(-scale..scale)).collect();
    let mut s = seed | 1;
    let mut idx = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 24) as usize & 0xffff
    };
    let t = match dtype {
        DType::BF16 => {
            let table: Vec<half::bf16> = table.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let v: Vec<half::bf16> = (0..n).map(|_| table[idx()]).collect();
            Tensor::from_slice(&v, shape, device)?
        }
        DType::F16 => {
            let table: Vec<half::f16> = table.iter().map(|&v| half::f16::from_f32(v)).collect();
            let v: Vec<half::f16> = (0..n).map(|_| table[idx()]).collect();
            Tensor::from_slice(&v, shape, device)?
        }
        _ => {
            let v: Vec<f32> = (0..n).map(|_| table[idx()]).collect();
            Tensor::from_slice(&v, shape, device)?
        }
    };
    Ok(t)
}

/// Makes the next GPU allocation of `bytes` bytes likely to be a block of 0xff
/// bytes (NaN for floats).
fn poison_next_alloc(bytes: usize) -> Result<()> {
    drop(Tensor::from_bytes(&vec![0xffu8; bytes.max(1)], DType::U8, &[bytes.max(1)], GPU)?);
    Ok(())
}

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
    Ok((num / den.max(1e-300)).sqrt())
}

/// Router logits for `m` tokens over `e` experts: normal-ish values, with the
/// experts >= e / 2 pushed far down when `half_unused` (they then receive no
/// tokens as long as top_k <= e / 2).
fn logits(seed: u64, m: usize, e: usize, half_unused: bool, dtype: DType) -> Result<Tensor> {
    let mut r = StdRng::seed_from_u64(seed);
    let v: Vec<f32> = (0..m * e)
        .map(|i| if half_unused && i % e >= e / 2 { -30.0 + r.gen_range(-1.0..1.0) } else { r.gen_range(-3.0..3.0) })
        .collect();
    Ok(Tensor::from_slice(&v, &[m, e], CPU)?.to_dtype(dtype)?)
}

#[test]
fn routing_matches_the_cpu_reference() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    for (e, k) in [(128, 8), (64, 4), (8, 2)] {
        for &m in &MS {
            for (dtype, renormalize) in [(DType::BF16, true), (DType::F32, false)] {
                let what = format!("route e={e} k={k} m={m} {dtype} renormalize={renormalize}");
                let l = logits(m as u64 * 31 + e as u64, m, e, false, dtype)?;
                let want = ops::moe_route(&l, k, renormalize)?;
                poison_next_alloc(m * k * 4)?;
                let got = ops::moe_route(&l.to_device(GPU)?, k, renormalize)?;
                ensure!(got.topk_ids.to_vec::<i32>()? == want.topk_ids.to_vec::<i32>()?, "{what}: ids differ");
                for (g, w) in got.topk_weights.to_vec::<f32>()?.iter().zip(want.topk_weights.to_vec::<f32>()?) {
                    ensure!((g - w).abs() <= 1e-6 * w.abs().max(1e-30), "{what}: weight {g}, want {w}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn align_matches_the_cpu_reference_exactly() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = StdRng::seed_from_u64(7);
    for (e, k) in [(128, 8), (64, 4), (8, 2), (512, 8)] {
        for &m in &MS {
            for tile_m in [16, 32, 64, 128] {
                // Even experts only (half receive no tokens), one dropped id in 13.
                let mut ids: Vec<i32> = (0..m * k).map(|_| 2 * r.gen_range(0..e / 2) as i32).collect();
                for i in (5..ids.len()).step_by(13) {
                    ids[i] = -1;
                }
                let what = format!("align e={e} k={k} m={m} tile_m={tile_m}");
                let host = Tensor::from_slice(&ids, &[m, k], CPU)?;
                let want = ops::moe_align(&host, e, MOE_BLOCK_M, tile_m)?;
                let got = ops::moe_align(&host.to_device(GPU)?, e, MOE_BLOCK_M, tile_m)?;
                let offsets = want.expert_offsets.to_vec::<i32>()?;
                ensure!(got.expert_offsets.to_vec::<i32>()? == offsets, "{what}: offsets");
                let total = offsets[e] as usize;
                ensure!(
                    got.sorted_ids.to_vec::<i32>()?[..total] == want.sorted_ids.to_vec::<i32>()?[..total],
                    "{what}: sorted ids"
                );
                let blocks = total / MOE_BLOCK_M;
                ensure!(
                    got.block_experts.to_vec::<i32>()?[..blocks] == want.block_experts.to_vec::<i32>()?[..blocks],
                    "{what}: blocks"
                );
                let tiles = want.tiles.to_vec::<i32>()?;
                let used = 2 + tiles[0] as usize;
                ensure!(got.tiles.to_vec::<i32>()?[..used] == tiles[..used], "{what}: tiles");
            }
        }
    }
    Ok(())
}

/// One expert configuration: experts, top-k, hidden, intermediate.
const CONFIGS: [(usize, usize, usize, usize); 3] = [(128, 8, 2048, 768), (64, 4, 2048, 1408), (8, 2, 1024, 3584)];

struct Experts {
    w13: Tensor,
    w2: Tensor,
}

fn experts(seed: u64, e: usize, h: usize, i: usize, dtype: DType) -> Result<Experts> {
    Ok(Experts {
        w13: random(seed, &[e, 2 * i, h], dtype, (3.0 / h as f32).sqrt(), GPU)?,
        w2: random(seed + 1, &[e, h, i], dtype, (3.0 / i as f32).sqrt(), GPU)?,
    })
}

/// The routing of `m` tokens on the GPU: half the experts unused, one pair dropped.
fn routing(seed: u64, m: usize, e: usize, k: usize) -> Result<MoeRouting> {
    let l = logits(seed, m, e, k <= e / 2, DType::F32)?.to_device(GPU)?;
    let routed = ops::moe_route(&l, k, true)?;
    let mut ids = routed.topk_ids.to_vec::<i32>()?;
    ids[m * k / 2] = -1;
    Ok(MoeRouting { topk_ids: Tensor::from_slice(&ids, &[m, k], GPU)?, topk_weights: routed.topk_weights })
}

fn check_fused(dtype: DType, (e, k, h, i): (usize, usize, usize, usize), ms: &[usize]) -> Result<()> {
    let w = experts(e as u64 * 1000 + h as u64, e, h, i, dtype)?;
    for &m in ms {
        let what = format!("fused_experts {dtype} e={e} k={k} h={h} i={i} m={m}");
        let x = random(m as u64 + 17, &[m, h], dtype, 1.0, GPU)?;
        let rt = routing(m as u64 + 5, m, e, k)?;
        let want = ops::naive_experts(&x, &w.w13, &w.w2, &rt).with_context(|| what.clone())?;
        poison_next_alloc(m * h * dtype.size_in_bytes())?;
        let got = ops::fused_experts(&x, &w.w13, &w.w2, &rt).with_context(|| what.clone())?;
        let err = rel_l2(&got, &want)?;
        ensure!(err <= 1e-2, "{what}: relative L2 error {err:.3e} > 1e-2");
    }
    Ok(())
}

#[test]
fn fused_experts_match_naive_qwen3_30b_shapes() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    check_fused(DType::BF16, CONFIGS[0], &MS)
}

#[test]
fn fused_experts_match_naive_e64_top4() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    check_fused(DType::BF16, CONFIGS[1], &MS)
}

#[test]
fn fused_experts_match_naive_e8_top2() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    check_fused(DType::BF16, CONFIGS[2], &MS)?;
    check_fused(DType::F16, CONFIGS[2], &[1, 64, 1024])
}

/// Sizes no tile divides (multiples of 8 only: the zero-filled tail stage of k,
/// the guarded tail columns of n), odd expert counts, every top-k, empty experts.
#[test]
fn fused_experts_match_naive_at_odd_shapes() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    for cfg in ODD {
        check_fused(DType::BF16, cfg, &[1, 5, 64, 300])?;
    }
    let (e, k, h, i) = (6, 2, 8 * 41, 8 * 19);
    let w = experts(7, e, h, i, DType::BF16)?;
    for m in [2, 90, 700] {
        check_tiles(&w, (e, k), m, &same_tiles(), "odd shape")?;
    }
    // Every tile at the other odd shapes, decode to prefill sizes.
    for (n, &(e, k, h, i)) in ODD.iter().enumerate() {
        let w = experts(40 + n as u64, e, h, i, DType::BF16)?;
        let ms: &[usize] = if n == 0 { &[1, 8, 300, 8192] } else { &[1, 5, 64, 300] };
        for &m in ms {
            check_tiles(&w, (e, k), m, &same_tiles(), "odd shape")?;
        }
    }
    Ok(())
}

/// Odd shapes: (experts, top-k, hidden, intermediate).
const ODD: [(usize, usize, usize, usize); 4] =
    [(3, 1, 8 * 37, 8 * 23), (5, 3, 8 * 9, 8 * 129), (17, 8, 8 * 131, 8 * 5), (256, 8, 8 * 65, 8)];

/// The tiles of the table that run on the GPU (the wgmma tiles 18.. need sm_90).
fn gpu_tiles() -> Vec<usize> {
    (0..ops::moe::moe_tile_shapes().len()).filter(|&t| ops::moe::moe_tile_supported(t, GPU).unwrap()).collect()
}

/// The wgmma tiles of the table (first index 18), when the GPU runs them.
fn wgmma_tiles() -> Vec<usize> {
    gpu_tiles().into_iter().filter(|&t| t >= WGMMA_FIRST).collect()
}
const WGMMA_FIRST: usize = 18;

/// Every tile of the table for both GEMMs.
fn same_tiles() -> Vec<(usize, usize)> {
    gpu_tiles().into_iter().map(|t| (t, t)).collect()
}

/// Every (gate_up, down) pair of different tiles of equal rows.
fn mixed_tiles() -> Vec<(usize, usize)> {
    let shapes = ops::moe::moe_tile_shapes();
    let tiles = gpu_tiles();
    tiles
        .iter()
        .flat_map(|&g| tiles.iter().map(move |&d| (g, d)))
        .filter(|&(g, d)| g != d && shapes[g][0] == shapes[d][0])
        .collect()
}

/// `fused_experts_with` each tile pair against the naive experts, for `m` tokens
/// routed to top-`k` of `e` experts (half of them empty, one pair dropped).
fn check_tiles(w: &Experts, (e, k): (usize, usize), m: usize, pairs: &[(usize, usize)], what: &str) -> Result<()> {
    let h = w.w13.dim(2);
    let x = random(m as u64, &[m, h], DType::BF16, 1.0, GPU)?;
    let rt = routing(m as u64 + 1, m, e, k)?;
    let want = ops::naive_experts(&x, &w.w13, &w.w2, &rt)?;
    for &(g, d) in pairs {
        let plan = MoePlan { gate_up_tile: g, down_tile: d, pdl: (g + d) % 2 == 0, decode: false };
        let what = format!("{what} e={e} k={k} h={h} i={} m={m} tiles {g} {d}", w.w2.dim(2));
        poison_next_alloc(m * h * 2)?;
        let got = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, Some(plan)).with_context(|| what.clone())?;
        let err = rel_l2(&got, &want)?;
        ensure!(err <= 1e-2, "{what}: relative L2 error {err:.3e} > 1e-2");
    }
    Ok(())
}

#[test]
fn every_tile_matches_naive() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (e, k, h, i) = CONFIGS[1];
    let w = experts(99, e, h, i, DType::BF16)?;
    for m in [3, 100, 600] {
        check_tiles(&w, (e, k), m, &same_tiles(), "every tile")?;
    }
    Ok(())
}

/// Every tile and every mixed pair at Qwen3-30B-A3B's shapes, decode to prefill.
#[test]
fn every_tile_matches_naive_qwen3_30b_shapes() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (e, k, h, i) = CONFIGS[0];
    let w = experts(77, e, h, i, DType::BF16)?;
    for m in [1, 2, 8, 16, 64, 256, 1024] {
        check_tiles(&w, (e, k), m, &same_tiles(), "qwen3-30b")?;
    }
    for m in [1, 16, 300] {
        check_tiles(&w, (e, k), m, &mixed_tiles(), "qwen3-30b mixed")?;
    }
    Ok(())
}

/// The wgmma tiles (both GEMMs, and paired with every mma.sync tile of their rows)
/// from M = 1 to 8192 at Qwen3-30B-A3B's shapes, in bf16 and f16, and at the odd
/// shapes (the zero-filled k tail stage, guarded n tails, one-expert runs).
#[test]
fn gpu_wgmma_tiles_match_naive() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let tiles = wgmma_tiles();
    if tiles.is_empty() {
        println!("skipped: the wgmma tiles run on sm_90 only");
        return Ok(());
    }
    let same: Vec<_> = tiles.iter().map(|&t| (t, t)).collect();
    let (e, k, h, i) = CONFIGS[0];
    let w = experts(79, e, h, i, DType::BF16)?;
    for m in [1, 2, 8, 16, 64, 255, 256, 1024, 4096, 8192] {
        check_tiles(&w, (e, k), m, &same, "wgmma qwen3-30b")?;
    }
    let mixed: Vec<_> = mixed_tiles().into_iter().filter(|&(g, d)| g >= WGMMA_FIRST || d >= WGMMA_FIRST).collect();
    for m in [7, 300, 4096] {
        check_tiles(&w, (e, k), m, &mixed, "wgmma qwen3-30b mixed")?;
    }
    for (n, &(e, k, h, i)) in ODD.iter().enumerate() {
        let w = experts(140 + n as u64, e, h, i, DType::BF16)?;
        for m in [1, 5, 64, 300, 2000] {
            check_tiles(&w, (e, k), m, &same, "wgmma odd shape")?;
        }
    }
    let (e, k, h, i) = CONFIGS[2];
    let w = experts(141, e, h, i, DType::BF16)?;
    for m in [3, 600, 4096] {
        check_tiles(&w, (e, k), m, &same, "wgmma e8 top2")?;
    }
    // f16 at Qwen3-30B-A3B's shapes, through the same plans.
    let w = experts(142, CONFIGS[0].0, CONFIGS[0].2, CONFIGS[0].3, DType::F16)?;
    for m in [1, 300, 4096] {
        let x = random(m as u64 + 11, &[m, CONFIGS[0].2], DType::F16, 1.0, GPU)?;
        let rt = routing(m as u64 + 12, m, CONFIGS[0].0, CONFIGS[0].1)?;
        let want = ops::naive_experts(&x, &w.w13, &w.w2, &rt)?;
        for &t in &tiles {
            let what = format!("wgmma f16 qwen3-30b m={m} tile {t}");
            let plan = Some(MoePlan { gate_up_tile: t, down_tile: t, pdl: true, decode: false });
            poison_next_alloc(m * CONFIGS[0].2 * 2)?;
            let got = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan).with_context(|| what.clone())?;
            let err = rel_l2(&got, &want)?;
            ensure!(err <= 1e-2, "{what}: relative L2 error {err:.3e} > 1e-2");
        }
    }
    Ok(())
}

/// Each tile gives the same bytes run after run (no atomics, fixed sum order).
#[test]
fn every_tile_is_deterministic() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (e, k, h, i) = CONFIGS[0];
    let w = experts(78, e, h, i, DType::BF16)?;
    for m in [1, 64] {
        let x = random(m as u64 + 9, &[m, h], DType::BF16, 1.0, GPU)?;
        let rt = routing(m as u64 + 2, m, e, k)?;
        for (g, d) in same_tiles() {
            let plan = Some(MoePlan { gate_up_tile: g, down_tile: d, pdl: true, decode: false });
            let a = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan)?.to_host_bytes()?;
            let b = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan)?.to_host_bytes()?;
            ensure!(a == b, "tile {g} m={m}: two runs differ");
        }
    }
    Ok(())
}

#[test]
fn fused_moe_routes_and_sorts_in_one_kernel_for_small_batches() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let (e, k, h, i) = CONFIGS[0];
    let w = experts(5, e, h, i, DType::BF16)?;
    for m in [1, 7, 32, 33, 300] {
        let x = random(m as u64 + 3, &[m, h], DType::BF16, 1.0, GPU)?;
        let l = logits(m as u64, m, e, false, DType::BF16)?.to_device(GPU)?;
        let fused = ops::fused_moe(&x, &l, &w.w13, &w.w2, k, true)?;
        let separate = ops::fused_experts(&x, &w.w13, &w.w2, &ops::moe_route(&l, k, true)?)?;
        ensure!(
            fused.to_host_bytes()? == separate.to_host_bytes()?,
            "m={m}: fused_moe differs from route + fused_experts"
        );
    }
    Ok(())
}

/// The decode kernels (moe_decode.cu: per-pair weight streams, no sort) against
/// the naive experts at every configuration and odd shape, 1 to 8 tokens (past
/// the plan's threshold too), both half dtypes, with one pair dropped and half
/// the experts empty; and bit for bit the same on a second run.
#[test]
fn gpu_decode_kernels_match_naive() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    for (n, &(e, k, h, i)) in CONFIGS.iter().chain(ODD.iter()).enumerate() {
        for dtype in [DType::BF16, DType::F16] {
            let w = experts(300 + n as u64, e, h, i, dtype)?;
            for m in [1, 2, 3, 4, 8] {
                let what = format!("decode kernels {dtype} e={e} k={k} h={h} i={i} m={m}");
                let x = random(m as u64 + 29, &[m, h], dtype, 1.0, GPU)?;
                let rt = routing(m as u64 + 31, m, e, k)?;
                let want = ops::naive_experts(&x, &w.w13, &w.w2, &rt).with_context(|| what.clone())?;
                let plan = Some(MoePlan { gate_up_tile: 7, down_tile: 7, pdl: m % 2 == 0, decode: true });
                poison_next_alloc(m * h * dtype.size_in_bytes())?;
                let got = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan).with_context(|| what.clone())?;
                let err = rel_l2(&got, &want)?;
                ensure!(err <= 1e-2, "{what}: relative L2 error {err:.3e} > 1e-2");
                let again = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan)?;
                ensure!(got.to_host_bytes()? == again.to_host_bytes()?, "{what}: not deterministic");
                // Wider and odd column blocks: the same bits (each column is one
                // warp's sum whatever block holds it).
                for cols in [3, 16, 32, 200] {
                    ops::set_moe_decode_cols(Some(cols));
                    let wide = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan);
                    ops::set_moe_decode_cols(None);
                    let wide = wide.with_context(|| format!("{what} cols={cols}"))?;
                    ensure!(got.to_host_bytes()? == wide.to_host_bytes()?, "{what}: {cols} columns a block differ");
                }
                // The down pass staged by the copy engine (sm_90, within its shared
                // memory budget; elsewhere the register path runs): the same bits.
                ops::set_moe_decode_bulk(Some(true));
                for cols in [None, Some(3), Some(16)] {
                    ops::set_moe_decode_cols(cols);
                    let staged = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan);
                    ops::set_moe_decode_cols(None);
                    let staged = staged.with_context(|| format!("{what} bulk cols={cols:?}"))?;
                    ensure!(
                        got.to_host_bytes()? == staged.to_host_bytes()?,
                        "{what}: the bulk down pass differs (cols {cols:?})"
                    );
                }
                ops::set_moe_decode_bulk(None);
                // The gate_up pass with two vectors a row in flight (the AOT library's
                // lighter kernel): the same products in the same order.
                ops::set_moe_decode_unroll(Some(2));
                let light = ops::fused_experts_with(&x, &w.w13, &w.w2, &rt, plan);
                ops::set_moe_decode_unroll(None);
                let light = light.with_context(|| format!("{what} unroll 2"))?;
                ensure!(got.to_host_bytes()? == light.to_host_bytes()?, "{what}: the two-vector gate_up pass differs");
            }
        }
    }
    let major = kernel_runtime::cuda::device(0)?.capability().0;
    ensure!(major < 9 || ops::moe_decode_bulk_launches() > 0, "the bulk down pass never ran on an sm_90 device");
    println!("SUMMARY moe decode bulk down launches: {}", ops::moe_decode_bulk_launches());
    Ok(())
}

/// The fused router (`ops::moe_router_route` with MINISGL_MOE_FUSED_ROUTER on: the
/// logits and the routing in one launch) against the router GEMM and
/// `moe_route` on the GPU, at Qwen3-30B-A3B's shapes and odd ones, 1..8 tokens,
/// both normalisations, bf16 and f16: the same experts for every token whose
/// k-th and (k+1)-th logits are further apart than a few roundings (the kernel
/// sums in its own order), weights within 2e-2; bit for bit on a second run and
/// from a CUDA graph (the ticket is left zero for the next launch).
#[test]
fn gpu_fused_router_matches_the_gemm_and_route() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut checked = 0;
    let mut near_ties = 0;
    for (dtype, (e, k, h)) in [
        (DType::BF16, (128, 8, 2048)),
        (DType::F16, (64, 4, 2048)),
        (DType::BF16, (8, 2, 1024)),
        (DType::BF16, (37, 3, 264)),
        (DType::BF16, (512, 8, 1024)),
        // Rows past the 512 vectors a block holds before its wait (the loop after it).
        (DType::BF16, (16, 4, 6144)),
        (DType::F32, (20, 2, 2304)),
    ] {
        for m in [1, 2, 5, 8] {
            for renormalize in [true, false] {
                let what = format!("fused router {dtype} e={e} k={k} h={h} m={m} renormalize={renormalize}");
                let seed = (e * 1000 + m * 10 + h) as u64;
                let x = random(seed, &[m, h], dtype, 1.0, GPU)?;
                let w = random(seed + 1, &[e, h], dtype, 0.05, GPU)?;
                ops::set_moe_fused_router(Some(false));
                let logits = ops::linear(&x, &w, None)?;
                let want = ops::moe_route(&logits, k, renormalize)?;
                ops::set_moe_fused_router(Some(true));
                let launches = ops::moe_fused_router_launches();
                let got = ops::moe_router_route(&x, &w, k, renormalize);
                let again = ops::moe_router_route(&x, &w, k, renormalize);
                let ran = ops::moe_fused_router_launches() - launches;
                let dev = kernel_runtime::cuda::device(0)?;
                let captured = dev.capture(|| ops::moe_router_route(&x, &w, k, renormalize));
                ops::set_moe_fused_router(None);
                let (got, again) = (got.context(what.clone())?, again.context(what.clone())?);
                let (mut graph, replayed) = captured.context(format!("{what}: capture"))?;
                graph.replay()?;
                dev.synchronize()?;
                let bits = |r: &MoeRouting| -> Result<(Vec<i32>, Vec<u32>)> {
                    let w: Vec<u32> = r.topk_weights.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect();
                    Ok((r.topk_ids.to_vec::<i32>()?, w))
                };
                ensure!(ran >= 2, "{what}: the fused router launched {ran} times for two calls (a fallback ran)");
                ensure!(bits(&again)? == bits(&got)?, "{what}: a second run differs");
                ensure!(bits(&replayed)? == bits(&got)?, "{what}: the graph replay differs");
                let lv = logits.to_f32_vec()?;
                let (gi, gw) = (got.topk_ids.to_vec::<i32>()?, got.topk_weights.to_vec::<f32>()?);
                let (wi, ww) = (want.topk_ids.to_vec::<i32>()?, want.topk_weights.to_vec::<f32>()?);
                for t in 0..m {
                    let mut row: Vec<f32> = lv[t * e..(t + 1) * e].to_vec();
                    row.sort_by(|a, b| b.total_cmp(a));
                    // Four bf16 roundings of the logits at the boundary: two sums of
                    // one product in another order stay well within them.
                    let margin = if k < e { row[k - 1] - row[k] } else { f32::INFINITY };
                    let ulp = row[k - 1].abs().max(row[k.min(e - 1)].abs()) / 128.0;
                    if margin <= 4.0 * ulp {
                        near_ties += 1;
                        continue;
                    }
                    let mut a: Vec<(i32, f32)> =
                        gi[t * k..(t + 1) * k].iter().copied().zip(gw[t * k..].iter().copied()).collect();
                    let mut b: Vec<(i32, f32)> =
                        wi[t * k..(t + 1) * k].iter().copied().zip(ww[t * k..].iter().copied()).collect();
                    a.sort_by_key(|p| p.0);
                    b.sort_by_key(|p| p.0);
                    for ((ia, va), (ib, vb)) in a.iter().zip(&b) {
                        ensure!(ia == ib, "{what}: token {t} chose {a:?}, the GEMM and moe_route {b:?}");
                        ensure!((va - vb).abs() <= 2e-2, "{what}: token {t} expert {ia} weight {va}, want {vb}");
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("SUMMARY fused router: {checked} tokens checked, {near_ties} near ties skipped");
    ensure!(checked >= near_ties, "too few tokens away from a tie: {checked} checked, {near_ties} skipped");
    Ok(())
}
