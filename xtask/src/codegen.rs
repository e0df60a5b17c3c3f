//! `cargo xtask codegen`: placeholder.
use anyhow::Result;
pub fn run(_check: bool) -> Result<()> { anyhow::bail!("not yet") }
