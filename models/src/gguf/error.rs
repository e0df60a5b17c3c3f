//! The one error type of the GGUF module.
//!
//! Every variant names the file, and the key or tensor where there is one, so
//! that a broken download or an unsupported checkpoint is diagnosed from the
//! message alone.

use std::path::PathBuf;

use super::quant::GgmlType;

/// Result of every fallible GGUF operation.
pub type Result<T> = std::result::Result<T, GgufError>;

/// What went wrong while reading, interpreting or converting a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    #[error("{}: not a GGUF file (magic bytes {found:02x?}, expected \"GGUF\")", path.display())]
    BadMagic { path: PathBuf, found: [u8; 4] },

    #[error("{}: big-endian GGUF (version {version} byte-swapped) is not supported", path.display())]
    BigEndian { path: PathBuf, version: u32 },

    #[error("{}: GGUF version {version} is not supported (only versions 2 and 3)", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },

    #[error("{}: truncated file: {what} needs {needed} bytes at offset {offset}, but the file has {file_len}", path.display())]
    Truncated { path: PathBuf, what: String, offset: u64, needed: u64, file_len: u64 },

    #[error("{}: {what}: the header would exceed {limit} bytes (corrupt length or count)", path.display())]
    HeaderTooLarge { path: PathBuf, what: String, limit: u64 },

    #[error("{}: {what}: count {count} cannot fit in the file ({reason}; truncated or corrupt)", path.display())]
    AbsurdCount { path: PathBuf, what: String, count: u64, reason: String },

    #[error("{}: {what} is not valid UTF-8", path.display())]
    InvalidUtf8 { path: PathBuf, what: String },

    #[error("{}: {what}: unknown metadata value type {type_id}", path.display())]
    UnknownValueType { path: PathBuf, what: String, type_id: u32 },

    #[error("{}: metadata key `{key}`: {reason}", path.display())]
    InvalidMetadata { path: PathBuf, key: String, reason: String },

    #[error("{}: duplicate metadata key `{key}`", path.display())]
    DuplicateKey { path: PathBuf, key: String },

    #[error("{}: missing metadata key `{key}`", path.display())]
    MissingKey { path: PathBuf, key: String },

    #[error("{}: metadata key `{key}`: expected {expected}, found {found}", path.display())]
    MetadataType { path: PathBuf, key: String, expected: &'static str, found: String },

    #[error("{}: duplicate tensor `{tensor}`", path.display())]
    DuplicateTensor { path: PathBuf, tensor: String },

    #[error("{}: tensor `{tensor}`: unknown ggml type id {type_id}", path.display())]
    UnknownGgmlType { path: PathBuf, tensor: String, type_id: u32 },

    #[error("{}: tensor `{tensor}`: dequantising {ggml_type} is not supported (supported: {supported})", path.display())]
    UnsupportedGgmlType { path: PathBuf, tensor: String, ggml_type: GgmlType, supported: String },

    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    InvalidTensor { path: PathBuf, tensor: String, reason: String },

    #[error("{}: tensor `{tensor}`: data [{start}, {end}) extends past the end of the file ({file_len} bytes)", path.display())]
    TensorOutOfBounds { path: PathBuf, tensor: String, start: u64, end: u64, file_len: u64 },

    #[error("{}: no tensor named `{tensor}`", path.display())]
    MissingTensor { path: PathBuf, tensor: String },

    #[error("{}: unsupported architecture `{arch}` (supported: {})", path.display(), supported.join(", "))]
    UnsupportedArchitecture { path: PathBuf, arch: String, supported: Vec<&'static str> },

    #[error("{}: {reason}", path.display())]
    InvalidConfig { path: PathBuf, reason: String },
}
