//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz` as an axum [`Router`], served
//! with hyper's HTTP/1.1 server on the `metrics.listen` address.
//!
//! [`router`] returns the routes so that other HTTP surfaces (the inbox's ingress) can be
//! merged into the same router and served on the same address; [`serve_until`] and
//! [`serve_while`] serve a router.
//!
//! Connections are driven here rather than by `axum::serve`, for the limits a probe
//! endpoint needs and `axum::serve` does not set: request heads of at most
//! [`MAX_HEAD`] read within [`IO_TIMEOUT`], at most [`MAX_CONNECTIONS`] at once, one
//! request per connection (`Connection: close`, which simple probes rely on to read to
//! the end), and every connection dropped with the server instead of left in spawned
//! tasks after the pipeline has stopped. Probes never starve: past [`MAX_CONNECTIONS`]
//! (or [`MAX_CONNECTIONS_PER_CLIENT`] from one address) a reserved budget of connections
//! answers `/healthz` and `/readyz` only, at once.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use outboxd_connector::{Connector, Secret};
use tokio::net::{TcpListener, TcpStream};

use super::health::Health;
use super::metrics;
use crate::sink::Sink;

/// Longest request head accepted (hyper's smallest read buffer).
const MAX_HEAD: usize = 8 * 1024;
/// Time allowed to receive the request head.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for a whole exchange (head, body, answer): a client that sends its body
/// slowly cannot hold a connection longer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once by the full router.
const MAX_CONNECTIONS: usize = 16;
/// Of those, at most this many from one client address: one flooding client cannot take
/// every connection from the others (a scraper, another sender).
const MAX_CONNECTIONS_PER_CLIENT: usize = 8;
/// Connections beyond those still accepted, answered by the probes-only router: `/healthz`
/// and `/readyz` at once, anything else 503. A probe never waits behind slow scrapes or an
/// ingress flood: these connections read a head (within [`IO_TIMEOUT`]), answer without
/// reading any body, and close. Past this many too, connections wait in the backlog.
const MAX_BUSY_CONNECTIONS: usize = 256;

/// Binds `addr` for [`serve_until`], with an error that names the config key.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!(
            "cannot listen on metrics.listen = \"{addr}\": {e}; choose a free address or remove \
             the [metrics] section"
        )
    })
}

/// Requires `Authorization: Bearer <token>` on every route but `/healthz` (which a
/// liveness probe must reach without credentials, and which tells nothing). Layered over
/// the inbox's routes too; the operator console, merged after it, signs its operators in
/// itself. Compared in constant time.
pub(crate) fn require_bearer(router: Router, token: Option<Secret>) -> Router {
    let Some(token) = token else {
        return router;
    };
    let expected = Arc::new(format!("Bearer {}", token.expose()).into_bytes());
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let expected = Arc::clone(&expected);
            async move {
                let given = request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .map(|v| v.as_bytes().to_vec())
                    .unwrap_or_default();
                let open = request.uri().path() == "/healthz";
                if open || same_bytes(&given, &expected) {
                    next.run(request).await
                } else {
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "unauthorized: send Authorization: Bearer <metrics.bearer_token>\n",
                    )
                        .into_response()
                }
            }
        },
    ))
}

/// Equal, in time that depends on the length only (no early exit on the first
/// difference, so the token cannot be guessed byte by byte from response times).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// `/metrics`, `/healthz` and `/readyz` over one pipeline's [`Health`]; GET and HEAD.
/// Other paths answer 404: merge further routes before serving.
pub(crate) fn router<C, S>(health: Arc<Health<C, S>>) -> Router
where
    C: Connector + 'static,
    S: Sink + 'static,
{
    Router::new()
        .route("/metrics", get(scrape::<C, S>).fallback(method_not_allowed))
        .route("/healthz", get(alive).fallback(method_not_allowed))
        .route("/readyz", get(ready::<C, S>).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(health)
}

async fn scrape<C: Connector, S: Sink>(
    State(health): State<Arc<Health<C, S>>>,
) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        health.metrics().await,
    )
}

