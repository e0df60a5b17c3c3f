//! The HTTP routes: validate, render and tokenize, submit, respond or stream.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/chat/completions` | chat, streaming (SSE) or not |
//! | `POST /v1/completions` | text completion, streaming or not |
//! | `GET /v1/models`, `GET /v1/models/{*model}` | the served model |
//! | `POST /tokenize`, `POST /detokenize` | vLLM's tokenizer endpoints |
//! | `GET /health` | 200 while the engine runs |
//! | `GET /metrics` | Prometheus text format |
//! | `POST /flush_cache` | drop unused prefix-cache pages (SGLang) |
//! | `GET /version` | the server version |
//! | `GET /` | the chat page ([`super::chat_page`]) |
//!
//! Template rendering and tokenization run on tokio's blocking pool: they
//! are CPU work proportional to the prompt and must not stall the threads
//! that serve streams. They take a permit of [`Admission::prepare`] first,
//! and a prompt longer than [`ServedModel::max_prompt_bytes`] is refused
//! before tokenizing. With `--api-key`, every route but `/health` needs the
//! key ([`auth`](super::auth)).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value as Json;

use super::error::ApiError;
use super::generation::{generate, Job, JobPrompt};
use super::output::OutputPlan;
use super::request::{self, ChatRender, Prompt, TokenizeInput};
use super::response::{to_json, DetokenizeResponse, ModelCard, ModelList, TokenizeResponse};
use super::state::{json_response, AppState, ServedModel};
use super::structured::GrammarSpec;
use super::{auth, limits};
use crate::core::grammar::Grammar;
use crate::text::chat_template::RenderOptions;

/// `max_tokens` of a completion request that sets none (OpenAI's default).
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

pub fn router(state: Arc<AppState>) -> Router {
    let max_body_bytes = state.limits.max_body_bytes;
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(list_models))
        // A wildcard: served names often contain a slash (`Qwen/Qwen3-8B`).
        .route("/v1/models/{*model}", get(get_model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        // It changes state, so not on GET (a link or a prefetch must not flush).
        .route("/flush_cache", post(flush_cache))
        .route("/version", get(version))
        .route("/", get(super::chat_page::chat_page));
    // Load shedding covers the routes above; the probes stay outside it.
    limits::shed(api, &state.limits)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn(json_method_not_allowed))
        .layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    auth::require_api_key(state.api_key.as_ref(), request, next).await
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::RouteNotFound { method: method.to_string(), path: uri.path().to_owned() }
}

/// axum answers a known path with the wrong method with an empty 405; give
/// it the JSON error body (keeping the `Allow` header).
async fn json_method_not_allowed(request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let mut json = ApiError::MethodNotAllowed { method, path }.into_response();
    if let Some(allow) = allow {
        json.headers_mut().insert(header::ALLOW, allow);
    }
    json
}

fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge(format!("the limit is {} bytes", state.limits.max_body_bytes))
        } else {
            ApiError::BadBody(rejection.body_text())
        }
    })
}

impl AppState {
    /// Checks the request's `model` (optional, as in vLLM).
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model.name && !self.model.aliases.iter().any(|a| a == m) => {
                Err(ApiError::ModelNotFound { model: m.to_owned(), served: self.model.name.clone() })
            }
            _ => Ok(()),
        }
    }

    /// Turns an error into its response, counting refusals.
    fn reject(&self, err: ApiError) -> Response {
        if err.status().is_client_error() {
            self.metrics.record_rejected();
        }
        err.into_response()
    }
}

impl ServedModel {
    /// Renders a conversation with the model's chat template.
    fn render_chat(&self, messages: &[Json], render: &ChatRender, tools: Option<Json>) -> Result<String, ApiError> {
        let template = match &self.template {
            Some(Ok(t)) => t,
            Some(Err(e)) => return Err(ApiError::Template(e.clone())),
            None => return Err(ApiError::NoChatTemplate),
        };
        let mut opts = RenderOptions::new(render.add_generation_prompt, self.special_tokens.clone());
        opts.extra = render.chat_template_kwargs.clone();
        opts.documents = render.documents.clone();
        opts.tools = tools;
        let rendered = template.render(messages, &opts).map_err(|e| ApiError::Template(e.to_string()))?;
        if render.continue_final_message {
            continue_final_message(rendered, messages)
        } else {
            Ok(rendered)
        }
    }

    /// One compiled grammar per choice for `spec` (none without one).
    fn grammars(&self, spec: Option<&GrammarSpec>, param: &str, count: usize) -> Result<Vec<Grammar>, ApiError> {
        match spec {
            None => Ok(Vec::new()),
            Some(spec) => self.grammars.compile(spec, param, count),
        }
    }

