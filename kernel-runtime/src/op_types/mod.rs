//! The argument and plan types that `ops` hands to its two implementations,
//! `cpu` and `gpu`.
//!
//! They live below all three, so that the implementations never import the
//! dispatching layer that calls them; `ops` re-exports them for users.

pub mod attention;
pub mod fused;
pub mod moe;
pub mod sampling;
