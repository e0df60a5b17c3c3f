//! `cargo xtask gpu-bundle`: placeholder.
use anyhow::Result;
pub fn run(_out: std::path::PathBuf) -> Result<()> { anyhow::bail!("not yet") }
