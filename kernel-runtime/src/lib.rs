//! minisgl kernel-runtime: everything that touches CUDA, and the CPU reference.
//!
//! | module | what |
//! | --- | --- |
//! | [`tensor`] | [`Tensor`]: strided views of host or device memory, with the `msgl_tensor` ABI mirror |
//! | [`cache_dir`] | the minisgl cache folder (`MINISGL_CACHE_DIR`, XDG, `~/.cache`) |
//! | [`cuda`] | devices, the compute stream, the caching allocator, event timing |
//! | [`kernels`] | loading kernels: AOT library + manifest, AOT cubins, NVRTC disk cache |
//! | [`op_types`] | the argument and plan types `ops` hands to `cpu` and `gpu` (MoE routing and plans, sampling rows) |
//! | [`ops`] | typed launchers that validate, then run on the CPU or the GPU |
//! | [`cpu`] | the CPU reference of every op (f32 compute) |
//! | [`staging`] | host-device copies through pinned memory that do not wait for the stream |
//! | [`nccl`] | communicators over libnccl.so.2 |
//! | [`sys`] | raw bindgen output (`cargo xtask codegen`) |
//!
//! **Architecture Invariant:** all `unsafe` and FFI of minisgl lives in this crate;
//! it knows nothing about requests, batches, models or HTTP.
//!
//! cudarc is used with dynamic loading: everything builds and runs on a machine
//! without CUDA, and asking for a GPU there is an [`Error::NoCuda`], not a panic.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cache_dir;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
mod gpu;
pub mod kernels;
pub mod nccl;
pub mod op_types;
pub mod ops;
pub mod staging;
pub mod sys;
pub mod tensor;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use tensor::Tensor;
