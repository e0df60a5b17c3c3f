//! The OpenAI-compatible HTTP server (`minisgl serve`).
//!
//! Two halves, joined by channels:
//!
//! - **the engine thread** ([`engine_loop`]) owns the [`Engine`]: it takes
//!   new requests, steps the scheduler and the model, detokenizes, matches
//!   stop strings, and sends each request's text to its handler; it sleeps
//!   on its command channel when there is nothing to run;
//! - **the HTTP side** ([`routes`], axum on a tokio runtime) parses and
//!   validates requests ([`request`], [`fields`]), renders chat templates and
//!   tokenizes, submits the choices and answers with JSON or an SSE stream
//!   ([`generation`], [`response`]). Structured outputs compile a grammar per
//!   choice ([`structured`], [`tools`]); a chat choice's text is split into
//!   reasoning, content and tool calls ([`output`]). Errors are OpenAI's shape ([`error`]); `/metrics` is
//!   Prometheus text ([`metrics`]); `GET /` is a chat page ([`chat_page`]).
//!
//! The log says what the server does: a line per finished request
//! ([`request_log`], on the HTTP side) and, while busy, a periodic load
//! line ([`stats_log`], a task reading [`metrics`]).
//!   Prometheus text ([`metrics`]).
//!   What one client may cost (connections, header timeout, body size,
//!   preparation work, queue slots) is [`limits`]; `--api-key` is [`auth`].
//!
//! A client that disconnects drops its handler's event receiver (with the
//! response future or the SSE body), and the engine thread aborts the
//! request, freeing its KV pages. On SIGINT/SIGTERM the server stops
//! accepting connections, lets requests in flight finish for up to the
//! shutdown timeout (a second signal cuts it short), then aborts the rest
//! (streams end with an error event and `[DONE]`) and returns. If the engine
//! thread dies (a bug), the server shuts down the same way and reports it,
//! rather than keep answering with errors.
//!
//! **Architecture Invariant:** this module is the only user of tokio, axum
//! and the OpenAI JSON types in the engine crate (its text handling is
//! `crate::text`, which the shell shares).

pub mod auth;
pub mod chat_page;
pub mod detokenize;
pub mod engine_loop;
pub mod error;
pub mod events;
pub mod fields;
pub mod generation;
pub mod limits;
pub mod metrics;
pub mod output;
pub mod request;
pub mod request_log;
pub mod response;
pub mod routes;
pub mod state;
pub mod stats_log;
pub mod structured;
pub mod tools;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

pub use error::ApiError;
pub use limits::ServerLimits;
pub use output::OutputParsers;
pub use request::SamplingDefaults;

use crate::core::engine::{Engine, ModelRunner};
use crate::text::chat_template::{ChatTemplate, ModelChatConfig};
use crate::text::tokenizer::Tokenizer;
use metrics::Metrics;
use state::{AppState, ServedModel};

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot listen on the socket")]
    Listen(#[source] std::io::Error),
    #[error("cannot start the engine thread")]
    Thread(#[source] std::io::Error),
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
    #[error("the engine thread panicked")]
    EnginePanicked,
    #[error("the server thread panicked")]
    ServerPanicked,
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
}

/// Server knobs. No `Default`: the command line (or the test) decides.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// The name clients address the model by (the `model` field).
    pub model_name: String,
    /// Other names accepted in the `model` field (e.g. the `--model` path
    /// as typed, which vLLM uses as the name); responses use `model_name`.
    pub model_aliases: Vec<String>,
    /// Sampling defaults for fields a request leaves unset.
    pub defaults: SamplingDefaults,
    /// How long requests in flight may run after a shutdown signal before
    /// they are aborted.
    pub shutdown_timeout: Duration,
    /// When set, every request but `/health` must send
    /// `Authorization: Bearer <key>` (vLLM's `--api-key`, extended to the
    /// tokenizer and cache routes).
    pub api_key: Option<String>,
    /// How often the load line is logged while busy (`None`: never).
    pub stats_interval: Option<Duration>,
    /// With an API key, `/metrics` stays open (for scrapers).
    pub public_metrics: bool,
    /// Connections, bodies, preparation work and the queue.
    pub limits: ServerLimits,
    /// How chat output is split into reasoning and tool calls.
    pub parsers: OutputParsers,
}

/// Sampling defaults for a model folder: OpenAI's, with the sampling fields
/// of its `generation_config.json` (if any) on top, as vLLM does. Prints
/// which fields it took.
pub fn defaults_from_model_dir(dir: &Path) -> Result<SamplingDefaults, ServerError> {
    let mut defaults = SamplingDefaults::openai();
    let path = dir.join("generation_config.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(defaults),
        // A model given as a file (GGUF) has no folder to look in.
        Err(_) if !dir.is_dir() => return Ok(defaults),
        Err(e) => return Err(ServerError::Config { path, reason: e.to_string() }),
    };
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ServerError::Config { path: path.clone(), reason: format!("not valid JSON: {e}") })?;
    let taken = defaults.apply_generation_config(&config);
    if let Some(r) = config.get("repetition_penalty").and_then(serde_json::Value::as_f64).filter(|&r| r != 1.0) {
        tracing::info!(
            "{} sets repetition_penalty = {r}; it is not applied by default \
             (penalties sample on the host); requests may set it",
            path.display()
        );
    }
    if !taken.is_empty() {
        tracing::info!("default sampling parameters from {}: {}", path.display(), taken.join(", "));
    }
    Ok(defaults)
}

