//! `GET /`: a small chat page for trying a model from the browser.
//!
//! One static HTML file (`static/chat.html`: markup, style and script, no
//! external assets) embedded in the binary with `include_str!`, so there is no
//! build step and nothing to install. The page lists the model from
//! `/v1/models`, takes sampling settings, streams replies from
//! `/v1/chat/completions` and shows tokens per second.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page's source.
pub const CHAT_HTML: &str = include_str!("static/chat.html");

pub async fn chat_page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], CHAT_HTML)
        .into_response()
}
