//! `minisgl shell`: chat with a model in the terminal (see `crate::frontend::shell`).

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::core::req::SamplingParams;
use crate::frontend::shell::{Shell, ShellConfig};

/// Arguments of `minisgl shell`.
#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
    #[command(flatten)]
    pub engine: super::common::EngineArgs,
    /// Most tokens per reply (capped by the room left in the context).
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 (the default) is greedy, so replies are
    /// reproducible.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// A system message before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// With `--model NAME` of a model `minisgl pull` knows, fetch it if it is
    /// not pulled yet.
    #[arg(long)]
    pub pull: bool,
}

/// Loads the model and chats over stdin/stdout until `/exit` or EOF.
pub fn run(mut args: ShellArgs) -> anyhow::Result<ExitCode> {
    args.model.model = super::common::resolve_model_path(&args.model.model, args.pull)?;
    if args.max_tokens == 0 {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        anyhow::bail!("--temperature must be >= 0");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        anyhow::bail!("--top-p must be in (0, 1]");
    }
    if args.top_k == Some(0) {
        anyhow::bail!("--top-k must be at least 1");
    }
    let loaded = super::common::load_model(&args.model, &args.engine)?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        ..SamplingParams::greedy(args.max_tokens)
    };
    let mut shell =
        Shell::new(loaded.engine, loaded.tokenizer, loaded.chat, ShellConfig { params, system: args.system })?;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        // Ctrl-C during a reply reaches us as SIGINT (at the prompt, rustyline
        // reads it as a key): stop the reply instead of the process.
        // Installed after the editor, whose own SIGINT handler it replaces.
        let mut editor = rustyline::DefaultEditor::new().context("opening the terminal")?;
        let flag = shell.interrupt_flag();
        ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
        shell.run_terminal(&mut editor, &mut std::io::stdout().lock(), &mut std::io::stderr().lock())?;
    } else {
        shell.run(&mut stdin.lock(), &mut std::io::stdout().lock(), &mut std::io::stderr().lock(), false)?;
    }
    Ok(ExitCode::SUCCESS)
}