    /// Tokenizes a prompt, refusing first one that could never fit the
    /// context (tokenizing it would be the expensive part).
    fn encode(&self, text: &str, add_special_tokens: bool, param: &str) -> Result<Vec<u32>, ApiError> {
        if text.len() > self.max_prompt_bytes {
            return Err(ApiError::invalid_value(
                param,
                format!(
                    "is {} bytes long; this server tokenizes at most {} bytes of prompt text \
                     ({} per token of its {}-token context)",
                    text.len(),
                    self.max_prompt_bytes,
                    limits::PROMPT_BYTES_PER_TOKEN,
                    self.max_prompt_bytes / limits::PROMPT_BYTES_PER_TOKEN
                ),
            ));
        }
        self.tokenizer.encode(text, add_special_tokens).map_err(|e| ApiError::invalid_value(param, e.to_string()))
    }
}

/// Cuts a rendered conversation right after the last message's content, so
/// the model continues that message (transformers' `continue_final_message`).
fn continue_final_message(rendered: String, messages: &[Json]) -> Result<String, ApiError> {
    let last = messages.last().and_then(|m| m.get("content")).and_then(Json::as_str).unwrap_or("");
    let param = "continue_final_message";
    let stripped = last.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(ApiError::invalid_value(param, "the final message does not appear in the rendered chat"));
    };
    let trimmed_start = last.trim_start();
    let end = if rendered[loc..].starts_with(trimmed_start) {
        // The template kept the message's trailing whitespace.
        loc + trimmed_start.len()
    } else {
        loc + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// Runs CPU work (rendering, tokenizing) off the async threads, once a
/// preparation permit is free. A panic in it becomes a 500 for this request.
async fn blocking<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = state.admission.prepare().await?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        f()
    })
    .await
    .map_err(|e| ApiError::Internal(format!("request preparation failed: {e}")))?
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&state, body)?;
        let req = request::parse_chat(&body)?;
        state.check_model(req.model.as_deref())?;
        let st = state.clone();
        let (prompt_ids, req, grammars, output) = blocking(&state, move || {
            let tools = req.tools.as_ref().and_then(|t| t.template_tools());
            let text = st.model.render_chat(&req.messages, &req.render, tools)?;
            let ids = st.model.encode(&text, req.add_special_tokens, "messages")?;
            // A forced tool call, or the response format: one grammar at most.
            let (spec, param) = match req.tools.as_ref().and_then(|t| t.grammar()) {
                Some(spec) => (Some(spec), "tool_choice"),
                None => (
                    req.response_format.as_ref().and_then(|r| r.grammar()),
                    req.response_format.as_ref().map_or("response_format", |r| r.param()),
                ),
            };
            let grammars = st.model.grammars(spec.as_ref(), param, req.sampling.n)?;
            let parsers = st.model.parsers;
            // NOTE: a grammar constrains the output from its first token, so
            // there is no reasoning to split off (vLLM instead lets the
            // reasoning run free and constrains what follows).
            let reasoning = parsers.reasoning.filter(|_| spec.is_none());
            let output = OutputPlan::new(reasoning, &text, req.tools.as_ref().map(|t| &t.choice), parsers.tool_calls);
            Ok((ids, req, grammars, output))
        })
        .await?;
        let mut sampling = req.sampling;
        if let Some(super::output::ToolPlan::Native(format)) = output.as_ref().map(|o| &o.tools) {
            // The call marker is a special token: decoding must keep it.
            if format.needs_special_tokens() {
                sampling.skip_special_tokens = false;
            }
        }
        let room = state.engine.info().max_context_len.saturating_sub(prompt_ids.len()).max(1);
        let default_max_tokens = state.model.defaults.max_new_tokens.map_or(room, |cap| cap.min(room));
        generate(
            &state,
            Job {
                prompts: vec![JobPrompt { ids: prompt_ids, echo: None, default_max_tokens }],
                sampling,
                stream: req.stream,
                chat: true,
                prompt_field: "messages",
                arrival,
                grammars,
                output,
            },
        )
        .await
    }
    .await;
    result.unwrap_or_else(|e| state.reject(e))
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(&state, body)?;
        let req = request::parse_completion(&body)?;
        state.check_model(req.model.as_deref())?;
        let default_max_tokens = state
            .model
            .defaults
            .max_new_tokens
            .map_or(COMPLETION_DEFAULT_MAX_TOKENS, |cap| cap.min(COMPLETION_DEFAULT_MAX_TOKENS));
        let st = state.clone();
        let (prompts, req, grammars) = blocking(&state, move || {
            let prompts = req
                .prompts
                .iter()
                .enumerate()
                .map(|(i, prompt)| {
                    let field = if req.prompts.len() == 1 { "prompt".to_owned() } else { format!("prompt.{i}") };
                    let (ids, text) = match prompt {
                        Prompt::Text(text) => (st.model.encode(text, req.add_special_tokens, &field)?, text.clone()),
                        Prompt::Ids(ids) => {
                            let text = if req.echo {
                                st.model
                                    .tokenizer
                                    .decode(ids, false)
                                    .map_err(|e| ApiError::invalid_value(field.as_str(), e.to_string()))?
                            } else {
                                String::new()
                            };
                            (ids.clone(), text)
                        }
                    };
                    Ok(JobPrompt { ids, echo: req.echo.then_some(text), default_max_tokens })
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            let spec = req.response_format.as_ref().and_then(|r| r.grammar());
            let param = req.response_format.as_ref().map_or("response_format", |r| r.param());
            let grammars = st.model.grammars(spec.as_ref(), param, prompts.len() * req.sampling.n)?;
            Ok((prompts, req, grammars))
        })
        .await?;
        generate(
            &state,
            Job {
                prompts,
                sampling: req.sampling,
                stream: req.stream,
                chat: false,
                prompt_field: "prompt",
                arrival,
                grammars,
                output: None,
            },
        )
        .await
    }
    .await;
    result.unwrap_or_else(|e| state.reject(e))
}

