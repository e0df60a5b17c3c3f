//! Helpers shared by the kernel-runtime integration tests: whether the GPU tests
//! run (`MINISGL_GPU_TESTS`), and the device they run on.
//!
//! `MINISGL_GPU_TESTS=1` runs them on CUDA device 0. The tests that support it
//! also take `MINISGL_GPU_TESTS=cpu`: a dry run of the tests themselves on a
//! machine without a GPU, the CPU standing in for it (every comparison is then
//! CPU against CPU). Each test file uses part of this module.
#![allow(dead_code)]

use kernel_runtime::Device;

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
