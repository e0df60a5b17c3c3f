//! [`Error`], the errors of the kernel toolchain, and its [`Result`].

use std::path::PathBuf;

/// Errors of the kernel toolchain.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("family `{family}`: {message}")]
    Instance { family: String, message: String },
    #[error("invalid architecture `{0}`: expected names like sm_90, sm_90a or sm_80")]
    Arch(String),
    #[error(
        "nvcc not found: set CUDA_HOME (or put nvcc on PATH); without a CUDA toolkit, install one with \
         `python3 -m pip install --target DIR \"cuda-toolkit[nvcc,nvvm,crt,cudart,cccl,nvrtc]==13.0.2\"`"
    )]
    NvccNotFound,
    #[error("compiling {what} failed\ncommand: {command}\n{output}")]
    Compile { what: String, command: String, output: String },
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