async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    json_response(StatusCode::OK, to_json(&ModelList { object: "list", data: [model_card(&state)] }))
}

fn model_card(state: &AppState) -> ModelCard<'_> {
    ModelCard {
        id: &state.model.name,
        object: "model",
        created: state.model.created,
        owned_by: "minisgl",
        root: &state.model.name,
        max_model_len: state.engine.info().max_context_len,
    }
}

async fn get_model(State(state): State<Arc<AppState>>, Path(model): Path<String>) -> Response {
    match state.check_model(Some(&model)) {
        Ok(()) => json_response(StatusCode::OK, to_json(&model_card(&state))),
        Err(e) => e.into_response(),
    }
}

async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body_bytes(&state, body)?;
        let req = request::parse_tokenize(&body)?;
        state.check_model(req.model.as_deref())?;
        let st = state.clone();
        blocking(&state, move || {
            let (prompt, tokens) = match &req.input {
                TokenizeInput::Prompt(Prompt::Text(text)) => {
                    (text.clone(), st.model.encode(text, req.add_special_tokens, "prompt")?)
                }
                TokenizeInput::Prompt(Prompt::Ids(ids)) => {
                    let text = st
                        .model
                        .tokenizer
                        .decode(ids, false)
                        .map_err(|e| ApiError::invalid_value("prompt", e.to_string()))?;
                    (text, ids.clone())
                }
                TokenizeInput::Chat { messages, render, tools } => {
                    let text = st.model.render_chat(messages, render, tools.clone())?;
                    let ids = st.model.encode(&text, req.add_special_tokens, "messages")?;
                    (text, ids)
                }
            };
            let token_strs = req
                .return_token_strs
                .then(|| tokens.iter().map(|&id| st.model.tokenizer.id_to_token(id).unwrap_or_default()).collect());
            Ok(TokenizeResponse {
                count: tokens.len(),
                max_model_len: st.engine.info().max_context_len,
                tokens,
                token_strs,
                prompt,
            })
        })
        .await
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, to_json(&body)),
        Err(e) => state.reject(e),
    }
}

async fn detokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body_bytes(&state, body)?;
        let req = request::parse_detokenize(&body)?;
        state.check_model(req.model.as_deref())?;
        let vocab = state.model.tokenizer.vocab_size();
        if let Some((i, id)) = req.tokens.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(ApiError::invalid_value(
                format!("tokens.{i}"),
                format!("{id} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let st = state.clone();
        blocking(&state, move || {
            st.model
                .tokenizer
                .decode(&req.tokens, false)
                .map(|prompt| DetokenizeResponse { prompt })
                .map_err(|e| ApiError::invalid_value("tokens", e.to_string()))
        })
        .await
    }
    .await;
    match result {
        Ok(body) => json_response(StatusCode::OK, to_json(&body)),
        Err(e) => state.reject(e),
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.is_alive() {
        StatusCode::OK.into_response()
    } else {
        ApiError::Internal("the engine thread is not running".into()).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut response = state.metrics.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

async fn flush_cache(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.flush_cache().await {
        json_response(StatusCode::OK, r#"{"success":true}"#.to_owned())
    } else {
        ApiError::ShuttingDown.into_response()
    }
}

async fn version() -> Response {
    json_response(StatusCode::OK, format!(r#"{{"version":"{}"}}"#, env!("CARGO_PKG_VERSION")))
}
