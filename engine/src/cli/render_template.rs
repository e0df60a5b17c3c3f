//! `minisgl render-template`: placeholder (owned by the server work).

use std::process::ExitCode;

use clap::Args;

/// Arguments of `minisgl render-template`.
#[derive(Args, Debug)]
pub struct RenderTemplateArgs {
    /// The template file (.jinja), or a tokenizer_config.json / model folder.
    #[arg(long)]
    pub template: std::path::PathBuf,
}

/// Runs the command.
pub fn run(_args: RenderTemplateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
