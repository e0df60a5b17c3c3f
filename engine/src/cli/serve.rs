//! `minisgl serve`: placeholder (owned by the server work).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `minisgl serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
    #[command(flatten)]
    pub engine: super::common::EngineArgs,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
}

/// Runs the command.
pub fn run(_args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
