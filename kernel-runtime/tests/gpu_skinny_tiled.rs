//! The tiled skinny GEMM (csrc/kernels/skinny_tiled.cu, `ops::skinny_tiled`)
//! against the CPU reference `linear` on the same random inputs (gated: it runs
//! only with MINISGL_GPU_TESTS=1 on a machine with a GPU; MINISGL_GPU_TESTS=cpu
//! dry-runs it with the CPU standing in):
//!
//! - m = 1..256 (every tile boundary of 8 rows, row groups past 8 N_TILES), odd n,
//!   k multiples of 32 (an odd count of k-steps, fewer k-steps than a stage),
//!   bf16 and f16, bias, strided x, over the rule's plan and explicit plans that
//!   cover every warps_n, chunk, pipeline depth 2..8, K splits 1..8 and N_TILES
//!   smaller than the rows (row groups); split plans run twice and must be bitwise
//!   equal (the cluster sums in rank order);
//! - `linear` with the tiled path on and off (MINISGL_SKINNY_TILED) at the rows
//!   it takes and just past the row limit.
//!
//! Outputs are compared by relative L2 error (1e-2 bf16/f16); fresh GPU outputs
//! are poisoned with NaN bytes first, so an unwritten element fails.

mod common;

use anyhow::{ensure, Context, Result};
use common::{assert_close, enabled_or_dry_run as enabled, gpu, poison_next_alloc, random, rng, tol, view_like};
use kernel_runtime::ops::{self, TiledPlan};
use kernel_runtime::{DType, Tensor};

/// Explicit plans for m rows and k columns: every block shape, chunk, depth and
/// split the kernel takes, with the tiles that hold m (at most 16) and half as
/// many (row groups), those that fit 227 KiB of shared memory and k / 32 k-steps.
fn plans(m: usize, k: usize) -> Vec<TiledPlan> {
    let nt = m.div_ceil(8).clamp(1, 16).next_power_of_two();
    let p = |n_tiles: usize, warps_n, chunk, stages, k_splits| TiledPlan { n_tiles, warps_n, chunk, stages, k_splits };
    [
        p(nt, 1, 1, 2, 1),
        p(nt, 2, 2, 4, 2),
        p(nt, 4, 3, 3, 3),
        p(nt, 8, 4, 5, 8),
        p(nt, 8, 1, 8, 1),
        p(nt.min(8), 2, 2, 6, 4),
        p((nt / 2).max(1), 4, 2, 4, 1),
        p(1, 8, 2, 3, 2),
    ]
    .into_iter()
    .filter(|q| q.k_splits <= k / 32 && q.shared_bytes() <= 227 << 10)
    .collect()
}

