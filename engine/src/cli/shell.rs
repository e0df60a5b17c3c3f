//! `minisgl shell`: placeholder (owned by the server work).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `minisgl shell`.
#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
}

/// Runs the command.
pub fn run(_args: ShellArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
