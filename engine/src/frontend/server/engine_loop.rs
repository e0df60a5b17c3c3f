//! The engine thread: the one place the [`Engine`] lives while serving.
//!
//! The engine is not shared: one dedicated OS thread owns it and loops
//!
//! 1. wait for commands if there is nothing to run (blocking on the
//!    channel, so an idle server uses no CPU), then drain every queued
//!    command: new requests, cache flushes, abort-all, shutdown; and end the
//!    requests the detokenizer stopped;
//! 2. abort the requests whose client went away: a handler's event
//!    receiver is dropped with its response future or its SSE body, which
//!    the thread sees as a closed channel ([`UnboundedSender::is_closed`]);
//! 3. run one [`Engine::step`] and hand each token to the detokenizer thread;
//! 4. publish the engine's load to [`Metrics`].
//!
//! Detokenization, stop strings and event routing run on the detokenizer
//! thread (`detokenize`), so that the step rate does not depend on the number
//! of streams. A matched stop string comes back as the request's id and ends it
//! with [`Engine::finish`] before the next step that can see it; the tokens
//! computed in between are dropped by the detokenizer.
//!
//! Handlers talk to the thread through an [`EngineHandle`] (a std channel
//! of [`Command`]s) and get a per-request stream of [`Event`]s back on an
//! unbounded tokio channel, so the engine never waits on a slow client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, Notify};

use super::detokenize::{DetokMsg, DetokRequest, Detokenizer};
use super::error::ApiError;
pub use super::events::{Event, Finished, TokenLogprob};
use super::metrics::Metrics;
use crate::core::engine::{Engine, EngineError, GenerateRequest, LengthLimit, ModelRunner};
use crate::core::grammar::Grammar;
use crate::core::req::{FinishReason, ReqId, SamplingParams, TokenEvent};
use crate::text::text_stream::TextStream;
use crate::text::tokenizer::{StopStrings, Tokenizer};

/// A request for the engine thread.
#[derive(Debug)]
pub struct Submission {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// Stop strings, cut from the output (compiled once per request).
    pub stop: StopStrings,
    pub skip_special_tokens: bool,
    /// `max_tokens` is the server's default (the client set none): shrink
    /// it to what the KV pool can hold instead of rejecting the request.
    pub fit_max_tokens: bool,
    /// When the handler received the request (for time to first token).
    pub arrival: Instant,
    pub events: UnboundedSender<Event>,
    /// The grammar the output must follow (structured outputs).
    pub grammar: Option<Grammar>,
}

/// Messages to the engine thread.
#[derive(Debug)]
pub enum Command {
    Submit(Box<Submission>),
    /// Drop the prefix cache's unused pages; answers `true` when done.
    FlushCache(oneshot::Sender<bool>),
    /// Cancel every request in flight (their handlers get
    /// [`ApiError::ShuttingDown`]); used when draining takes too long.
    AbortAll,
    /// Cancel everything and end the thread.
    Shutdown,
}

/// Facts about the served engine that handlers need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// The model's context length (prompt plus outputs).
    pub max_context_len: usize,
    /// The model's logits width (token ids are below it).
    pub vocab_size: usize,
}

/// A cheap, cloneable handle to the engine thread.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    alive: Arc<AtomicBool>,
    /// Notified once when the thread ends.
    stopped: Arc<Notify>,
    info: EngineInfo,
}

impl EngineHandle {
    pub fn info(&self) -> EngineInfo {
        self.info
    }

    /// Whether the engine thread is still running (it stops on shutdown, or
    /// if it panicked).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Resolves when the engine thread has ended. For one waiter (the
    /// server, which shuts down when the engine dies under it).
    pub async fn stopped(&self) {
        while self.is_alive() {
            self.stopped.notified().await;
        }
    }

    pub fn submit(&self, submission: Submission) -> Result<(), ApiError> {
        self.commands.send(Command::Submit(Box::new(submission))).map_err(|_| ApiError::ShuttingDown)
    }

