//! `cargo xtask`: minisgl's developer tasks.
//!
//! | task | what |
//! | --- | --- |
//! | `build-kernels [--arch sm_90a[,sm_80]] [--out DIR] [--no-cubins]` | nvcc every family of csrc/kernels.toml into a shared library, cubins and manifest.json |
//! | `codegen [--check]` | bindgen `tensor.h` and `nccl227.h` into kernel-runtime/src/sys/ |
//! | `gpu-bundle [--out DIR]` | everything a GPU run needs in one folder (default `.gpu/`) with `run.sh` |
#![forbid(unsafe_code)]

mod codegen;
mod gpu_bundle;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernel_build::aot::Progress;

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
        /// Only the shared library (no per-instance cubins).
        #[arg(long)]
        no_cubins: bool,
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

/// The workspace root (the parent of xtask/), without a `..` in it, so the
/// paths printed from it read plainly.
pub fn workspace_root() -> PathBuf {
    let raw = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    raw.canonicalize().unwrap_or(raw)
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::BuildKernels { arch, out, jobs, no_cubins } => build_kernels(arch, out, jobs, !no_cubins),
        Task::Codegen { check } => codegen::run(check),
        Task::GpuBundle { out } => gpu_bundle::run(out.unwrap_or_else(|| workspace_root().join(".gpu"))),
    }
}

/// `cargo xtask build-kernels`: one progress bar over the objects and cubins
/// that are out of date (each one an nvcc run of seconds to a minute), a line
/// per compiled file, then the link and a summary.
pub fn build_kernels(arch: Vec<String>, out: Option<PathBuf>, jobs: Option<usize>, cubins: bool) -> Result<()> {
    let root = workspace_root();
    let opts = kernel_build::aot::AotOptions {
        csrc_dir: root.join("csrc"),
        out_dir: out.unwrap_or_else(|| root.join("target").join("kernels")),
        archs: arch,
        nvcc: None,
        jobs: jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)),
        cubins,
    };
    let started = std::time::Instant::now();
    eprintln!("build-kernels: checking {} for {}", opts.out_dir.display(), opts.archs.join(","));
    let bar = ProgressBar::hidden();
    let progress = |p: Progress<'_>| match p {
        Progress::Compiling { total } => {
            bar.set_length(total as u64);
            bar.set_style(
                ProgressStyle::with_template("build-kernels: compiling [{bar:30}] {pos}/{len} {elapsed} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(std::time::Duration::from_millis(500));
        }
        Progress::Compiled { label } => {
            bar.inc(1);
            let line = format!("compiled {}/{} {label}", bar.position(), bar.length().unwrap_or(0));
            // Not a terminal (a CI log): the bar draws nothing, so the
            // counter goes out as plain lines.
            if bar.is_hidden() {
                eprintln!("build-kernels: {line}");
            } else {
                bar.println(line);
                bar.set_message(label.to_owned());
            }
        }
        Progress::Linking { name } => {
            bar.finish_and_clear();
            eprintln!("build-kernels: linking {name}");
        }
    };
    let report = kernel_build::aot::build_with_progress(&opts, &progress).context("cargo xtask build-kernels");
    bar.finish_and_clear();
    let report = report?;
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
