//! Running a generation request: submit its choices, then answer with one
//! JSON body or an SSE stream.
//!
//! A request has one prompt (chat), or one or several (completions: a batch),
//! and asks for `n` choices of each; choice `p * n + j` is prompt `p`'s `j`-th,
//! as in OpenAI's API. Every choice is its own engine request (the prefix
//! cache shares the prompt's pages among them); with a `seed`, choice `j` draws
//! with `seed + j`, so the choices differ and the whole answer reproduces.
//!
//! A chat request with tools or a reasoning parser has an
//! [`OutputPlan`]: each choice's text goes through a [`ChoiceOutput`], which
//! splits it into reasoning, content and tool calls (whole in a body, as
//! deltas in a stream). A request with a grammar (structured outputs) hands
//! each choice its own compiled [`Grammar`].
//!
//! `usage` counts each prompt once and every choice's completion tokens. If
//! one choice fails, the request fails: the other choices' event receivers
//! are dropped with it, which aborts them in the engine.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, SelectAll, StreamExt};
use serde_json::Value as Json;
use tokio::sync::mpsc::unbounded_channel;

use super::engine_loop::{Event, EventReceiver, Finished, Submission, TokenLogprob};
use super::error::ApiError;
use super::limits::Slots;
use super::output::{ChoiceOutput, OutputDelta, OutputPlan};
use super::request::{Sampling, StreamOptions};
use super::request_log::RequestLog;
use super::response::{
    chat_logprobs, completion_logprobs, finish_reason_str, to_json, tool_call_json, ChatChoice, ChatCompletion,
    ChatMessage, ChunkWriter, Completion, CompletionChoice, Usage,
};
use super::state::{json_response, unix_now, AppState};
use crate::core::grammar::Grammar;
use crate::core::req::FinishReason;
use crate::text::tokenizer::StopStrings;

/// One prompt of a job, tokenized.
pub struct JobPrompt {
    pub ids: Vec<u32>,
    /// Prompt text to send before the completion (`echo`).
    pub echo: Option<String>,
    /// `max_tokens` when the request sets none.
    pub default_max_tokens: usize,
}

/// A generation request, ready for the engine.
pub struct Job {
    pub prompts: Vec<JobPrompt>,
    pub sampling: Sampling,
    pub stream: StreamOptions,
    pub chat: bool,
    /// `messages` or `prompt`, for error messages.
    pub prompt_field: &'static str,
    pub arrival: Instant,
    /// One grammar per choice (prompt-major, like the choices), or none.
    pub grammars: Vec<Grammar>,
    /// How chat output is split (`None`: all content).
    pub output: Option<OutputPlan>,
}

/// One submitted choice.
struct Choice {
    index: u32,
    prompt: usize,
    rx: EventReceiver,
    /// Set once the engine accepted it (a refused choice logs nothing).
    log: Option<RequestLog>,
}

/// Submits every choice of `job` and answers with the whole completion or a
/// stream.
pub async fn generate(state: &Arc<AppState>, mut job: Job) -> Result<Response, ApiError> {
    let n = job.sampling.n.max(1);
    let mut grammars = std::mem::take(&mut job.grammars).into_iter();
    // Every choice holds a queue slot until its response ends (the stream
    // or the body owns them), or the request is refused with 503 now.
    let slots = state.admission.admit(job.prompts.len() * n)?;
    // One automaton for the request's stop strings, shared by its choices.
    let stop = StopStrings::new(&job.sampling.stop).map_err(|e| ApiError::invalid_value("stop", e.to_string()))?;
    let mut choices = Vec::with_capacity(job.prompts.len() * n);
    for (p, prompt) in job.prompts.iter().enumerate() {
        for j in 0..n {
            let mut params = job.sampling.to_params(&state.model.defaults, prompt.default_max_tokens);
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            let (tx, rx) = unbounded_channel();
            state.engine.submit(Submission {
                prompt_ids: prompt.ids.clone(),
                params,
                stop: stop.clone(),
                skip_special_tokens: job.sampling.skip_special_tokens,
                fit_max_tokens: job.sampling.max_tokens.is_none(),
                arrival: job.arrival,
                events: tx,
                grammar: grammars.next(),
            })?;
            choices.push(Choice { index: (p * n + j) as u32, prompt: p, rx, log: None });
        }
    }
    let id = if job.chat {
        format!("chatcmpl-{:032x}", rand::random::<u128>())
    } else {
        format!("cmpl-{:032x}", rand::random::<u128>())
    };
    let several = choices.len() > 1;
    for choice in &mut choices {
        await_acceptance(&mut choice.rx, &job).await?;
        let log_id = if several { format!("{id}-{}", choice.index) } else { id.clone() };
        let prompt_tokens = job.prompts[choice.prompt].ids.len();
        choice.log = Some(RequestLog::new(log_id, prompt_tokens, job.arrival, state.metrics.clone()));
    }
    let writer = ChunkWriter { id, created: unix_now(), model: state.model.name.clone(), chat: job.chat };
    if job.stream.stream {
        Ok(stream_response(choices, &job, writer, slots))
    } else {
        let response = full_response(choices, &job, &writer).await;
        drop(slots);
        response
    }
}

