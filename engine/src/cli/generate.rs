//! `minisgl generate`: placeholder (wired with the engine runner).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `minisgl generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
}

/// Runs the command.
pub fn run(_args: GenerateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