/// What ends the server.
enum Trigger {
    /// SIGINT or SIGTERM (a second one aborts requests still draining).
    Signals,
    /// A message from a [`ServerHandle`].
    Manual(oneshot::Receiver<()>),
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Trigger {
    /// Waits for the shutdown request; returns a future of the second one
    /// (which cuts the drain short).
    async fn first(self) -> BoxFuture {
        match self {
            Trigger::Signals => {
                wait_for_signal().await;
                Box::pin(wait_for_signal())
            }
            Trigger::Manual(rx) => {
                let _ = rx.await;
                Box::pin(std::future::pending())
            }
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops the server");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Serves until SIGINT or SIGTERM, then shuts down gracefully and returns.
pub fn serve<R>(
    engine: Engine<R>,
    tokenizer: Tokenizer,
    chat: ModelChatConfig,
    config: ServerConfig,
    listener: std::net::TcpListener,
) -> Result<(), ServerError>
where
    R: ModelRunner + Send + 'static,
{
    run(engine, tokenizer, chat, config, listener, Trigger::Signals)
}

/// A server running on a background thread (tests, embedding). Dropping
/// it shuts the server down and waits for it.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts down gracefully and returns how the server ended.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| ServerError::ServerPanicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Starts a server on `listener` in a background thread.
pub fn start<R>(
    engine: Engine<R>,
    tokenizer: Tokenizer,
    chat: ModelChatConfig,
    config: ServerConfig,
    listener: std::net::TcpListener,
) -> Result<ServerHandle, ServerError>
where
    R: ModelRunner + Send + 'static,
{
    let addr = listener.local_addr().map_err(ServerError::Listen)?;
    let (stop, stop_rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("minisgl-server".to_owned())
        .spawn(move || run(engine, tokenizer, chat, config, listener, Trigger::Manual(stop_rx)))
        .map_err(ServerError::Thread)?;
    Ok(ServerHandle { addr, stop: Some(stop), thread: Some(thread) })
}

fn run<R>(
    engine: Engine<R>,
    tokenizer: Tokenizer,
    chat: ModelChatConfig,
    config: ServerConfig,
    listener: std::net::TcpListener,
    trigger: Trigger,
) -> Result<(), ServerError>
where
    R: ModelRunner + Send + 'static,
{
    let tokenizer = Arc::new(tokenizer);
    let metrics = Arc::new(Metrics::new());
    let template = chat.chat_template.as_deref().map(|source| ChatTemplate::new(source).map_err(|e| e.to_string()));
    if let Some(Err(e)) = &template {
        tracing::warn!("{e}; chat requests will fail (completions work)");
    }
    let (engine, engine_thread) =
        engine_loop::spawn(engine, tokenizer.clone(), metrics.clone()).map_err(ServerError::Thread)?;
    let max_prompt_bytes = limits::max_prompt_bytes(engine.info().max_context_len);
    let grammars = structured::GrammarCompiler::new(&tokenizer, engine.info().vocab_size);
    let state = Arc::new(AppState {
        api_key: config.api_key.as_deref().map(|key| auth::ApiKey::new(key, config.public_metrics)),
        admission: limits::Admission::new(&config.limits),
        limits: config.limits.clone(),
        engine: engine.clone(),
        model: ServedModel {
            name: config.model_name,
            aliases: config.model_aliases,
            tokenizer,
            template,
            special_tokens: chat.special_tokens,
            defaults: config.defaults,
            created: state::unix_now(),
            max_prompt_bytes,
            grammars,
            parsers: config.parsers,
        },
        metrics,
    });
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("minisgl-http")
        .build()
        .map_err(ServerError::Runtime)
        .and_then(|runtime| {
            let result = runtime.block_on(async {
                let stats =
                    config.stats_interval.map(|every| tokio::spawn(stats_log::run(state.metrics.clone(), every)));
                let result = serve_http(listener, state, trigger, config.shutdown_timeout).await;
                if let Some(stats) = stats {
                    stats.abort();
                }
                result
            });
            // Blocking tasks (tokenization) are short; do not hang on one.
            runtime.shutdown_timeout(Duration::from_secs(5));
            result
        });
    engine.shutdown();
    let joined = engine_thread.join();
    result?;
    joined.map_err(|_| ServerError::EnginePanicked)
}

async fn serve_http(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    trigger: Trigger,
    shutdown_timeout: Duration,
) -> Result<(), ServerError> {
    listener.set_nonblocking(true).map_err(ServerError::Listen)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServerError::Listen)?;
    let engine = state.engine.clone();
    let limits = state.limits.clone();
    let app = limits::layer(routes::router(state), &limits);
    let (draining_tx, mut draining_rx) = tokio::sync::watch::channel(false);

    let watched = engine.clone();
    let graceful = async move {
        let second = tokio::select! {
            second = trigger.first() => second,
            () = watched.stopped() => {
                tracing::error!("the engine thread stopped unexpectedly; shutting down");
                Box::pin(std::future::ready(())) as BoxFuture
            }
        };
        tracing::info!(
            "shutting down: no new connections; requests in flight get {}s to finish \
             (press Ctrl-C again to abort them at once)",
            shutdown_timeout.as_secs_f64()
        );
        let _ = draining_tx.send(true);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(shutdown_timeout) => {
                    tracing::warn!("shutdown timeout: aborting the requests still running");
                }
                _ = second => tracing::warn!("second signal: aborting the requests still running"),
            }
            engine.abort_all();
        });
    };
    let server = limits::serve(listener, app, graceful, &limits);
    // After the drain and the abort, connections close within moments; a
    // client that stopped reading must not keep the process alive.
    let deadline = async move {
        while !*draining_rx.borrow_and_update() {
            if draining_rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
        tokio::time::sleep(shutdown_timeout + Duration::from_secs(5)).await;
    };
    tokio::select! {
        result = server => result.map_err(ServerError::Serve),
        () = deadline => {
            tracing::warn!("connections did not close in time; exiting anyway");
            Ok(())
        }
    }
}