/// Waits for the engine to queue a choice (or say why it will not).
async fn await_acceptance(rx: &mut EventReceiver, job: &Job) -> Result<(), ApiError> {
    match rx.recv().await {
        Some(Event::Accepted { .. }) => Ok(()),
        Some(Event::Rejected(err)) => {
            Err(ApiError::from_engine(&err, job.prompt_field, job.sampling.max_tokens.map(|(_, field)| field)))
        }
        Some(Event::Failed(err)) => Err(err),
        Some(other) => Err(ApiError::Internal(format!("unexpected engine event before acceptance: {other:?}"))),
        None => Err(ApiError::ShuttingDown),
    }
}

/// The whole output of one choice.
struct Collected {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finished: Finished,
}

/// Waits for the whole output of a non-streaming choice.
async fn collect(mut rx: EventReceiver, mut log: Option<RequestLog>) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let output = |log: &mut Option<RequestLog>| log.as_mut().map(RequestLog::on_output);
    loop {
        match rx.recv().await {
            Some(Event::Text(piece)) => {
                output(&mut log);
                text.push_str(&piece)
            }
            Some(Event::Logprobs(lp)) => {
                output(&mut log);
                logprobs.push(lp)
            }
            Some(Event::Finished(finished)) => {
                if let Some(log) = &mut log {
                    log.finish(&finished);
                }
                text.push_str(&finished.text);
                return Ok(Collected { text, logprobs, finished });
            }
            Some(Event::Failed(err)) => {
                if let Some(log) = &mut log {
                    log.fail(&err.to_string());
                }
                return Err(err);
            }
            Some(Event::Accepted { .. } | Event::Rejected(_)) => {}
            None => {
                if let Some(log) = &mut log {
                    log.fail("the engine stopped");
                }
                return Err(ApiError::Internal("the engine stopped".into()));
            }
        }
    }
}

/// Adds up `usage` over the choices: each prompt once, every completion.
#[derive(Default)]
struct UsageSum {
    prompt_counted: Vec<bool>,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

impl UsageSum {
    fn new(num_prompts: usize) -> Self {
        Self { prompt_counted: vec![false; num_prompts], ..Self::default() }
    }

    fn add(&mut self, prompt: usize, f: &Finished) {
        if let Some(counted) = self.prompt_counted.get_mut(prompt).filter(|c| !**c) {
            *counted = true;
            self.prompt_tokens += f.prompt_tokens;
            self.cached_tokens += f.cached_tokens;
        }
        self.completion_tokens += f.completion_tokens;
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
    }
}

/// The log probabilities of `tokens` in the API's shape for chat or
/// completions (offsets counted from `text_offset`), or `null` when the
/// request did not ask for them.
fn logprobs_json(wanted: bool, chat: bool, tokens: &[TokenLogprob], text_offset: usize) -> Option<Json> {
    wanted.then(|| if chat { chat_logprobs(tokens) } else { completion_logprobs(tokens, text_offset) })
}

async fn full_response(choices: Vec<Choice>, job: &Job, writer: &ChunkWriter) -> Result<Response, ApiError> {
    let meta: Vec<(u32, usize)> = choices.iter().map(|c| (c.index, c.prompt)).collect();
    let outputs = futures::future::try_join_all(choices.into_iter().map(|c| collect(c.rx, c.log))).await?;
    let mut usage = UsageSum::new(job.prompts.len());
    for (&(_, prompt), out) in meta.iter().zip(&outputs) {
        usage.add(prompt, &out.finished);
    }
    let usage = usage.usage();
    let body = if job.chat {
        let split: Vec<Option<SplitOutput>> =
            outputs.iter().map(|out| job.output.as_ref().map(|plan| SplitOutput::of(plan, &out.text))).collect();
        let choices = meta
            .iter()
            .zip(&outputs)
            .zip(&split)
            .map(|((&(index, _), out), split)| {
                let message = match split {
                    None => ChatMessage {
                        role: "assistant",
                        content: Some(&out.text),
                        reasoning_content: None,
                        refusal: None,
                        tool_calls: Vec::new(),
                    },
                    Some(s) => ChatMessage {
                        role: "assistant",
                        content: (!s.content.is_empty() || s.tool_calls.is_empty()).then_some(s.content.as_str()),
                        reasoning_content: s.reasoning.as_deref(),
                        refusal: None,
                        tool_calls: s.tool_calls.clone(),
                    },
                };
                let has_calls = split.as_ref().is_some_and(|s| !s.tool_calls.is_empty());
                ChatChoice {
                    index,
                    message,
                    logprobs: logprobs_json(job.sampling.logprobs.is_some(), true, &out.logprobs, 0),
                    finish_reason: chat_finish_reason(out.finished.reason, has_calls),
                }
            })
            .collect();
        to_json(&ChatCompletion {
            id: &writer.id,
            object: "chat.completion",
            created: writer.created,
            model: &writer.model,
            choices,
            usage,
            system_fingerprint: None,
        })
    } else {
        let texts: Vec<String> = meta
            .iter()
            .zip(&outputs)
            .map(|(&(_, prompt), out)| match &job.prompts[prompt].echo {
                Some(echo) => format!("{echo}{}", out.text),
                None => out.text.clone(),
            })
            .collect();
        let choices = meta
            .iter()
            .zip(&outputs)
            .zip(&texts)
            .map(|((&(index, prompt), out), text)| {
                let echoed = job.prompts[prompt].echo.as_ref().map_or(0, |e| e.chars().count());
                CompletionChoice {
                    index,
                    text,
                    logprobs: logprobs_json(job.sampling.logprobs.is_some(), false, &out.logprobs, echoed),
                    finish_reason: Some(finish_reason_str(out.finished.reason)),
                }
            })
            .collect();
        to_json(&Completion {
            id: &writer.id,
            object: "text_completion",
            created: writer.created,
            model: &writer.model,
            choices,
            usage: Some(usage),
            system_fingerprint: None,
        })
    };
    Ok(json_response(axum::http::StatusCode::OK, body))
}

/// OpenAI's `finish_reason` of a chat choice: `tool_calls` when it ended
/// by itself with calls.
fn chat_finish_reason(reason: FinishReason, has_tool_calls: bool) -> &'static str {
    if has_tool_calls && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        finish_reason_str(reason)
    }
}

