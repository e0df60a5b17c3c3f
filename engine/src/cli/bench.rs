//! `minisgl bench`: placeholder (wired with the engine runner).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `minisgl bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
}

/// Runs the command.
pub fn run(_args: BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
