//! Running a generation request: submit its choices, then answer with one
//! JSON body or an SSE stream.
//!
//! A request has one prompt (chat), or one or several (completions: a batch),
//! and asks for `n` choices of each; choice `p * n + j` is prompt `p`'s `j`-th,
//! as in OpenAI's API. Every choice is its own engine request (the prefix
//! cache shares the prompt's pages among them); with a `seed`, choice `j` draws
//! with `seed + j`, so the choices differ and the whole answer reproduces.
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
use super::request::{Sampling, StreamOptions};
use super::request_log::RequestLog;
use super::response::{
    chat_logprobs, completion_logprobs, finish_reason_str, to_json, ChatChoice, ChatCompletion, ChatMessage,
    ChunkWriter, Completion, CompletionChoice, Usage,
};
use super::state::{json_response, unix_now, AppState};
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
pub async fn generate(state: &Arc<AppState>, job: Job) -> Result<Response, ApiError> {
    let n = job.sampling.n.max(1);
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
        let choices = meta
            .iter()
            .zip(&outputs)
            .map(|(&(index, _), out)| ChatChoice {
                index,
                message: ChatMessage { role: "assistant", content: &out.text, refusal: None, tool_calls: Vec::new() },
                logprobs: logprobs_json(job.sampling.logprobs.is_some(), true, &out.logprobs, 0),
                finish_reason: finish_reason_str(out.finished.reason),
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

/// What a stream still tracks of one choice.
struct ChoiceStream {
    prompt: usize,
    finished: bool,
    log: Option<RequestLog>,
    /// Log probabilities of tokens whose text has not been sent yet.
    pending_logprobs: Vec<TokenLogprob>,
    /// Characters of the choice's text sent so far (completions' `text_offset`).
    chars_sent: usize,
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
            Some(Event::Text(text)) => self.text_chunk(index, &text),
            Some(Event::Logprobs(lp)) => {
                if let Some(c) = self.choices.get_mut(index as usize) {
                    c.pending_logprobs.push(lp);
                }
            }
            Some(Event::Finished(f)) => {
                let has_logprobs = self.choices.get(index as usize).is_some_and(|c| !c.pending_logprobs.is_empty());
                if !f.text.is_empty() || has_logprobs {
                    self.text_chunk(index, &f.text);
                }
                self.ready.push_back(self.writer.finish(index, f.reason));
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
