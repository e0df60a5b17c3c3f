//! What one client may cost the server: the HTTP listener's limits and the
//! admission of requests.
//!
//! - **Connections** ([`serve`]): hyper's HTTP/1 connections with a header
//!   read timeout (a client that opens a connection and sends its request
//!   head slowly, or not at all, is closed after it; it also bounds how long
//!   an idle keep-alive connection is held) and at most
//!   [`ServerLimits::max_connections`] at once. A connection beyond the limit
//!   is shed gracefully: hyper reads its request head (within a short
//!   timeout) and answers 503 with `Retry-After` and `Connection: close`, so
//!   the client learns why instead of seeing a reset. On shutdown
//!   hyper-util's graceful shutdown lets requests in flight finish.
//! - **Requests** ([`shed`]): tower's `ConcurrencyLimit` bounds the API
//!   requests inside the handlers at once ([`ServerLimits::max_concurrent_requests`])
//!   and tower's `LoadShed` answers one more at once with 503 and
//!   `Retry-After` instead of letting it wait for a permit; the probes
//!   (`/health`, `/metrics`) are outside it, so a loaded server still looks
//!   alive.
//! - **Bodies** ([`layer`]): tower-http's body limit refuses a body whose
//!   `Content-Length` exceeds [`ServerLimits::max_body_bytes`] before reading
//!   it, and cuts a chunked one at the limit (413, as JSON); a body must
//!   arrive within [`ServerLimits::body_read_timeout`].
//! - **Preparation work** ([`Admission::prepare`]): chat rendering and
//!   tokenization run on the blocking pool, at most
//!   [`ServerLimits::max_concurrent_preparations`] at once; prompts are
//!   checked against [`ServedModel::max_prompt_bytes`](super::state::ServedModel)
//!   before they are tokenized.
//! - **Queue** ([`Admission::admit`]): each choice of a generation request
//!   holds a slot from submission until its response ends; there are
//!   `max_running_requests + max_queued_requests` slots, so at most
//!   `max_queued_requests` choices wait beyond what the engine can run at
//!   once. A request that does not get its slots is answered 503 with
//!   `Retry-After` instead of waiting without bound.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::BoxError;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use super::error::ApiError;

/// The server's resource limits. No `Default`: [`ServerLimits::defaults`]
/// names the documented defaults, the command line overrides them.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    /// Largest request body (`--max-request-bytes`).
    pub max_body_bytes: usize,
    /// Time a connection has to send a request head, whether it just opened
    /// or is idle between requests (`--header-timeout`).
    pub header_read_timeout: Duration,
    /// Time a request body has to arrive once its head has (a client that
    /// sends its body a byte at a time holds a connection no longer).
    pub body_read_timeout: Duration,
    /// Open connections at once (`--max-connections`).
    pub max_connections: usize,
    /// API requests inside the handlers at once (`--max-concurrent-requests`);
    /// more are shed with 503. A stream holds its permit until its response
    /// head is sent, a plain request until it is answered.
    pub max_concurrent_requests: usize,
    /// Chat renderings and tokenizations running at once.
    pub max_concurrent_preparations: usize,
    /// Choices that may wait for the engine beyond its running set
    /// (`--max-queued-requests`).
    pub max_queued_requests: usize,
    /// The engine's running set (`--max-running-requests`): with the queue,
    /// the number of choices in flight.
    pub max_running_requests: usize,
    /// What a 503 for a full queue tells the client to wait, in seconds.
    pub retry_after_secs: u64,
}

impl ServerLimits {
    /// 4 MiB bodies (a prompt filling a 128k context, as JSON, fits), 10 s
    /// for a request head and 30 s for its body, 1024 connections and as many
    /// requests in the handlers, 2 preparations per core, 1024 queued choices
    /// beside 256 running, retry after 1 s.
    pub fn defaults() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Self {
            max_body_bytes: 4 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_concurrent_requests: 1024,
            max_concurrent_preparations: 2 * cores,
            max_queued_requests: 1024,
            max_running_requests: 256,
            retry_after_secs: 1,
        }
    }
}

/// Bytes of prompt text accepted per token of the served context, before
/// tokenizing: real text averages 3 to 5 bytes a token, so this only stops
/// prompts that could never fit (tokenizing those is the cost to avoid).
pub const PROMPT_BYTES_PER_TOKEN: usize = 32;

/// The largest prompt text, in bytes, for a served context of
/// `max_context_len` tokens (at least 64 KiB, for tiny test contexts).
pub fn max_prompt_bytes(max_context_len: usize) -> usize {
    max_context_len.saturating_mul(PROMPT_BYTES_PER_TOKEN).max(64 << 10)
}

/// The request slots and preparation permits the handlers share.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    capacity: usize,
    preparations: Arc<Semaphore>,
    retry_after_secs: u64,
}

/// A request's slots: released when dropped (with its response or stream).
#[derive(Debug)]
pub struct Slots {
    _permit: OwnedSemaphorePermit,
}

impl Admission {
    pub fn new(limits: &ServerLimits) -> Self {
        let capacity = limits.max_running_requests.saturating_add(limits.max_queued_requests).max(1);
        Self {
            slots: Arc::new(Semaphore::new(capacity.min(Semaphore::MAX_PERMITS))),
            capacity,
            preparations: Arc::new(Semaphore::new(limits.max_concurrent_preparations.max(1))),
            retry_after_secs: limits.retry_after_secs,
        }
    }

