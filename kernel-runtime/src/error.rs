//! The one error type of kernel-runtime.
//!
//! Argument errors name the op and the argument (`store_kv: argument `k` ...`);
//! lower-level errors keep their source (`Driver`, `Io`, `Toolchain`).

use std::path::PathBuf;

use crate::dtype::DType;

/// Errors of kernel-runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A launcher or tensor argument is wrong.
    #[error("{op}: {message}")]
    Argument { op: &'static str, message: String },
    /// A dtype the operation does not support.
    #[error("{op}: dtype {got} is not supported (expected {expected})")]
    DType { op: &'static str, got: DType, expected: String },
    /// Shapes that do not fit together.
    #[error("{op}: expected shape {expected:?}, got {got:?}")]
    Shape { op: &'static str, expected: Vec<usize>, got: Vec<usize> },
    /// No CUDA driver, no such device, or a GPU asked for on a machine without one.
    #[error("{0}")]
    NoCuda(String),
    /// A CUDA driver call failed.
    #[error("CUDA {what}: {source}")]
    Driver { what: String, source: cudarc::driver::DriverError },
    /// A launcher in the kernel library returned an error status.
    #[error("{op}: {message}")]
    Launch { op: &'static str, message: String },
    /// The kernel registry (manifest, library, cache) could not be set up: its
    /// first error, kept as text because the registry is created once per
    /// process and every later call reports the same failure.
    #[error("{0}")]
    Registry(String),
    /// The AOT kernel library is unusable: stale, unloadable, missing a symbol,
    /// or built for another ABI.
    #[error("{path}: {message}")]
    Library { path: PathBuf, message: String },
    /// `MINISGL_KERNEL_MODE` is not one of aot, jit, auto.
    #[error("MINISGL_KERNEL_MODE={value:?} is not one of aot, jit, auto")]
    KernelMode { value: String },
    /// A kernel family that csrc/kernels.toml does not list.
    #[error("kernel family `{family}` is not in csrc/kernels.toml")]
    UnknownFamily { family: String },
    /// An instance the AOT build lacks, of a family that cannot be compiled at
    /// run time (it has no single-instance `jit_entry`).
    #[error("kernel family `{family}` has no AOT instance {instance} and cannot be compiled at run time")]
    NotCompilable { family: String, instance: String },
    /// A cubin or NVRTC load of a family without a `jit_entry`.
    #[error("kernel family `{family}` has no jit entry")]
    NoJitEntry { family: String },
    /// More dynamic shared memory asked for than a launch can take.
    #[error("{bytes} bytes of shared memory")]
    SharedMemory { bytes: u32 },
    /// A kernel entry name that cannot be passed to the driver.
    #[error("entry `{entry}` contains a NUL")]
    EntryName { entry: String },
    /// A kernel instance is missing from the AOT manifest and JIT is not allowed.
    #[error(
        "kernel {family}[{instance}] is not in the AOT manifest{detail} and MINISGL_KERNEL_MODE=aot forbids compiling it \
         (add it to csrc/kernels.toml and rerun `cargo xtask build-kernels`, or allow JIT with MINISGL_KERNEL_MODE=auto)"
    )]
    MissingInstance { family: String, instance: String, detail: String },
    /// NVRTC failed to compile a kernel (with its log).
    #[error("NVRTC compiling {what} failed: {message}")]
    Nvrtc { what: String, message: String },
    /// cuBLAS / cuBLASLt failed.
    #[error("cuBLAS {what}: {message}")]
    Blas { what: String, message: String },
    /// NCCL failed.
    #[error("NCCL {what}: {message}")]
    Nccl { what: String, message: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The toolchain (spec, manifest) reported an error.
    #[error(transparent)]
    Toolchain(#[from] kernel_build::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn arg(op: &'static str, message: impl Into<String>) -> Error {
        Error::Argument { op, message: message.into() }
    }

    pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
        let what = what.into();
        move |source| Error::Driver { what, source }
    }
}