/// Liveness: the process runs and answers.
async fn alive() -> &'static str {
    "ok\n"
}

async fn ready<C: Connector, S: Sink>(
    State(health): State<Arc<Health<C, S>>>,
) -> impl IntoResponse {
    match health.readiness().await {
        Ok(text) => (StatusCode::OK, text),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        "not found; try /metrics, /healthz or /readyz\n",
    )
}

async fn method_not_allowed() -> impl IntoResponse {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "GET, HEAD")],
        "only GET and HEAD\n",
    )
}

/// Runs `work` to completion with `router` answering on `listener` beside it; the server
/// stops when `work` is done. Without a listener, just `work`.
///
/// The server runs on a thread of its own, with its own single-threaded runtime: accepting
/// connections, reading heads and bodies (1 MiB per inbox request) and answering never
/// take turns with the relay on its runtime thread, so a flood of requests costs the relay
/// only what it costs the machine. What the routes share with the pipeline (counters, the
/// sink, the inbox's store) is thread-safe; a database connection opened by a route runs
/// on this thread too. Should the listener or the thread not be set up (resources
/// exhausted), that is logged and `work` runs unserved. A panic on the server's thread
/// ends the process, as a panic on the pipeline's runtime does: a supervisor restarts it
/// whole rather than leave it running without its probes.
pub(crate) async fn serve_while<T>(
    listener: Option<TcpListener>,
    router: Router,
    work: impl Future<Output = T>,
) -> T {
    let Some(listener) = listener else {
        return work.await;
    };
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    let std_listener = match listener.into_std() {
        Ok(std_listener) => std_listener,
        Err(e) => {
            tracing::error!(error = %e, "metrics listener: cannot be moved to its thread; not serving");
            return work.await;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("outboxd-http".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "metrics listener: cannot start its runtime");
                    return;
                }
            };
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.block_on(async move {
                    match TcpListener::from_std(std_listener) {
                        Ok(listener) => {
                            serve_until(listener, router, async {
                                let _ = stopped.await;
                            })
                            .await;
                        }
                        Err(e) => tracing::error!(error = %e, "metrics listener: cannot listen"),
                    }
                });
            }));
            if served.is_err() {
                tracing::error!("the HTTP endpoint's thread panicked; stopping the process");
                std::process::abort();
            }
        });
    let result = work.await;
    drop(done);
    if let Ok(thread) = spawned {
        // Joined off the runtime: the server closes its connections and ends promptly.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    } else {
        tracing::error!("metrics listener: its thread could not be started; not serving");
    }
    result
}

/// Accepts connections on `listener` and answers them with `router` until `shutdown`
/// completes; connections still open then are closed.
pub(crate) async fn serve_until(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = pin!(shutdown);
    let mut connections = FuturesUnordered::new();
    let mut busy_connections = FuturesUnordered::new();
    let mut per_client: HashMap<IpAddr, usize> = HashMap::new();
    let busy = probes_only(router.clone());
    loop {
        let room = busy_connections.len() < MAX_BUSY_CONNECTIONS;
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept(), if room => match accepted {
                Ok((stream, peer)) => {
                    let client = peer.ip();
                    let theirs = per_client.get(&client).copied().unwrap_or(0);
                    if connections.len() < MAX_CONNECTIONS && theirs < MAX_CONNECTIONS_PER_CLIENT {
                        *per_client.entry(client).or_default() += 1;
                        let served = serve_connection(stream, router.clone());
                        connections.push(async move {
                            served.await;
                            client
                        });
                    } else {
                        busy_connections.push(serve_connection(stream, busy.clone()));
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(client) = connections.next(), if !connections.is_empty() => {
                if let Some(count) = per_client.get_mut(&client) {
                    *count -= 1;
                    if *count == 0 {
                        per_client.remove(&client);
                    }
                }
            }
            Some(()) = busy_connections.next(), if !busy_connections.is_empty() => {}
        }
    }
}

/// What answers while the full router's connections are taken (or the client holds its
/// share): the probes only, through the same router (so `/readyz` keeps its bearer token),
/// and 503 for anything else without reading its body.
fn probes_only(router: Router) -> Router {
    router.layer(axum::middleware::from_fn(
        |request: axum::extract::Request, next: axum::middleware::Next| async move {
            let path = request.uri().path();
            if path == "/healthz" || path == "/readyz" {
                next.run(request).await
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "1")],
                    "busy: every connection is taken; try again\n",
                )
                    .into_response()
            }
        },
    ))
}

