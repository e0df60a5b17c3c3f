//! `minisgl serve`: the OpenAI-compatible HTTP server (see `crate::frontend::server`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::frontend::server::{self, OutputParsers, ServerConfig, ServerLimits};
use crate::text::reasoning::ReasoningFormat;
use crate::text::tool_calls::ToolCallFormat;

/// Arguments of `minisgl serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: super::common::ModelArgs,
    #[command(flatten)]
    pub engine: super::common::EngineArgs,
    #[command(flatten)]
    pub tp: super::tp::TpArgs,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// The name clients use in the `model` field (default: the model's
    /// folder or file name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Seconds requests in flight may run after SIGINT/SIGTERM before they
    /// are aborted (a second signal aborts them at once).
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Require `Authorization: Bearer <key>` on every route but /health
    /// (default: the MINISGL_API_KEY environment variable; none: open).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Seconds between the load lines logged while requests run (0: none).
    #[arg(long, default_value_t = 10.0)]
    pub stats_interval: f64,
    /// With `--model NAME` of a model `minisgl pull` knows, fetch it if it is
    /// not pulled yet.
    #[arg(long)]
    pub pull: bool,
    /// With --api-key, leave /metrics open (for Prometheus scrapers).
    #[arg(long)]
    pub public_metrics: bool,
    /// Largest request body in bytes (refused from Content-Length, unread).
    #[arg(long, default_value_t = ServerLimits::defaults().max_body_bytes)]
    pub max_request_bytes: usize,
    /// Seconds a connection has to send a request head (new or idle).
    #[arg(long, default_value_t = ServerLimits::defaults().header_read_timeout.as_secs_f64())]
    pub header_timeout: f64,
    /// Most open connections; more are closed at once.
    #[arg(long, default_value_t = ServerLimits::defaults().max_connections)]
    pub max_connections: usize,
    /// Most API requests inside the handlers at once; more are answered 503
    /// with Retry-After at once (tower's load shedding; /health and /metrics
    /// are exempt).
    #[arg(long, default_value_t = ServerLimits::defaults().max_concurrent_requests)]
    pub max_concurrent_requests: usize,
    /// Most requests (choices) waiting beyond --max-running-requests; more
    /// are answered 503 with Retry-After.
    #[arg(long, default_value_t = ServerLimits::defaults().max_queued_requests)]
    pub max_queued_requests: usize,
    /// The syntax of the model's tool calls, parsed from `tool_choice: auto`
    /// output: hermes (Qwen2.5, Qwen3), llama3_json, mistral, or none
    /// (default: detected from the chat template and architecture).
    #[arg(long)]
    pub tool_call_parser: Option<String>,
    /// Split the model's reasoning into `reasoning_content`: qwen3 (or
    /// deepseek_r1: `<think>...</think>`), or none (default: detected from
    /// the chat template).
    #[arg(long)]
    pub reasoning_parser: Option<String>,
}

/// The output parsers: what the flags say, else what the model implies.
fn output_parsers(args: &ServeArgs, template: Option<&str>, architecture: &str) -> anyhow::Result<OutputParsers> {
    let detected = OutputParsers::detect(template, architecture);
    let tool_calls = match args.tool_call_parser.as_deref() {
        None => detected.tool_calls,
        Some("none") => None,
        Some(name) => Some(name.parse::<ToolCallFormat>().map_err(|e| anyhow::anyhow!("--tool-call-parser: {e}"))?),
    };
    let reasoning = match args.reasoning_parser.as_deref() {
        None => detected.reasoning,
        Some("none") => None,
        Some(name) => Some(name.parse::<ReasoningFormat>().map_err(|e| anyhow::anyhow!("--reasoning-parser: {e}"))?),
    };
    Ok(OutputParsers { reasoning, tool_calls })
}

