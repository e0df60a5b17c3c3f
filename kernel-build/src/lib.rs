//! minisgl kernel-build: the kernel toolchain that never links CUDA.
//!
//! | module | what |
//! | --- | --- |
//! | [`spec`] | `csrc/kernels.toml`, the one list of kernel families, symbols and instances |
//! | [`sources`] | kernel sources as text and the SHA-256 that names a build of them |
//! | [`manifest`] | `manifest.json`, what an AOT build produced |
//! | [`aot`] | the nvcc build: one shared library per arch set, cubins, incremental |
//!
//! **Architecture Invariant:** this crate runs no CUDA code and needs no GPU; it is
//! called from `xtask` and from kernel-runtime's build script, and the runtime uses
//! its spec, hashing and manifest types so that both sides agree by construction.
#![forbid(unsafe_code)]

pub mod aot;
pub mod manifest;
pub mod sources;
pub mod spec;

use std::path::{Path, PathBuf};

pub use manifest::Manifest;
pub use sources::{family_hash, KernelSources};
pub use spec::{Family, Instance, Spec};

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

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, then a
/// rename, so a reader (or a concurrent writer) never sees a partial file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{unique}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(source) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Io { path: path.to_owned(), source });
    }
    Ok(())
}

/// The `csrc/` folder of this workspace (for tools run from the source tree).
pub fn workspace_csrc_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("csrc")
}