/// A whole chat output, split by its plan.
struct SplitOutput {
    reasoning: Option<String>,
    content: String,
    tool_calls: Vec<Json>,
}

impl SplitOutput {
    fn of(plan: &OutputPlan, text: &str) -> Self {
        let mut c = ChoiceOutput::new(plan);
        let mut deltas = c.push(text);
        deltas.extend(c.finish());
        let mut s = Self { reasoning: None, content: String::new(), tool_calls: Vec::new() };
        for d in deltas {
            match d {
                OutputDelta::Reasoning(t) => s.reasoning.get_or_insert_with(String::new).push_str(&t),
                OutputDelta::Content(t) => s.content.push_str(&t),
                OutputDelta::ToolCall(call) => s.tool_calls.push(tool_call_json(&call, false)),
            }
        }
        s
    }
}

/// What a stream still tracks of one choice.
struct ChoiceStream {
    prompt: usize,
    finished: bool,
    log: Option<RequestLog>,
    /// Log probabilities of tokens whose text has not been sent yet.
    pending_logprobs: Vec<TokenLogprob>,
    /// Characters of the choice's text sent so far (completions' `text_offset`).
    chars_sent: usize,
    /// The splitter of a chat output with a plan.
    output: Option<ChoiceOutput>,
}

/// The state of one SSE stream: chunks ready to send, and the events still
/// to come from every choice. Dropping it (the client went away) drops the
/// receivers, which the engine thread sees and aborts the requests.
struct StreamState {
    events: SelectAll<BoxStream<'static, (u32, Option<Event>)>>,
    choices: Vec<ChoiceStream>,
    writer: ChunkWriter,
    include_usage: bool,
    chat: bool,
    logprobs: bool,
    usage: UsageSum,
    ready: VecDeque<String>,
    done: bool,
    /// The request's queue slots, released with the stream.
    _slots: Slots,
}

impl StreamState {
    fn text_chunk(&mut self, index: u32, text: &str) {
        let Some(c) = self.choices.get_mut(index as usize) else {
            return;
        };
        let tokens = std::mem::take(&mut c.pending_logprobs);
        let logprobs = logprobs_json(self.logprobs, self.chat, &tokens, c.chars_sent);
        c.chars_sent += text.chars().count();
        self.ready.push_back(self.writer.text(index, text, logprobs));
    }