    /// Takes `choices` slots at once, or refuses with 503 + `Retry-After`
    /// (400 when the request alone needs more slots than exist: retrying
    /// would never help).
    pub fn admit(&self, choices: usize) -> Result<Slots, ApiError> {
        if choices > self.capacity {
            return Err(ApiError::invalid_value(
                "n",
                format!(
                    "the request asks for {choices} choices (prompts x n); this server runs or queues at most {}",
                    self.capacity
                ),
            ));
        }
        let overloaded = || ApiError::Overloaded {
            in_flight: self.capacity - self.slots.available_permits().min(self.capacity),
            retry_after_secs: self.retry_after_secs,
        };
        let n = u32::try_from(choices).map_err(|_| overloaded())?;
        self.slots.clone().try_acquire_many_owned(n).map(|p| Slots { _permit: p }).map_err(|_| overloaded())
    }

    /// Waits for a preparation permit (rendering, tokenizing): a burst of
    /// large prompts queues here instead of taking every core.
    pub async fn prepare(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.preparations.clone().acquire_owned().await.map_err(|_| ApiError::ShuttingDown)
    }
}

/// Adds the body limit to the routes (tower-http: `Content-Length` checked
/// before reading), its 413 turned into the JSON error.
pub fn layer(router: Router, limits: &ServerLimits) -> Router {
    let max = limits.max_body_bytes;
    router
        .layer(middleware::from_fn(move |request: Request, next: Next| json_too_large(request, next, max)))
        .layer(
            // Outermost, so a refused body is never read.
            RequestBodyLimitLayer::new(max),
        )
        .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout))
}

/// Wraps the API routes of `router` in tower's concurrency limit and load
/// shedding: beyond [`ServerLimits::max_concurrent_requests`] requests in the
/// handlers, the next is answered 503 with `Retry-After` at once. Routes added
/// to the result afterwards (the probes) are outside it.
pub fn shed<S: Clone + Send + Sync + 'static>(router: Router<S>, limits: &ServerLimits) -> Router<S> {
    let limit = limits.max_concurrent_requests.max(1);
    let retry_after_secs = limits.retry_after_secs;
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |error: BoxError| async move {
                if error.is::<tower::load_shed::error::Overloaded>() {
                    ApiError::Overloaded { in_flight: limit, retry_after_secs }.into_response()
                } else {
                    ApiError::Internal(error.to_string()).into_response()
                }
            }))
            .layer(LoadShedLayer::new())
            .layer(ConcurrencyLimitLayer::new(limit)),
    )
}

/// The answer to a connection beyond [`ServerLimits::max_connections`]: 503,
/// `Retry-After`, and the connection closed after it.
fn connection_shed_response(max_connections: usize, retry_after_secs: u64) -> Response {
    let mut response = ApiError::Overloaded { in_flight: max_connections, retry_after_secs }.into_response();
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

/// How long a shed connection has to send its request head before it is
/// closed without an answer.
const SHED_HEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// tower-http answers 413 with a plain-text body; give it the JSON error.
async fn json_too_large(request: Request, next: Next, max: usize) -> Response {
    let response = next.run(request).await;
    let is_json =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return ApiError::BodyTooLarge(format!("the limit is {max} bytes")).into_response();
    }
    response
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for the open connections to finish their requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
    limits: &ServerLimits,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).keep_alive(true);
    let connections = Arc::new(Semaphore::new(limits.max_connections.clamp(1, Semaphore::MAX_PERMITS)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little
                    // rather than spin (what axum::serve does).
                    eprintln!("minisgl: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            // Shed, gracefully: one 503 and the connection closes. The shed
            // connections are not counted, but each lives at most the short
            // head timeout and serves one tiny answer.
            let (max, retry) = (limits.max_connections, limits.retry_after_secs);
            let mut shed = hyper::server::conn::http1::Builder::new();
            shed.timer(TokioTimer::new()).header_read_timeout(SHED_HEADER_TIMEOUT).keep_alive(false);
            let answer =
                hyper::service::service_fn(move |_request: hyper::Request<hyper::body::Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(connection_shed_response(max, retry))
                });
            let conn = shed.serve_connection(TokioIo::new(stream), answer);
            tokio::spawn(async move {
                let _ = conn.await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that went away mid-request is no server error.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(running: usize, queued: usize) -> Admission {
        Admission::new(&ServerLimits {
            max_running_requests: running,
            max_queued_requests: queued,
            ..ServerLimits::defaults()
        })
    }

    #[test]
    fn slots_are_shared_and_returned() {
        let a = admission(2, 1);
        let two = a.admit(2).unwrap();
        let one = a.admit(1).unwrap();
        let full = a.admit(1).unwrap_err();
        assert!(matches!(full, ApiError::Overloaded { in_flight: 3, retry_after_secs: 1 }), "{full:?}");
        drop(two);
        assert!(a.admit(2).is_ok());
        drop(one);
    }

    #[test]
    fn a_request_larger_than_the_whole_queue_is_a_400() {
        let err = admission(2, 1).admit(4).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err.param(), Some("n"));
    }
}
