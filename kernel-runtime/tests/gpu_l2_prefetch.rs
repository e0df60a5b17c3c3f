//! The L2 prefetch (csrc/kernels/l2_prefetch.cu, `ops::prefetch_l2`), a hint
//! that must change nothing (gated: MINISGL_GPU_TESTS=1 on a machine with a GPU;
//! MINISGL_GPU_TESTS=cpu dry-runs what does not need a graph with the CPU
//! standing in):
//!
//! - prefetching tensors of every size class (a few bytes below one 16-byte
//!   word, an unaligned tail, one piece, many pieces, 40 MiB; more than the four
//!   ranges of one launch) leaves their bytes and a GEMM over them unchanged;
//! - it replays inside a CUDA graph, before the GEMM that reads the weight;
//! - the argument checks (non-contiguous, two devices);
//! - and it prints, without asserting on it, the m = 1 GEMM time of a 32 MiB
//!   weight read cold, and right after its prefetch (`SUMMARY l2_prefetch ...`).

mod common;

use anyhow::{ensure, Result};
use common::{enabled_or_dry_run as enabled, gpu, random, rng, target};
use kernel_runtime::cuda::EventTimer;
use kernel_runtime::{ops, DType, Device, Tensor};

#[test]
fn prefetch_l2_changes_nothing() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let mut r = rng(61);
    let shapes: [(&[usize], DType); 6] = [
        (&[7], DType::BF16),
        (&[3, 37], DType::F32),
        (&[64, 64], DType::BF16),
        (&[1000, 513], DType::F16),
        (&[4096, 5120], DType::BF16),
        (&[2048, 2048], DType::BF16),
    ];
    let host: Vec<Tensor> = shapes.iter().map(|(s, d)| random(&mut r, s, *d, 0.0, 1.0)).collect::<Result<_>>()?;
    let dev: Vec<Tensor> = host.iter().map(gpu).collect::<Result<_>>()?;
    let x = gpu(&random(&mut r, &[1, 2048], DType::BF16, 0.0, 1.0)?)?;
    let w = &dev[5];
    let before = ops::linear(&x, w, None)?;
    let refs: Vec<&Tensor> = dev.iter().collect();
    // Six ranges: two launches.
    ops::prefetch_l2(&refs)?;
    ops::prefetch_l2(&[])?;
    ops::prefetch_l2(&[w])?;
    let after = ops::linear(&x, w, None)?;
    ensure!(after.to_host_bytes()? == before.to_host_bytes()?, "a GEMM after the prefetch differs");
    for (h, d) in host.iter().zip(&dev) {
        ensure!(h.to_host_bytes()? == d.to_host_bytes()?, "a prefetched tensor changed ({:?})", h.shape());
    }
    // A non-contiguous view is refused with a message naming the op.
    let strided = dev[4].narrow(1, 0, 100)?;
    let err = ops::prefetch_l2(&[&strided]).expect_err("a strided view must be refused").to_string();
    ensure!(err.contains("prefetch_l2") && err.contains("contiguous"), "unexpected error: {err}");
    if target() != Device::Cpu {
        let err = ops::prefetch_l2(&[&dev[0], &host[0]]).expect_err("two devices must be refused").to_string();
        ensure!(err.contains("prefetch_l2") && err.contains("cpu"), "unexpected error: {err}");
    }
    Ok(())
}

#[test]
fn prefetch_l2_replays_in_a_cuda_graph_gpu() -> Result<()> {
    // Needs a CUDA device (no dry run): the capture records the launches.
    if !common::enabled() {
        return Ok(());
    }
    let dev = kernel_runtime::cuda::device(0)?;
    let mut r = rng(62);
    let w = gpu(&random(&mut r, &[4096, 4096], DType::BF16, 0.0, 0.05)?)?;
    let x = gpu(&random(&mut r, &[1, 4096], DType::BF16, 0.0, 1.0)?)?;
    let eager = ops::linear(&x, &w, None)?;
    let (mut graph, out) = dev.capture(|| -> Result<Tensor> {
        ops::prefetch_l2(&[&w])?;
        Ok(ops::linear(&x, &w, None)?)
    })?;
    for _ in 0..3 {
        graph.replay()?;
    }
    dev.synchronize()?;
    ensure!(out.to_host_bytes()? == eager.to_host_bytes()?, "graph replay differs from the eager launch");
    Ok(())
}

#[test]
fn prefetch_l2_gemm_timing_gpu() -> Result<()> {
    if !common::enabled() {
        return Ok(());
    }
    let dev = kernel_runtime::cuda::device(0)?;
    let timer = EventTimer::new(&dev)?;
    let mut r = rng(63);
    // Eight copies of a 32 MiB weight (Llama-3-8B's o_proj): 256 MiB rotate past the L2.
    let host = random(&mut r, &[4096, 4096], DType::BF16, 0.0, 0.05)?;
    let ws: Vec<Tensor> = (0..8).map(|_| gpu(&host)).collect::<Result<_>>()?;
    let x = gpu(&random(&mut r, &[1, 4096], DType::BF16, 0.0, 1.0)?)?;
    // Each GEMM replayed from a graph, so that the timed span holds no host work.
    let mut graphs = Vec::new();
    for w in &ws {
        graphs.push(dev.capture(|| -> Result<Tensor> { Ok(ops::linear(&x, w, None)?) })?.0);
    }
    let mut time = |prefetch: bool| -> Result<f64> {
        let mut us = Vec::new();
        for i in 0..40 {
            if prefetch {
                ops::prefetch_l2(&[&ws[i % ws.len()]])?;
            }
            // The prefetch lands (synchronize joins the side stream) before the GEMM.
            dev.synchronize()?;
            timer.start()?;
            graphs[i % ws.len()].replay()?;
            us.push(f64::from(timer.stop_ms()?) * 1e3);
        }
        us.sort_by(f64::total_cmp);
        Ok(us[us.len() / 2])
    };
    let cold = time(false)?;
    let warm = time(true)?;
    println!("SUMMARY l2_prefetch gemm m=1 4096x4096 bf16 (graph replay): cold {cold:.2} us, after prefetch {warm:.2} us");
    Ok(())
}
