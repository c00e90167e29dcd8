//! A real HTTP server on loopback for the HTTP sink's tests: its own unit tests
//! (`sink/http/tests.rs`) and the conformance harness (`http.rs` here) both send to it, so
//! it lives once, here. axum's router served by [`crate::observability::serve_while`], as
//! outboxd serves its own endpoint: real sockets, real HTTP/1.1, nothing mocked.
//!
//! It records every request, answers with a chosen status (or 500 / 422 for chosen
//! message ids), after a chosen delay, and counts requests in flight per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;

/// What the server saw and how it answers.
#[derive(Default)]
pub(crate) struct Server {
    /// Every request, in arrival order: its headers and body.
    pub(crate) requests: Mutex<Vec<(HeaderMap, Bytes)>>,
    /// The `webhook-id` of every request answered 2xx, in the order of the answers: what
    /// the receiver took.
    pub(crate) accepted: Mutex<Vec<String>>,
    /// The status of every answer (200 unless set).
    pub(crate) status: AtomicU16,
    /// How long each answer takes, in milliseconds.
    pub(crate) delay_ms: AtomicU16,
    /// Message ids answered 500 whatever `status` says.
    pub(crate) failing: Mutex<Vec<String>>,
    /// Message ids answered 422 (refused for good) whatever `status` says.
    pub(crate) refusing: Mutex<Vec<String>>,
    /// Requests being answered now, per key, and the most seen at once.
    in_flight: Mutex<BTreeMap<String, usize>>,
    pub(crate) most_per_key: AtomicUsize,
    pub(crate) most_at_once: AtomicUsize,
}

async fn receive(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let key = header(&headers, "biz-key");
    let id = header(&headers, "webhook-id");
    {
        let mut in_flight = lock(&server.in_flight);
        *in_flight.entry(key.clone()).or_default() += 1;
        let per_key = in_flight.values().copied().max().unwrap_or(0);
        let at_once: usize = in_flight.values().sum();
        server.most_per_key.fetch_max(per_key, Ordering::SeqCst);
        server.most_at_once.fetch_max(at_once, Ordering::SeqCst);
    }
    lock(&server.requests).push((headers, body));
    let delay = server.delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(u64::from(delay))).await;
    if let Some(count) = lock(&server.in_flight).get_mut(&key) {
        *count -= 1;
    }
    if lock(&server.failing).contains(&id) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "try later".into());
    }
    if lock(&server.refusing).contains(&id) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("answer 422: {id} is not acceptable"),
        );
    }
    let status = match server.status.load(Ordering::SeqCst) {
        0 => StatusCode::OK,
        code => StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    if status.is_success() {
        lock(&server.accepted).push(id.clone());
    }
    (status, format!("answer {status} for {id}"))
}

/// The value of header `name`, or "".
pub(crate) fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Starts `server` on a free loopback port; returns the URL the sink posts to
/// (`/hooks/orders`).
pub(crate) async fn start(server: &Arc<Server>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let app = Router::new()
        .route("/hooks/{rest}", post(receive))
        .with_state(Arc::clone(server));
    // Served as outboxd serves its own endpoint (its thread, hyper under axum's router).
    tokio::spawn(crate::observability::serve_while(
        Some(listener),
        app,
        std::future::pending::<()>(),
    ));
    format!("http://127.0.0.1:{port}/hooks/orders")
}

/// A loopback port nothing listens at (bound a moment ago and closed).
pub(crate) fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// A loopback URL nothing listens at.
pub(crate) fn closed_url() -> String {
    format!("http://127.0.0.1:{}/hooks/x", closed_port())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
