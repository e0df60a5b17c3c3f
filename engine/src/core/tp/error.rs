//! The one error type of tensor-parallel start-up and steps: every message
//! names the rank it is about and what went wrong.

use crate::core::tp::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum TpError {
    /// Start-up failed (a rank that never joined, arguments that differ, ...).
    #[error("{0}")]
    Startup(String),
    /// The control channel to or from `rank` failed.
    #[error("tp rank {rank}: control channel: {source}")]
    Channel { rank: usize, source: WireError },
    /// Rank `rank` reported a failure.
    #[error("tp rank {rank} failed: {message}")]
    Worker { rank: usize, message: String },
    #[error(transparent)]
    Model(#[from] models::ModelError),
    #[error("{0}")]
    Runner(String),
}

impl TpError {
    /// A closure mapping a [`WireError`] on `rank`'s channel.
    pub fn channel(rank: usize) -> impl Fn(WireError) -> TpError {
        move |source| TpError::Channel { rank, source }
    }
}
