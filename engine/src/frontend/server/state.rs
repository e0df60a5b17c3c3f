//! What the HTTP handlers share: the served model, the state every route
//! receives, and two small helpers of responses.
//!
//! It sits below both [`routes`](super::routes) and
//! [`generation`](super::generation), so that neither imports the other back.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::ApiKey;
use super::engine_loop::EngineHandle;
use super::limits::{Admission, ServerLimits};
use super::metrics::Metrics;
use super::output::OutputParsers;
use super::request::SamplingDefaults;
use super::structured::GrammarCompiler;
use crate::text::chat_template::{ChatTemplate, SpecialTokens};
use crate::text::tokenizer::Tokenizer;

/// The model as the routes see it.
pub struct ServedModel {
    /// The name clients address it by (`model` field).
    pub name: String,
    /// Other accepted names.
    pub aliases: Vec<String>,
    pub tokenizer: Arc<Tokenizer>,
    /// The compiled chat template; `Err` holds why it does not compile.
    pub template: Option<Result<ChatTemplate, String>>,
    pub special_tokens: SpecialTokens,
    pub defaults: SamplingDefaults,
    /// Unix time the server started (the model card's `created`).
    pub created: u64,
    /// Longest prompt text tokenized ([`super::limits::max_prompt_bytes`]).
    pub max_prompt_bytes: usize,
    /// Compiles `response_format` and forced tool calls into grammars.
    pub grammars: GrammarCompiler,
    pub parsers: OutputParsers,
}

/// Everything the handlers share.
pub struct AppState {
    /// The key requests must present, if any.
    pub api_key: Option<ApiKey>,
    pub engine: EngineHandle,
    pub model: ServedModel,
    pub metrics: Arc<Metrics>,
    pub limits: ServerLimits,
    pub admission: Admission,
}

/// Seconds since the Unix epoch (the `created` field of responses).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A response with a JSON body already serialized.
pub fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