/// One request on one connection, then close.
async fn serve_connection(stream: TcpStream, router: Router) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false);
    let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    match tokio::time::timeout(EXCHANGE_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "metrics listener: connection ended with an error")
        }
        Err(_) => {
            tracing::debug!(timeout = ?EXCHANGE_TIMEOUT, "metrics listener: exchange took too long; closed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `request` raw and reads the whole reply (the server closes the connection).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        exchange_from("127.0.0.1", addr, request).await
    }

    fn routes() -> Router {
        Router::new()
            .route("/healthz", get(alive).fallback(method_not_allowed))
            .route(
                "/echo",
                get(|| async { "you asked for /echo" }).fallback(method_not_allowed),
            )
            .fallback(not_found)
    }

    #[tokio::test]
    async fn liveness_answers_while_every_connection_is_held_by_slow_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = routes().route("/slow", get(std::future::pending::<&'static str>));
        let client = async {
            // Hold every connection of the full router with requests that never finish.
            let mut held = Vec::new();
            for _ in 0..MAX_CONNECTIONS {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream
                    .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                held.push(stream);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let started = std::time::Instant::now();
            let reply = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
            assert!(started.elapsed() < Duration::from_secs(2));
            let reply = exchange(addr, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 503 "), "{reply}");
            drop(held);
        };
        tokio::select! {
            () = serve_until(listener, router, std::future::pending()) => unreachable!(),
            () = client => {}
        }
    }

    /// Sends `request` raw from `from` (a loopback address of the client's choosing).
    async fn exchange_from(from: &str, addr: SocketAddr, request: &[u8]) -> String {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let mut stream = socket.connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        reply
    }

    /// One client holding its share of connections gets only the probes on more; another
    /// client is still served in full, and the probes answer everyone.
    #[tokio::test]
    async fn one_client_cannot_take_every_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = routes()
            .route("/slow", get(std::future::pending::<&'static str>))
            .route("/readyz", get(|| async { "ready\n" }));
        let client = async {
            let mut held = Vec::new();
            for _ in 0..MAX_CONNECTIONS_PER_CLIENT {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                stream
                    .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                held.push(stream);
            }
            // No wait needed: the server counts a client's connections as it accepts
            // them, in the order they were made, so these are counted before the next.
            let echo = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n";
            let reply = exchange_from("127.0.0.1", addr, echo).await;
            assert!(reply.starts_with("HTTP/1.1 503 "), "{reply}");
            for probe in ["/healthz", "/readyz"] {
                let request = format!("GET {probe} HTTP/1.1\r\nHost: x\r\n\r\n");
                let reply = exchange_from("127.0.0.1", addr, request.as_bytes()).await;
                assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{probe}: {reply}");
            }
            let reply = exchange_from("127.0.0.2", addr, echo).await;
            assert!(
                reply.starts_with("HTTP/1.1 200 OK\r\n"),
                "another client: {reply}"
            );
            drop(held);
        };
        tokio::select! {
            () = serve_until(listener, router, std::future::pending()) => unreachable!(),
            () = client => {}
        }
    }

    #[tokio::test]
    async fn a_bearer_token_guards_every_route_but_liveness() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = require_bearer(routes(), Some(Secret::new("s3cr3t-token")));
        let client = async {
            let reply = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
            for auth in [
                "",
                "Authorization: Bearer wrong\r\n",
                "Authorization: s3cr3t-token\r\n",
            ] {
                let request = format!("GET /echo HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
                let reply = exchange(addr, request.as_bytes()).await;
                assert!(reply.starts_with("HTTP/1.1 401 "), "{auth}: {reply}");
                assert!(
                    !reply.contains("s3cr3t"),
                    "the token is never echoed: {reply}"
                );
            }
            let reply = exchange(
                addr,
                b"GET /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cr3t-token\r\n\r\n",
            )
            .await;
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        };
        tokio::select! {
            () = serve_until(listener, router, std::future::pending()) => unreachable!(),
            () = client => {}
        }
        assert!(
            same_bytes(b"abc", b"abc") && !same_bytes(b"abc", b"abd") && !same_bytes(b"ab", b"abc")
        );
    }

    #[tokio::test]
    async fn serves_get_and_head_and_survives_garbage() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = async {
            // Garbage and an early close do not stop the server.
            let reply = exchange(addr, b"\x00\x01\x02 nonsense\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
            drop(TcpStream::connect(addr).await.unwrap());

            let reply = exchange(addr, b"GET /healthz?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
            let lower = reply.to_ascii_lowercase();
            assert!(lower.contains("\r\nconnection: close\r\n"), "{reply}");
            assert!(
                lower.contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"),
                "{reply}"
            );
            assert!(reply.ends_with("\r\n\r\nok\n"), "{reply}");

            // HEAD: the same head, no body.
            let reply = exchange(addr, b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
            assert!(
                reply
                    .to_ascii_lowercase()
                    .contains("\r\ncontent-length: 19\r\n"),
                "{reply}"
            );
            assert!(reply.ends_with("\r\n\r\n"), "{reply}");

            // HTTP/1.0 clients are answered too.
            let reply = exchange(addr, b"GET /echo HTTP/1.0\r\n\r\n").await;
            assert!(reply.ends_with("\r\n\r\nyou asked for /echo"), "{reply}");

            let reply = exchange(addr, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
            assert!(reply.ends_with("only GET and HEAD\n"), "{reply}");

            let reply = exchange(addr, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").await;
            assert!(reply.starts_with("HTTP/1.1 404 "), "{reply}");

            // A head larger than the limit is refused, not buffered.
            let mut big = b"GET /healthz HTTP/1.1\r\nX-Big: ".to_vec();
            big.extend(std::iter::repeat_n(b'a', 2 * MAX_HEAD));
            big.extend_from_slice(b"\r\n\r\n");
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let _ = stream.write_all(&big).await;
            let mut reply = Vec::new();
            let _ = stream.read_to_end(&mut reply).await;
            let reply = String::from_utf8_lossy(&reply);
            assert!(
                reply.is_empty() || reply.starts_with("HTTP/1.1 431 "),
                "{reply}"
            );
        };
        serve_while(Some(listener), routes(), client).await;
    }

    #[tokio::test]
    async fn a_silent_client_does_not_block_others() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = async {
            // More silent connections than the limit: the head timeout closes them.
            let mut silent = Vec::new();
            for _ in 0..MAX_CONNECTIONS + 2 {
                silent.push(TcpStream::connect(addr).await.unwrap());
            }
            let reply = tokio::time::timeout(
                IO_TIMEOUT * 3,
                exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            )
            .await
            .expect("answered once the silent connections timed out");
            assert!(reply.ends_with("\r\n\r\nok\n"), "{reply}");
        };
        serve_while(Some(listener), routes(), client).await;
    }

    #[tokio::test]
    async fn without_a_listener_only_the_work_runs() {
        assert_eq!(serve_while(None, routes(), async { 7 }).await, 7);
    }
}