    /// Flushes the prefix cache; `false` if the engine is gone.
    pub async fn flush_cache(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::FlushCache(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    pub fn abort_all(&self) {
        // A closed channel means the thread is gone: nothing left to abort.
        let _ = self.commands.send(Command::AbortAll);
    }

    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }
}

/// Starts the engine thread.
pub fn spawn<R>(
    engine: Engine<R>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
) -> std::io::Result<(EngineHandle, JoinHandle<()>)>
where
    R: ModelRunner + Send + 'static,
{
    let info =
        EngineInfo { max_context_len: engine.runner().max_context_len(), vocab_size: engine.runner().vocab_size() };
    let (tx, rx) = mpsc::channel();
    let alive = Arc::new(AtomicBool::new(true));
    let stopped = Arc::new(Notify::new());
    metrics.publish_engine(engine.stats());
    let (detok_tx, detok_rx) = mpsc::channel();
    let (ended_tx, ended_rx) = mpsc::channel();
    let detokenizer = Detokenizer::new(tokenizer, metrics.clone(), ended_tx);
    let detok_thread =
        std::thread::Builder::new().name("minisgl-detok".to_owned()).spawn(move || detokenizer.run(detok_rx))?;
    let state = EngineLoop {
        engine,
        metrics,
        commands: rx,
        ended: ended_rx,
        detok: detok_tx,
        detok_thread: Some(detok_thread),
        active: HashMap::new(),
    };
    let guard = AliveGuard { alive: alive.clone(), stopped: stopped.clone() };
    let thread = std::thread::Builder::new().name("minisgl-engine".to_owned()).spawn(move || {
        let _guard = guard;
        state.run();
    })?;
    Ok((EngineHandle { commands: tx, alive, stopped, info }, thread))
}

/// Clears the alive flag and wakes the server when the thread ends, by
/// return or by panic.
struct AliveGuard {
    alive: Arc<AtomicBool>,
    stopped: Arc<Notify>,
}

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
        // `notify_one` keeps a permit if nobody waits yet.
        self.stopped.notify_one();
    }
}

/// A request the engine is running (its output state is the detokenizer's).
struct Active {
    events: UnboundedSender<Event>,
    /// Prompt tokens served from the prefix cache, once admitted.
    cached_tokens: Option<usize>,
}

struct EngineLoop<R> {
    engine: Engine<R>,
    metrics: Arc<Metrics>,
    commands: mpsc::Receiver<Command>,
    /// Requests the detokenizer ended (stop strings, bad output).
    ended: mpsc::Receiver<ReqId>,
    detok: mpsc::Sender<DetokMsg>,
    detok_thread: Option<JoinHandle<()>>,
    active: HashMap<ReqId, Active>,
}

