//! The one error type of `models` (the GGUF reader keeps its own, wrapped here).
//!
//! Every variant names what a user needs to fix the input: the file, the key of
//! `config.json`, the tensor and the folder it was looked for in, the expected
//! and actual shapes. Errors of the kernel runtime (a bad op argument, CUDA) pass
//! through unchanged.

use std::path::PathBuf;

use kernel_runtime::DType;

/// Result of every fallible operation in `models`.
pub type Result<T> = std::result::Result<T, ModelError>;

/// What went wrong while reading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    /// A JSON file is not valid JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },

    /// `config.json` lacks a key the model needs.
    #[error("{}: missing required key `{key}`", path.display())]
    MissingKey { path: PathBuf, key: String },

    /// A `config.json` key has a value of the wrong type or out of range.
    #[error("{}: key `{key}`: {message}", path.display())]
    InvalidKey { path: PathBuf, key: String, message: String },

    /// `architectures[0]` names a model this crate does not implement.
    #[error("unsupported architecture `{architecture}` (supported: {supported})")]
    UnsupportedArchitecture { architecture: String, supported: String },

    /// A configuration the architecture exists for but this crate does not run
    /// yet (a sliding window, a rope scaling type, an activation).
    #[error("{}: {message}", path.display())]
    Unsupported { path: PathBuf, message: String },

    /// A tensor the model needs is not in the checkpoint.
    #[error("{}: tensor `{name}` not found in the checkpoint", location.display())]
    MissingTensor { location: PathBuf, name: String },

    /// A checkpoint tensor has another shape than the config implies.
    #[error("{}: tensor `{name}` has shape {actual:?}, expected {expected:?}", location.display())]
    TensorShape { location: PathBuf, name: String, expected: Vec<usize>, actual: Vec<usize> },

    /// A checkpoint tensor is stored in a type weight loading does not convert.
    #[error("{}: tensor `{name}` is stored as {stored}, expected BF16, F16 or F32", location.display())]
    TensorDtype { location: PathBuf, name: String, stored: String },

    /// A safetensors file (or its index) is truncated or corrupt.
    #[error("{}: invalid safetensors file: {message}", path.display())]
    Safetensors { path: PathBuf, message: String },

    /// No weights where the load format said to look.
    #[error("{}: {message}", path.display())]
    NoWeights { path: PathBuf, message: String },

    /// `--attn` names a backend that does not exist.
    #[error("unsupported attention backend `{name}` (supported: {supported})")]
    UnsupportedAttnBackend { name: String, supported: String },

    /// A compute dtype the device cannot run a model in.
    #[error("compute dtype {dtype} is not supported (expected f32, f16 or bf16)")]
    ComputeDtype { dtype: DType },

    /// A forward batch or KV cache that does not fit the model or itself.
    #[error("invalid batch: {0}")]
    Batch(String),

    /// An op of the kernel runtime failed.
    #[error(transparent)]
    Runtime(#[from] kernel_runtime::Error),

    /// A GGUF file could not be read or interpreted.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),

    /// A collective of tensor parallelism failed (a rank gone, a timeout, a
    /// mismatched call).
    #[error("tp rank {rank}: {op}: {message}")]
    Collective { rank: usize, op: &'static str, message: String },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
        let path = path.into();
        move |source| ModelError::Io { path, source }
    }
}
