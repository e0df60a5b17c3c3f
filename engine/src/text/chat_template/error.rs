//! [`ChatTemplateError`], kept apart from `mod.rs` so that `hf.rs` (which
//! `mod.rs` re-exports) does not import it back.

use std::path::PathBuf;

/// Why a chat template could not be loaded, compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`, typically to reject a
    /// conversation it does not support (e.g. a system message).
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
    #[error("invalid chat messages: {0}")]
    InvalidMessages(String),
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
}