/// What to do after a command.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl<R: ModelRunner> EngineLoop<R> {
    fn run(mut self) {
        loop {
            if self.receive_commands() == Flow::Stop {
                break;
            }
            self.end_stopped();
            self.reap_disconnected();
            if self.engine.has_work() {
                let steps_before = self.engine.stats().num_steps;
                self.step();
                if self.engine.has_work() && self.engine.stats().num_steps == steps_before {
                    // NOTE: the scheduler always finds work for a queued
                    // request (the engine rejects what could never fit), so
                    // this is a safety net against spinning, not a path.
                    match self.commands.recv_timeout(Duration::from_millis(5)) {
                        Ok(cmd) => {
                            if self.handle(cmd) == Flow::Stop {
                                break;
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            } else if !self.active.is_empty() {
                // The engine lost track of requests it was running: a bug,
                // but their clients must not wait forever.
                self.fail_all(ApiError::Internal("the engine dropped the request".into()));
            }
            self.metrics.publish_engine(self.engine.stats());
        }
        self.fail_all(ApiError::ShuttingDown);
        self.metrics.publish_engine(self.engine.stats());
        // Hang up on the detokenizer and let it deliver what it holds.
        let (hangup, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.detok, hangup));
        if let Some(t) = self.detok_thread.take() {
            let _ = t.join();
        }
    }

    /// Ends the requests the detokenizer stopped; their events are its business.
    fn end_stopped(&mut self) {
        while let Ok(id) = self.ended.try_recv() {
            if self.active.remove(&id).is_some() {
                self.engine.finish(id, FinishReason::Stop);
            }
        }
    }

    /// Blocks for a command when idle, then drains the queue.
    fn receive_commands(&mut self) -> Flow {
        if !self.engine.has_work() {
            match self.commands.recv() {
                Ok(cmd) => {
                    if self.handle(cmd) == Flow::Stop {
                        return Flow::Stop;
                    }
                }
                Err(_) => return Flow::Stop,
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => {
                    if self.handle(cmd) == Flow::Stop {
                        return Flow::Stop;
                    }
                }
                Err(TryRecvError::Empty) => return Flow::Continue,
                // Every handle is gone: nobody can submit or read anymore.
                Err(TryRecvError::Disconnected) => return Flow::Stop,
            }
        }
    }

    fn handle(&mut self, cmd: Command) -> Flow {
        match cmd {
            Command::Submit(sub) => self.submit(*sub),
            Command::FlushCache(reply) => {
                self.engine.flush_cache();
                let _ = reply.send(true);
            }
            Command::AbortAll => self.fail_all(ApiError::ShuttingDown),
            Command::Shutdown => return Flow::Stop,
        }
        Flow::Continue
    }

    fn submit(&mut self, sub: Submission) {
        if sub.events.is_closed() {
            return; // The client left while the request was in the channel.
        }
        let prompt_tokens = sub.prompt_ids.len();
        let mut request = GenerateRequest { prompt_ids: sub.prompt_ids, params: sub.params };
        let mut result = self.engine.add_request(request.clone());
        if let Err(EngineError::TooLong { limit: LengthLimit::KvPool, limit_tokens, .. }) = result {
            // The default `max_tokens` fills the context; the pool may hold
            // less. The last output needs no KV slot, hence the + 1.
            let fits = (limit_tokens + 1).saturating_sub(prompt_tokens);
            if sub.fit_max_tokens && fits >= 1 {
                request.params.max_tokens = fits;
                result = self.engine.add_request(request.clone());
            }
        }
        match result {
            Ok(id) => {
                if let Some(grammar) = sub.grammar {
                    self.engine.set_grammar(id, grammar);
                }
                let _ = sub.events.send(Event::Accepted { max_tokens: request.params.max_tokens });
                let detok = DetokRequest {
                    id,
                    events: sub.events.clone(),
                    text: TextStream::new(sub.stop, sub.skip_special_tokens),
                    arrival: sub.arrival,
                    prompt_tokens,
                };
                if self.detok.send(DetokMsg::Start(Box::new(detok))).is_err() {
                    self.engine.abort(id);
                    let _ = sub.events.send(Event::Failed(ApiError::ShuttingDown));
                    return;
                }
                self.active.insert(id, Active { events: sub.events, cached_tokens: None });
            }
            Err(err) => {
                let _ = sub.events.send(Event::Rejected(err));
            }
        }
    }

    /// Aborts the requests whose handler is gone (client disconnected).
    fn reap_disconnected(&mut self) {
        let gone: Vec<ReqId> = self.active.iter().filter(|(_, a)| a.events.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            self.active.remove(&id);
            self.engine.abort(id);
            let _ = self.detok.send(DetokMsg::End { id, error: None });
        }
    }

    fn step(&mut self) {
        let (started, steps_before) = (Instant::now(), self.engine.stats().num_steps);
        let result = self.engine.step();
        let stats = self.engine.stats();
        if stats.num_steps > steps_before {
            self.metrics.record_step(started.elapsed(), stats.last_step_rows);
        }
        match result {
            Ok(events) => {
                for event in events {
                    self.route(event);
                }
            }
            Err(err) => {
                tracing::error!("engine step failed, failing every request in flight: {}", error_chain(&err));
                self.fail_all(ApiError::Internal(format!("model execution failed: {err}")));
            }
        }
    }

    /// Hands one generated token to the detokenizer.
    fn route(&mut self, event: TokenEvent) {
        let Some(active) = self.active.get_mut(&event.id) else {
            // Ended by the detokenizer (a stop string) after this step was
            // scheduled, or unknown: make sure the engine lets it go.
            if event.finished.is_none() {
                self.engine.abort(event.id);
            }
            return;
        };
        let cached_tokens = match (&event.finished, active.cached_tokens) {
            (Some(f), _) => f.cached_tokens,
            (None, Some(c)) => c,
            (None, None) => {
                let c = self.engine.cached_tokens(event.id).unwrap_or(0);
                active.cached_tokens = Some(c);
                c
            }
        };
        let id = event.id;
        if event.finished.is_some() {
            self.active.remove(&id);
        }
        if self.detok.send(DetokMsg::Token { event, cached_tokens }).is_err() {
            // The detokenizer is gone (it panicked): nobody can be served.
            self.engine.abort(id);
            self.active.remove(&id);
        }
    }

    /// Aborts every request in flight and tells each handler why.
    fn fail_all(&mut self, err: ApiError) {
        for (id, active) in self.active.drain() {
            self.engine.abort(id);
            if self.detok.send(DetokMsg::End { id, error: Some(err.clone()) }).is_err() {
                let _ = active.events.send(Event::Failed(err.clone()));
            }
        }
    }
}

/// An error with its sources, `a: b: c`.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A receiver of one request's events (what handlers hold).
pub type EventReceiver = UnboundedReceiver<Event>;
