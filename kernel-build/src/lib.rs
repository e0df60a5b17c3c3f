//! minisgl kernel-build: the kernel toolchain that never links CUDA.
//!
//! | module | what |
//! | --- | --- |
//! | [`spec`] | `csrc/kernels.toml`, the one list of kernel families, symbols and instances |
//! | [`sources`] | kernel sources as text and the SHA-256 that names a build of them |
//! | [`manifest`] | `manifest.json`, what an AOT build produced |
//! | [`error`] | [`Error`], the one error type of the crate |
//! | [`files`] | [`write_atomic`] and the workspace's `csrc/` folder |
//! | [`aot`] | the nvcc build: one shared library per arch set, cubins, incremental |
//!
//! **Architecture Invariant:** this crate runs no CUDA code and needs no GPU; it is
//! called from `xtask` and from kernel-runtime's build script, and the runtime uses
//! its spec, hashing and manifest types so that both sides agree by construction.
#![forbid(unsafe_code)]

pub mod aot;
pub mod error;
pub mod files;
pub mod manifest;
pub mod sources;
pub mod spec;

pub use error::{Error, Result};
pub use files::{workspace_csrc_dir, write_atomic};
pub use manifest::Manifest;
pub use sources::{family_hash, KernelSources};
pub use spec::{Family, Instance, Spec};
