//! Tensor parallelism across processes: one process per rank (per GPU), rank
//! 0 with the scheduler, the others running the same steps.
//!
//! | module | what |
//! | --- | --- |
//! | [`wire`] | the control channel's frames: length-prefixed, versioned, bounded |
//! | [`protocol`] | its messages: hello, welcome/reject, start, ready/failed, step, wait, shutdown |
//! | [`rendezvous`] | rank 0 waits for every rank and checks their arguments; a worker joins |
//! | [`leader`] | rank 0: the group's collectives, [`TpRunner`] (the engine's runner), the watchers |
//! | [`worker`] | ranks 1..N: join, load the shard, make every runner call rank 0 makes |
//! | [`error`] | [`TpError`] |
//!
//! The models split themselves (`models::tp`); this module only moves steps:
//! tensors never go through the control channel.

pub mod error;
pub mod leader;
pub mod protocol;
pub mod rendezvous;
pub mod wire;
pub mod worker;

pub use error::TpError;
pub use leader::TpRunner;
