//! The streaming decode GEMM (csrc/kernels/stream_gemm.cu, `ops::stream_gemm`)
//! against the CPU reference `linear` on the same random inputs (gated: it runs
//! only with MINISGL_GPU_TESTS=1 on a machine with a GPU; MINISGL_GPU_TESTS=cpu
//! dry-runs the comparisons with the CPU standing in):
//!
//! - m = 1..16 (both x tiles, the 8-row boundary), an odd n (a partial last tile),
//!   k with a partial last k-chunk, k shorter than one chunk, a wide k, bf16 and
//!   f16, bias, strided x, over the default plan and explicit ones (chunks of 256,
//!   512 and 1024, 2 to 8 stages, one block, an odd grid, one block a tile); every plan's output must be the
//!   same bits (each tile is summed over its whole K in one block, in one order);
//! - `linear` with the streaming path on and off at a Llama-3-8B projection;
//! - a CUDA-graph replay equal to the eager launch, and the argument checks.
//!
//! Outputs are compared by relative L2 error (1e-2 bf16/f16); fresh GPU outputs
//! are poisoned with NaN bytes first, so an unwritten element fails.

mod common;

use anyhow::{ensure, Context, Result};
use common::{assert_close, enabled_or_dry_run as enabled, gpu, poison_next_alloc, random, rng, tol, view_like};
use kernel_runtime::ops::{self, StreamPlan};
use kernel_runtime::{DType, Tensor};

/// Explicit plans for m rows of n outputs: every chunk width, the shallowest and
/// deepest rings, one block, an odd grid and one block a tile (where the tile
/// count allows), 2-D copies and (where k % 256 == 0) whole-row 3-D copies.
fn plans(m: usize, n: usize, k: usize) -> Vec<StreamPlan> {
    let tiles = n.div_ceil(16);
    let deepest = if m <= 8 { 8 } else { 6 };
    let whole = k.is_multiple_of(256);
    [
        (512, 2, 1, false),
        (512, 3, 7, whole),
        (512, deepest, tiles, false),
        (256, 5, tiles.div_ceil(2), whole),
        (1024, 3, 1, false),
        (1024, 2, tiles, whole),
        (256, 8, 3, false),
    ]
    .into_iter()
    .filter(|&(_, _, blocks, _)| blocks <= tiles)
    .map(|(chunk, stages, blocks, whole_rows)| StreamPlan { chunk, stages, blocks, whole_rows })
    .collect()
}