#[test]
fn skinny_tiled_matches_cpu_linear_over_rows_and_plans() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(41);
    for dtype in [DType::BF16, DType::F16] {
        // An odd n, k / 32 odd (65 k-steps), k / 32 = 3 (fewer k-steps than a
        // stage of most plans), and a power-of-two shape.
        for (n, k) in [(1007, 1024), (520, 2080), (33, 96), (2048, 512)] {
            for m in [1, 2, 7, 8, 9, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 128, 129, 200, 256] {
                let strided = m % 2 == 1;
                let bias = m % 3 != 0;
                let wide = random(&mut r, &[m, k + 40], dtype, 0.0, 1.0)?;
                let x = if strided { wide.narrow(1, 16, k)? } else { random(&mut r, &[m, k], dtype, 0.0, 1.0)? };
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let b = bias.then(|| random(&mut r, &[n], dtype, 0.0, 1.0)).transpose()?;
                let want = ops::linear(&x, &w, b.as_ref())?;
                let gx = if strided { view_like(&gpu(&wide)?, &x, 16)? } else { gpu(&x)? };
                let (gw, gb) = (gpu(&w)?, b.as_ref().map(gpu).transpose()?);
                let mut all: Vec<Option<TiledPlan>> = vec![None];
                all.extend(plans(m, k).into_iter().map(Some));
                for plan in all {
                    let what = format!("skinny_tiled {dtype} m={m} n={n} k={k} bias={bias} strided={strided} {plan:?}");
                    poison_next_alloc(m * n * dtype.size_in_bytes())?;
                    let got = ops::skinny_tiled(&gx, &gw, gb.as_ref(), plan).with_context(|| what.clone())?;
                    assert_close(&what, &got, &want, tol(dtype))?;
                    if plan.is_some_and(|p| p.k_splits > 1) {
                        let again = ops::skinny_tiled(&gx, &gw, gb.as_ref(), plan)?;
                        ensure!(got.to_host_bytes()? == again.to_host_bytes()?, "{what}: two runs differ");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn linear_with_and_without_the_tiled_path_matches_cpu() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(42);
    for dtype in [DType::BF16, DType::F16] {
        // 1 MiB and more of weights (the rule's floor), m from the skinny kernel's
        // limit to past the tiled one's default limit of 64.
        for (n, k) in [(1024, 2048), (4096, 1024), (1000, 1024)] {
            for m in [1, 16, 17, 40, 64, 65] {
                let x = random(&mut r, &[m, k], dtype, 0.0, 1.0)?;
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let b = random(&mut r, &[n], dtype, 0.0, 1.0)?;
                let want = ops::linear(&x, &w, Some(&b))?;
                let (gx, gw, gb) = (gpu(&x)?, gpu(&w)?, gpu(&b)?);
                for on in [true, false] {
                    ops::set_skinny_tiled(Some(on));
                    poison_next_alloc(m * n * dtype.size_in_bytes())?;
                    let got = ops::linear(&gx, &gw, Some(&gb));
                    ops::set_skinny_tiled(None);
                    assert_close(&format!("linear {dtype} m={m} n={n} k={k} tiled={on}"), &got?, &want, tol(dtype))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn skinny_tiled_rejects_what_it_cannot_do() -> Result<()> {
    // On the GPU only: the CPU reference takes any plan.
    if !common::enabled() {
        return Ok(());
    }
    let mut r = rng(43);
    let x = gpu(&random(&mut r, &[4, 48], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 48], DType::BF16, 0.0, 1.0)?)?;
    ensure!(ops::skinny_tiled(&x, &w, None, None).is_err(), "k = 48 accepted");
    let x = gpu(&random(&mut r, &[4, 64], DType::F32, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 64], DType::F32, 0.0, 1.0)?)?;
    ensure!(ops::skinny_tiled(&x, &w, None, None).is_err(), "f32 accepted");
    let x = gpu(&random(&mut r, &[4, 64], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 64], DType::BF16, 0.0, 1.0)?)?;
    let bad = TiledPlan { n_tiles: 3, warps_n: 2, chunk: 2, stages: 4, k_splits: 1 };
    ensure!(ops::skinny_tiled(&x, &w, None, Some(bad)).is_err(), "n_tiles 3 accepted");
    let bad = TiledPlan { n_tiles: 1, warps_n: 2, chunk: 2, stages: 4, k_splits: 4 };
    ensure!(ops::skinny_tiled(&x, &w, None, Some(bad)).is_err(), "4 splits of 2 k-steps accepted");
    Ok(())
}

#[test]
fn skinny_tiled_replays_in_a_cuda_graph_bitwise() -> Result<()> {
    // Needs a CUDA device (no dry run): the capture records the launches.
    if !common::enabled() {
        return Ok(());
    }
    let dev = kernel_runtime::cuda::device(0)?;
    let mut r = rng(44);
    let (m, n, k) = (64, 2048, 1024);
    let x = gpu(&random(&mut r, &[m, k], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[n, k], DType::BF16, 0.0, 0.05)?)?;
    let split = TiledPlan { n_tiles: 8, warps_n: 4, chunk: 2, stages: 3, k_splits: 4 };
    let eager = [ops::skinny_tiled(&x, &w, None, None)?, ops::skinny_tiled(&x, &w, None, Some(split))?];
    let (mut graph, outs) = dev.capture(|| -> Result<[Tensor; 2]> {
        Ok([ops::skinny_tiled(&x, &w, None, None)?, ops::skinny_tiled(&x, &w, None, Some(split))?])
    })?;
    graph.replay()?;
    dev.synchronize()?;
    for (got, want) in outs.iter().zip(&eager) {
        ensure!(got.to_host_bytes()? == want.to_host_bytes()?, "graph replay differs from the eager launch");
    }
    Ok(())
}
