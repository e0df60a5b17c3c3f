//! API errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
//!
//! Every way a request can fail is one variant of [`ApiError`], which knows
//! its HTTP status, its OpenAI `type` and `code`, and the request field it
//! is about (`param`), so clients (the `openai` package raises
//! `BadRequestError`, `NotFoundError`, ... from the status) and humans both
//! see what to fix. Handlers return `Result<_, ApiError>`; nothing in the
//! request path panics on user input.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::core::engine::{EngineError, LengthLimit};

/// Why a request was refused or failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("`{param}` must be {expected}")]
    InvalidType { param: String, expected: &'static str },
    #[error("`{param}` {reason}")]
    InvalidValue { param: String, reason: String },
    #[error("`{param}` is required")]
    Missing { param: String },
    /// A field this server knows but does not implement (e.g. `logprobs`).
    #[error("`{param}` is not supported by this server{}", detail(.reason))]
    Unsupported { param: String, reason: String },
    /// A field that is not part of the API at all (often a typo).
    #[error("unknown parameter `{param}`")]
    UnknownField { param: String },
    #[error("the model `{model}` does not exist (this server serves `{served}`)")]
    ModelNotFound { model: String, served: String },
    /// Prompt plus `max_tokens` does not fit; never truncated silently.
    #[error("this model's maximum context length is {limit} tokens ({what}), but the request needs {prompt_tokens} prompt tokens + {max_tokens} completion tokens; shorten the prompt or lower `max_tokens`")]
    ContextLength { param: String, what: &'static str, limit: usize, prompt_tokens: usize, max_tokens: usize },
    /// The chat template refused the conversation or failed on it.
    #[error("{0}")]
    Template(String),
    #[error("the model has no chat template; use /v1/completions or serve a model with one")]
    NoChatTemplate,
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("method {method} is not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("request body too large: {0}")]
    BodyTooLarge(String),
    #[error("cannot read the request body: {0}")]
    BadBody(String),
    #[error("invalid or missing API key: send the header `Authorization: Bearer <key>`")]
    Unauthorized,
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The waiting queue is full (`--max-queued-requests`): retry later.
    #[error("the server is overloaded: {in_flight} requests are queued or running; retry in {retry_after_secs} s")]
    Overloaded { in_flight: usize, retry_after_secs: u64 },
    #[error("internal error: {0}")]
    Internal(String),
}

fn detail(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

/// The JSON body of an error response.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid_value(param: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidValue { param: param.into(), reason: reason.into() }
    }

    pub fn invalid_type(param: impl Into<String>, expected: &'static str) -> Self {
        Self::InvalidType { param: param.into(), expected }
    }

    pub fn unsupported(param: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unsupported { param: param.into(), reason: reason.into() }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::ModelNotFound { .. } | ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ShuttingDown | ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// OpenAI's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::ModelNotFound { .. } | ApiError::RouteNotFound { .. } => "not_found_error",
            ApiError::ShuttingDown | ApiError::Overloaded { .. } | ApiError::Internal(_) => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The request field at fault, dotted for nested ones
    /// (`messages.0.content`).
    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidType { param, .. }
            | ApiError::InvalidValue { param, .. }
            | ApiError::Missing { param }
            | ApiError::Unsupported { param, .. }
            | ApiError::UnknownField { param }
            | ApiError::ContextLength { param, .. } => Some(param),
            ApiError::ModelNotFound { .. } => Some("model"),
            ApiError::Template(_) | ApiError::NoChatTemplate => Some("messages"),
            _ => None,
        }
    }

    /// OpenAI's machine-readable `code`.
    pub fn code(&self) -> Option<&'static str> {
        Some(match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidType { .. } => "invalid_type",
            ApiError::InvalidValue { .. } => "invalid_value",
            ApiError::Missing { .. } => "missing_required_parameter",
            ApiError::Unsupported { .. } => "unsupported_parameter",
            ApiError::UnknownField { .. } => "unknown_parameter",
            ApiError::ModelNotFound { .. } => "model_not_found",
            ApiError::ContextLength { .. } => "context_length_exceeded",
            ApiError::Template(_) | ApiError::NoChatTemplate => "invalid_chat_template",
            ApiError::RouteNotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::BodyTooLarge(_) => "request_too_large",
            ApiError::BadBody(_) => "invalid_body",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::ShuttingDown => "server_shutting_down",
            ApiError::Overloaded { .. } => "server_overloaded",
            ApiError::Internal(_) => "internal_error",
        })
    }

    /// The `{"error": {...}}` object, as JSON text (also sent as an SSE
    /// event when a stream fails after it started).
    pub fn to_json(&self) -> String {
        let body = ErrorBody {
            error: ErrorObject { message: self.to_string(), kind: self.kind(), param: self.param(), code: self.code() },
        };
        // Serializing plain strings and options cannot fail; keep a fallback
        // anyway rather than an `expect` in the request path.
        serde_json::to_string(&body).unwrap_or_else(|_| {
            r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#.to_owned()
        })
    }

    /// Maps an [`EngineError`] of `add_request` to the field the client
    /// sent: `prompt_field` is `messages` or `prompt`, and `max_tokens_field`
    /// the length field the client set (if any).
    pub fn from_engine(err: &EngineError, prompt_field: &str, max_tokens_field: Option<&str>) -> Self {
        match err {
            EngineError::InvalidRequest { field, reason } => {
                let param = match *field {
                    "prompt_ids" => prompt_field.to_owned(),
                    "max_tokens" => max_tokens_field.unwrap_or("max_tokens").to_owned(),
                    other => other.to_owned(),
                };
                ApiError::invalid_value(param, reason.clone())
            }
            EngineError::TooLong { prompt_len, max_tokens, limit, limit_tokens } => ApiError::ContextLength {
                // The prompt alone fills the limit: no max_tokens would fit,
                // so the prompt is what to shorten.
                param: if prompt_len >= limit_tokens {
                    prompt_field.to_owned()
                } else {
                    max_tokens_field.unwrap_or(prompt_field).to_owned()
                },
                what: match limit {
                    LengthLimit::Context => "the model's context window",
                    LengthLimit::KvPool => "all of the server's KV cache",
                },
                limit: *limit_tokens,
                prompt_tokens: *prompt_len,
                max_tokens: *max_tokens,
            },
            other => ApiError::Internal(format!("{other}")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.to_json()).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let ApiError::Overloaded { retry_after_secs, .. } = &self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_openai_shape() {
        let err = ApiError::invalid_value("temperature", "must be >= 0, got -1");
        let json: serde_json::Value = serde_json::from_str(&err.to_json()).unwrap();
        let e = &json["error"];
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["param"], "temperature");
        assert_eq!(e["code"], "invalid_value");
        assert!(e["message"].as_str().unwrap().contains("temperature"));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn statuses() {
        let nf = ApiError::ModelNotFound { model: "a".into(), served: "b".into() };
        assert_eq!(nf.status(), StatusCode::NOT_FOUND);
        assert_eq!(ApiError::ShuttingDown.status(), StatusCode::SERVICE_UNAVAILABLE);
        let json: serde_json::Value = serde_json::from_str(&ApiError::ShuttingDown.to_json()).unwrap();
        assert!(json["error"]["param"].is_null());
    }
}