#[test]
fn stream_gemm_matches_cpu_linear_over_rows_and_plans() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(51);
    for dtype in [DType::BF16, DType::F16] {
        // An odd n with k = 1024; k = 4 chunks of 512 + one k-step (a 32-wide last
        // chunk, 2-D copies only); a single partial tile with k under one chunk; a
        // wide k (14 chunks of 1024); k = 2304 (a 3-D box past the end of k).
        for (n, k) in [(1007, 1024), (520, 2080), (9, 96), (64, 14336), (300, 2304)] {
            for m in [1, 2, 7, 8, 9, 15, 16] {
                let strided = m % 2 == 1;
                let bias = m % 3 != 0;
                let wide = random(&mut r, &[m, k + 40], dtype, 0.0, 1.0)?;
                let x = if strided { wide.narrow(1, 16, k)? } else { random(&mut r, &[m, k], dtype, 0.0, 1.0)? };
                let w = random(&mut r, &[n, k], dtype, 0.0, 0.05)?;
                let b = bias.then(|| random(&mut r, &[n], dtype, 0.0, 1.0)).transpose()?;
                let want = ops::linear(&x, &w, b.as_ref())?;
                let gx = if strided { view_like(&gpu(&wide)?, &x, 16)? } else { gpu(&x)? };
                let (gw, gb) = (gpu(&w)?, b.as_ref().map(gpu).transpose()?);
                let mut all: Vec<Option<StreamPlan>> = vec![None];
                all.extend(plans(m, n, k).into_iter().map(Some));
                let mut first: Option<Vec<u8>> = None;
                for plan in all {
                    let what = format!("stream_gemm {dtype} m={m} n={n} k={k} bias={bias} strided={strided} {plan:?}");
                    poison_next_alloc(m * n * dtype.size_in_bytes())?;
                    let got = ops::stream_gemm(&gx, &gw, gb.as_ref(), plan).with_context(|| what.clone())?;
                    assert_close(&what, &got, &want, tol(dtype))?;
                    let bytes = got.to_host_bytes()?;
                    match &first {
                        None => first = Some(bytes),
                        Some(f) => ensure!(*f == bytes, "{what}: differs from the default plan's bits"),
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn linear_with_and_without_the_streaming_path_matches_cpu() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(52);
    // Llama-3-8B's qkv projection (48 MiB: past the skinny kernel's 16 MiB).
    let (n, k) = (6144, 4096);
    let w = random(&mut r, &[n, k], DType::BF16, 0.0, 0.02)?;
    let b = random(&mut r, &[n], DType::BF16, 0.0, 1.0)?;
    let (gw, gb) = (gpu(&w)?, gpu(&b)?);
    for m in [1, 5, 16] {
        let x = random(&mut r, &[m, k], DType::BF16, 0.0, 1.0)?;
        let want = ops::linear(&x, &w, Some(&b))?;
        let gx = gpu(&x)?;
        for on in [true, false] {
            ops::set_stream_gemm(Some(on));
            poison_next_alloc(m * n * 2)?;
            let got = ops::linear(&gx, &gw, Some(&gb));
            ops::set_stream_gemm(None);
            assert_close(&format!("linear bf16 m={m} n={n} k={k} stream={on}"), &got?, &want, tol(DType::BF16))?;
        }
    }
    Ok(())
}

#[test]
fn stream_gemm_rejects_what_it_cannot_do() -> Result<()> {
    // On the GPU only: the CPU reference takes any plan.
    if !common::enabled() {
        return Ok(());
    }
    let mut r = rng(53);
    let x = gpu(&random(&mut r, &[4, 48], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 48], DType::BF16, 0.0, 1.0)?)?;
    ensure!(ops::stream_gemm(&x, &w, None, None).is_err(), "k = 48 accepted");
    let x = gpu(&random(&mut r, &[4, 64], DType::F32, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 64], DType::F32, 0.0, 1.0)?)?;
    ensure!(ops::stream_gemm(&x, &w, None, None).is_err(), "f32 accepted");
    let x = gpu(&random(&mut r, &[17, 64], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 64], DType::BF16, 0.0, 1.0)?)?;
    ensure!(ops::stream_gemm(&x, &w, None, None).is_err(), "17 rows accepted");
    let x = gpu(&random(&mut r, &[2, 96], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 96], DType::BF16, 0.0, 1.0)?)?;
    let whole = StreamPlan { chunk: 256, stages: 2, blocks: 1, whole_rows: true };
    ensure!(ops::stream_gemm(&x, &w, None, Some(whole)).is_err(), "whole rows accepted at k = 96");
    let x = gpu(&random(&mut r, &[9, 64], DType::BF16, 0.0, 1.0)?)?;
    let w = gpu(&random(&mut r, &[64, 64], DType::BF16, 0.0, 1.0)?)?;
    let p = |chunk, stages, blocks, whole_rows| StreamPlan { chunk, stages, blocks, whole_rows };
    for bad in
        [p(512, 7, 1, false), p(512, 1, 1, false), p(512, 4, 5, false), p(384, 2, 1, false), p(1024, 4, 1, false)]
    {
        ensure!(ops::stream_gemm(&x, &w, None, Some(bad)).is_err(), "{bad:?} accepted for 9 rows of 4 tiles");
    }
    Ok(())
}

#[test]
fn stream_gemm_replays_in_a_cuda_graph_bitwise() -> Result<()> {
    // Needs a CUDA device (no dry run): the capture records the launches.
    if !common::enabled() {
        return Ok(());
    }
    let dev = kernel_runtime::cuda::device(0)?;
    let mut r = rng(54);
    let (n, k) = (4096, 4096);
    let w = gpu(&random(&mut r, &[n, k], DType::BF16, 0.0, 0.05)?)?;
    let x1 = gpu(&random(&mut r, &[1, k], DType::BF16, 0.0, 1.0)?)?;
    let x16 = gpu(&random(&mut r, &[16, k], DType::BF16, 0.0, 1.0)?)?;
    let eager = [ops::stream_gemm(&x1, &w, None, None)?, ops::stream_gemm(&x16, &w, None, None)?];
    let (mut graph, outs) = dev.capture(|| -> Result<[Tensor; 2]> {
        Ok([ops::stream_gemm(&x1, &w, None, None)?, ops::stream_gemm(&x16, &w, None, None)?])
    })?;
    graph.replay()?;
    dev.synchronize()?;
    for (got, want) in outs.iter().zip(&eager) {
        ensure!(got.to_host_bytes()? == want.to_host_bytes()?, "graph replay differs from the eager launch");
    }
    Ok(())
}