    /// Sends a piece of a choice's text, split by its plan if it has one.
    fn piece(&mut self, index: u32, text: &str, last: bool) {
        let Some(c) = self.choices.get_mut(index as usize) else {
            return;
        };
        let Some(output) = c.output.as_mut() else {
            if !text.is_empty() || !c.pending_logprobs.is_empty() {
                self.text_chunk(index, text);
            }
            return;
        };
        let mut deltas = output.push(text);
        if last {
            deltas.extend(output.finish());
        }
        for delta in deltas {
            let Some(c) = self.choices.get_mut(index as usize) else {
                return;
            };
            let tokens = std::mem::take(&mut c.pending_logprobs);
            let logprobs = logprobs_json(self.logprobs, self.chat, &tokens, 0);
            let chunk = match &delta {
                OutputDelta::Content(t) => self.writer.text(index, t, logprobs),
                OutputDelta::Reasoning(t) => self.writer.reasoning(index, t, logprobs),
                OutputDelta::ToolCall(call) => self.writer.tool_call(index, call, logprobs),
            };
            self.ready.push_back(chunk);
        }
    }

    fn on_event(&mut self, index: u32, event: Option<Event>) {
        let finished = self.choices.get(index as usize).is_none_or(|c| c.finished);
        if finished {
            return; // The channel closing after `Finished`.
        }
        if let Some(log) = self.choices.get_mut(index as usize).and_then(|c| c.log.as_mut()) {
            match &event {
                Some(Event::Text(_) | Event::Logprobs(_)) => log.on_output(),
                Some(Event::Finished(f)) => log.finish(f),
                Some(Event::Failed(err)) => log.fail(&err.to_string()),
                None => log.fail("the engine stopped"),
                Some(Event::Accepted { .. } | Event::Rejected(_)) => {}
            }
        }
        match event {
            Some(Event::Text(text)) => self.piece(index, &text, false),
            Some(Event::Logprobs(lp)) => {
                if let Some(c) = self.choices.get_mut(index as usize) {
                    c.pending_logprobs.push(lp);
                }
            }
            Some(Event::Finished(f)) => {
                self.piece(index, &f.text, true);
                let has_calls = self
                    .choices
                    .get(index as usize)
                    .and_then(|c| c.output.as_ref())
                    .is_some_and(ChoiceOutput::has_tool_calls);
                let reason =
                    if self.chat { chat_finish_reason(f.reason, has_calls) } else { finish_reason_str(f.reason) };
                self.ready.push_back(self.writer.finish_str(index, reason));
                if let Some(c) = self.choices.get_mut(index as usize) {
                    c.finished = true;
                    self.usage.add(c.prompt, &f);
                }
                if self.choices.iter().all(|c| c.finished) {
                    if self.include_usage {
                        self.ready.push_back(self.writer.usage(self.usage.usage()));
                    }
                    self.end();
                }
            }
            // As vLLM does: an error object as a data event, then [DONE].
            Some(Event::Failed(err)) => {
                self.ready.push_back(err.to_json());
                self.end();
            }
            Some(Event::Accepted { .. } | Event::Rejected(_)) => {}
            None => {
                self.ready.push_back(ApiError::Internal("the engine stopped".into()).to_json());
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.ready.push_back("[DONE]".to_owned());
        self.done = true;
    }
}

/// A choice's events, tagged with its index; `None` once its channel closes.
fn tagged(index: u32, rx: EventReceiver) -> BoxStream<'static, (u32, Option<Event>)> {
    stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(event) => Some(((index, Some(event)), Some(rx))),
            None => Some(((index, None), None)),
        }
    })
    .boxed()
}

fn stream_response(choices: Vec<Choice>, job: &Job, writer: ChunkWriter, slots: Slots) -> Response {
    let mut ready = VecDeque::new();
    for c in &choices {
        if writer.chat {
            ready.push_back(writer.role(c.index));
        }
        if let Some(prompt) = job.prompts[c.prompt].echo.as_ref().filter(|p| !p.is_empty()) {
            ready.push_back(writer.text(c.index, prompt, None));
        }
    }
    let mut choices = choices;
    let state_choices = choices
        .iter_mut()
        .map(|c| ChoiceStream {
            prompt: c.prompt,
            finished: false,
            log: c.log.take(),
            pending_logprobs: Vec::new(),
            chars_sent: job.prompts[c.prompt].echo.as_ref().map_or(0, |e| e.chars().count()),
            output: job.output.as_ref().map(ChoiceOutput::new),
        })
        .collect();
    let events = stream::select_all(choices.into_iter().map(|c| tagged(c.index, c.rx)));
    let state = StreamState {
        events,
        choices: state_choices,
        writer,
        include_usage: job.stream.include_usage,
        chat: job.chat,
        logprobs: job.sampling.logprobs.is_some(),
        usage: UsageSum::new(job.prompts.len()),
        ready,
        done: false,
        _slots: slots,
    };
    let stream = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(data) = st.ready.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.events.next().await {
                Some((index, event)) => st.on_event(index, event),
                // Every channel closed without finishing every choice.
                None => {
                    st.ready.push_back(ApiError::Internal("the engine stopped".into()).to_json());
                    st.end();
                }
            }
        }
    });
    // Comments every 15 s keep proxies from closing a stream whose first
    // token is slow (a long queue or prefill).
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
