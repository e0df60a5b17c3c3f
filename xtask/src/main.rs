//! `cargo xtask`: minisgl's developer tasks.
//!
//! | task | what |
//! | --- | --- |
//! | `build-kernels [--arch sm_90[,sm_80]] [--out DIR]` | nvcc every family of csrc/kernels.toml into a shared library, cubins and manifest.json |
//! | `codegen [--check]` | bindgen `tensor.h` and `nccl227.h` into kernel-runtime/src/sys/ |
//! | `gpu-bundle [--out DIR]` | everything a GPU run needs in one folder (default `.gpu/`) with `run.sh` |
#![forbid(unsafe_code)]

mod codegen;
mod gpu_bundle;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "minisgl developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Compile every kernel family ahead of time and write manifest.json.
    BuildKernels {
        /// Comma-separated real architectures.
        #[arg(long, default_value = kernel_build::aot::DEFAULT_ARCH, value_delimiter = ',')]
        arch: Vec<String>,
        /// Output folder (default: target/kernels).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Parallel nvcc processes (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// Regenerate the Rust mirrors of the C headers with bindgen.
    Codegen {
        /// Fail instead of writing when the committed files are stale.
        #[arg(long)]
        check: bool,
    },
    /// Gather release binaries, kernels, fixtures and run.sh for the GPU machine.
    GpuBundle {
        /// Output folder (default: .gpu).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// The workspace root (the parent of xtask/).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::BuildKernels { arch, out, jobs } => build_kernels(arch, out, jobs),
        Task::Codegen { check } => codegen::run(check),
        Task::GpuBundle { out } => gpu_bundle::run(out.unwrap_or_else(|| workspace_root().join(".gpu"))),
    }
}

/// `cargo xtask build-kernels`.
pub fn build_kernels(arch: Vec<String>, out: Option<PathBuf>, jobs: Option<usize>) -> Result<()> {
    let root = workspace_root();
    let opts = kernel_build::aot::AotOptions {
        csrc_dir: root.join("csrc"),
        out_dir: out.unwrap_or_else(|| root.join("target").join("kernels")),
        archs: arch,
        nvcc: None,
        jobs: jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)),
    };
    let started = std::time::Instant::now();
    let report = kernel_build::aot::build(&opts).context("cargo xtask build-kernels")?;
    for label in &report.compiled {
        println!("compiled {label}");
    }
    if report.linked {
        println!("linked {}", kernel_build::aot::library_name(&opts.archs));
    }
    let manifest = report.manifest.as_ref().context("the build wrote no manifest")?;
    println!(
        "{} kernel families for {} (nvcc {}): {} in {:.1}s; manifest {}",
        manifest.kernels.len(),
        manifest.archs.join(","),
        manifest.nvcc_version,
        if report.up_to_date() { "up to date".to_owned() } else { format!("{} compiled", report.compiled.len()) },
        started.elapsed().as_secs_f64(),
        opts.out_dir.join(kernel_build::manifest::MANIFEST_FILE).display()
    );
    Ok(())
}
