//! Helpers shared by the kernel-runtime integration tests: whether the GPU tests
//! run (`MINISGL_GPU_TESTS`), and the device they run on.
//!
//! `MINISGL_GPU_TESTS=1` runs them on CUDA device 0. The tests that support it
//! also take `MINISGL_GPU_TESTS=cpu`: a dry run of the tests themselves on a
//! machine without a GPU, the CPU standing in for it (every comparison is then
//! CPU against CPU). Also the random inputs, device copies and poisoned
//! allocations the op tests share. Each test file uses part of this module.
#![allow(dead_code)]

use anyhow::Result;
use kernel_runtime::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn gpu_tests_value() -> Option<String> {
    std::env::var("MINISGL_GPU_TESTS").ok().map(|v| v.trim().to_owned())
}

/// Whether GPU tests run (`MINISGL_GPU_TESTS=1`); prints the skip line when not.
pub fn enabled() -> bool {
    if gpu_tests_value().as_deref() == Some("1") {
        true
    } else {
        println!("skipped: set MINISGL_GPU_TESTS=1");
        false
    }
}

/// Whether GPU tests run, on the GPU (`MINISGL_GPU_TESTS=1`) or as a dry run on
/// the CPU (`MINISGL_GPU_TESTS=cpu`, see [`target`]); prints the skip line when not.
pub fn enabled_or_dry_run() -> bool {
    if matches!(gpu_tests_value().as_deref(), Some("1" | "cpu")) {
        true
    } else {
        println!("skipped: set MINISGL_GPU_TESTS=1");
        false
    }
}

/// The device under test: CUDA device 0, or the CPU standing in for it with
/// `MINISGL_GPU_TESTS=cpu`.
pub fn target() -> Device {
    if gpu_tests_value().as_deref() == Some("cpu") {
        Device::Cpu
    } else {
        Device::Cuda(0)
    }
}

/// A seeded generator for a test's random inputs.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Relative L2 tolerance of an op's output.
pub fn tol(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-5
    } else {
        1e-2
    }
}

/// A host tensor of `dtype` with values uniform in `[center - scale, center + scale)`.
pub fn random(r: &mut StdRng, shape: &[usize], dtype: DType, center: f32, scale: f32) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| center + r.gen_range(-scale..scale)).collect();
    Ok(Tensor::from_slice(&v, shape, Device::Cpu)?.to_dtype(dtype)?)
}

/// The same bytes in a new buffer on the device under test (a dense copy; views
/// are rebuilt with `view_like`).
pub fn gpu(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_bytes(&t.to_host_bytes()?, t.dtype(), t.shape(), target())?)
}

/// `base`'s view `like` (shape, strides, offset relative to its own base `like_base`).
pub fn view_like(base: &Tensor, like: &Tensor, offset: usize) -> Result<Tensor> {
    Ok(base.as_strided(like.shape(), like.strides(), offset)?)
}

/// Makes the next GPU allocation of `bytes` bytes likely to be a block full of
/// 0xff bytes (NaN for every float type, -1 for integers).
pub fn poison_next_alloc(bytes: usize) -> Result<()> {
    drop(Tensor::from_bytes(&vec![0xffu8; bytes.max(1)], DType::U8, &[bytes.max(1)], target())?);
    Ok(())
}

/// Relative L2 error of `got` against `want` (the absolute one when `want` is all
/// zeros); infinite when `got` holds a non-finite value (an unwritten, poisoned
/// element).
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in got.iter().zip(want) {
        if !a.is_finite() {
            return f64::INFINITY;
        }
        num += (f64::from(*a) - f64::from(*b)).powi(2);
        den += f64::from(*b).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Fails unless `got` has `want`'s shape and a relative L2 error within `tol`.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> Result<()> {
    anyhow::ensure!(got.shape() == want.shape(), "{what}: shapes {:?} and {:?} differ", got.shape(), want.shape());
    let err = rel_l2(&got.to_f32_vec()?, &want.to_f32_vec()?);
    anyhow::ensure!(err <= tol, "{what}: relative L2 error {err:.3e} > {tol:.0e}");
    Ok(())
}