/// Binds the port, loads the model, logs what it serves and serves until
/// SIGINT or SIGTERM.
pub fn run(mut args: ServeArgs) -> anyhow::Result<ExitCode> {
    if args.tp.node_rank > 0 {
        // Another node of a multi-node group: its ranks, no server.
        args.model.model = super::common::resolve_model_path(&args.model.model, args.pull)?;
        return super::tp::run_node(&args.model, &args.engine, &args.tp);
    }
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        anyhow::bail!("--shutdown-timeout must be a number of seconds >= 0");
    }
    if !(args.stats_interval.is_finite() && args.stats_interval >= 0.0) {
        anyhow::bail!("--stats-interval must be a number of seconds >= 0");
    }
    if !(args.header_timeout.is_finite() && args.header_timeout > 0.0 && args.header_timeout <= 3600.0) {
        anyhow::bail!("--header-timeout must be a number of seconds in (0, 3600]");
    }
    if args.max_connections == 0 || args.max_request_bytes == 0 || args.max_concurrent_requests == 0 {
        anyhow::bail!("--max-connections, --max-concurrent-requests and --max-request-bytes must be at least 1");
    }
    let limits = ServerLimits {
        max_body_bytes: args.max_request_bytes,
        header_read_timeout: Duration::from_secs_f64(args.header_timeout),
        max_connections: args.max_connections,
        max_concurrent_requests: args.max_concurrent_requests,
        max_queued_requests: args.max_queued_requests,
        max_running_requests: args.engine.max_running_requests,
        ..ServerLimits::defaults()
    };
    let api_key = args.api_key.clone().or_else(|| std::env::var("MINISGL_API_KEY").ok()).filter(|k| !k.is_empty());
    // The port first: a port in use is found in a moment, not after the
    // model has loaded.
    let addr = format!("{}:{}", args.host, args.port);
    let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("cannot read the bound address")?;
    let typed_model = args.model.model.clone();
    args.model.model = super::common::resolve_model_path(&args.model.model, args.pull)?;
    let defaults = server::defaults_from_model_dir(&args.model.model)?;
    let loaded = super::tp::load_model_tp(&args.model, &args.engine, &args.tp)?;
    let parsers = output_parsers(&args, loaded.chat.chat_template.as_deref(), &loaded.summary.architecture)?;
    tracing::info!(
        "output parsers: tool calls {}, reasoning {}",
        parsers.tool_calls.map_or("none".to_owned(), |f| format!("{f:?}")),
        parsers.reasoning.map_or("none".to_owned(), |f| format!("{f:?}"))
    );
    // Without --served-model-name, clients may also use the path as typed
    // (vLLM's name for it).
    let model_aliases = match &args.served_model_name {
        Some(_) => Vec::new(),
        None => {
            let mut aliases = vec![args.model.model.display().to_string()];
            if typed_model != args.model.model {
                aliases.push(typed_model.display().to_string());
            }
            aliases
        }
    };
    let model_name = args.served_model_name.unwrap_or(loaded.name);
    log_summary(&loaded.summary, &model_name, local);
    server::serve(
        loaded.engine,
        loaded.tokenizer,
        loaded.chat,
        ServerConfig {
            model_name,
            model_aliases,
            defaults,
            shutdown_timeout: Duration::from_secs_f64(args.shutdown_timeout),
            api_key,
            stats_interval: (args.stats_interval > 0.0).then(|| Duration::from_secs_f64(args.stats_interval)),
            public_metrics: args.public_metrics,
            limits,
            parsers,
        },
        listener,
    )?;
    tracing::info!("server stopped");
    Ok(ExitCode::SUCCESS)
}

/// The startup summary: what is served, on what, with how much KV cache, and
/// where to reach it.
fn log_summary(s: &super::common::ModelSummary, model_name: &str, local: std::net::SocketAddr) {
    tracing::info!("model: {} ({}), served as `{model_name}`", s.path.display(), s.architecture);
    tracing::info!("device: {}, dtype: {}, kernels: {}", s.device, s.dtype, s.kernels);
    tracing::info!(
        "KV cache: {} pages x {} tokens = {} tokens; context length {} tokens",
        s.num_pages,
        s.page_size,
        s.kv_tokens(),
        s.max_context_len
    );
    tracing::info!(
        "serving on http://{local} (chat page: http://{local}/, OpenAI API: http://{local}/v1, Ctrl-C stops)"
    );
}
