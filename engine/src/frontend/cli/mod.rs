//! The `minisgl` subcommands.
//!
//! | command | module | what |
//! | --- | --- | --- |
//! | `serve` | [`serve`] | OpenAI-compatible HTTP server |
//! | `generate` | [`generate`] | offline generation: one prompt, a file of prompts, or random ids |
//! | `bench` | [`bench`] | the mini-sglang offline throughput benchmark |
//! | `shell` | [`shell`] | interactive chat in the terminal |
//! | `render-template` | [`render_template`] | render a chat template, for debugging it |
//! | `pull` | [`pull`] | fetch a demo model (SmolLM2) into the local cache, on request |
//! | `tp-worker` (hidden) | [`tp`] | one worker rank of `--tp N` (started by the command that serves) |
//!
//! Options shared by the commands that load a model live in [`common`].

pub mod bench;
pub mod common;
pub mod generate;
pub mod logging;
pub mod pull;
pub mod render_template;
pub mod serve;
pub mod shell;
pub mod tp;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line. `about` is written out, not taken from the crate's
/// description (which describes the crate to its developers).
#[derive(Parser, Debug)]
#[command(
    name = "minisgl",
    version,
    about = "Serve and run LLMs (LLaMA, Qwen, Mistral; safetensors or GGUF) on an NVIDIA GPU or the CPU",
    long_about = None,
    after_help = "Quick start: `minisgl serve --model smollm2` (after `minisgl pull smollm2`), then open http://127.0.0.1:30000/"
)]
pub struct Cli {
    /// Log filter: error, warn, info (default), debug, trace, or RUST_LOG-style
    /// directives (default: the RUST_LOG environment variable, else info).
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve a model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Generate text offline (greedy by default).
    Generate(generate::GenerateArgs),
    /// Run the offline throughput benchmark.
    Bench(bench::BenchArgs),
    /// Chat with a model in the terminal.
    Shell(shell::ShellArgs),
    /// Render a chat template with a conversation and print the prompt.
    RenderTemplate(render_template::RenderTemplateArgs),
    /// Download a known model (smollm2) into the local cache and print its path; --list names them.
    Pull(pull::PullArgs),
    /// One worker rank of a `--tp N` group (started by serve/generate/bench).
    #[command(hide = true)]
    TpWorker(tp::TpWorkerArgs),
}

/// Parses the command line, runs the command and maps errors to exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(cli.log_level.as_deref()) {
        eprintln!("minisgl: error: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Shell(a) => shell::run(a),
        Command::RenderTemplate(a) => render_template::run(a),
        Command::Pull(a) => pull::run(a),
        Command::TpWorker(a) => tp::run_worker_command(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("minisgl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
