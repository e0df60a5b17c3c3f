//! `--api-key`: every route but `/health` (and `/metrics` with
//! `--public-metrics`) needs `Authorization: Bearer <key>`.
//!
//! The scheme is matched case-insensitively (RFC 9110: auth schemes are
//! case-insensitive). The key is compared through SHA-256 digests with
//! `subtle`'s constant-time equality, so neither the position of the first
//! wrong byte nor the key's length shows in the response time.

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The server's key, kept as its digest.
#[derive(Clone, Debug)]
pub struct ApiKey {
    digest: [u8; 32],
    /// `/metrics` stays open for scrapers without the key.
    public_metrics: bool,
}

impl ApiKey {
    pub fn new(key: &str, public_metrics: bool) -> Self {
        Self { digest: Sha256::digest(key.as_bytes()).into(), public_metrics }
    }

    /// Whether `authorization` (the header's value) presents the key.
    pub fn accepts(&self, authorization: &[u8]) -> bool {
        let Ok(value) = std::str::from_utf8(authorization) else {
            return false;
        };
        let Some((scheme, token)) = value.trim().split_once(char::is_whitespace) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        let sent: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        bool::from(sent.ct_eq(&self.digest))
    }

    fn is_open(&self, path: &str) -> bool {
        path == "/health" || (self.public_metrics && path == "/metrics")
    }
}

/// Refuses a request without the key (`routes` runs it on every route).
/// Below `state` (which holds the key), so it takes the key, not the state.
pub async fn require_api_key(key: Option<&ApiKey>, request: Request, next: Next) -> Response {
    if let Some(key) = key {
        let sent = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
        if !key.is_open(request.uri().path()) && !sent.is_some_and(|v| key.accepts(v)) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_the_key_exact() {
        let key = ApiKey::new("sekrit", false);
        for ok in ["Bearer sekrit", "bearer sekrit", "BEARER  sekrit ", " Bearer\tsekrit"] {
            assert!(key.accepts(ok.as_bytes()), "{ok:?}");
        }
        for bad in ["Bearer sekrit2", "Bearer sekri", "Basic sekrit", "sekrit", "Bearer", "Bearer ", "Bearersekrit", ""]
        {
            assert!(!key.accepts(bad.as_bytes()), "{bad:?}");
        }
        assert!(!key.accepts(b"Bearer \xff"));
    }

    #[test]
    fn health_is_always_open_and_metrics_only_by_flag() {
        assert!(ApiKey::new("k", false).is_open("/health"));
        assert!(!ApiKey::new("k", false).is_open("/metrics"));
        assert!(ApiKey::new("k", true).is_open("/metrics"));
        assert!(!ApiKey::new("k", true).is_open("/tokenize"));
    }
}
