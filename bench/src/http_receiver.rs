//! The HTTP sink's counterpart in the bench: a receiver on loopback (hyper's HTTP/1.1
//! server, keep-alive, on a thread and runtime of its own) that answers 200 at once, and
//! notes of every request its `webhook-id`, `Biz-Key` and arrival time; or, stalled, holds
//! every request unanswered until it is let go. Beside it, the bench's own keep-alive
//! client (hyper-util's pooled client), which drives the same receiver as hard as it can:
//! the limit of this machine for the sink's drain.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::{oneshot, watch};

use crate::workload::now_micros;

/// Largest body the receiver reads (a larger one is answered 413).
const MAX_BODY: usize = 1 << 20;

/// The first sighting of a `webhook-id`.
#[derive(Debug, Clone)]
pub(crate) struct Arrival {
    pub(crate) message_id: String,
    pub(crate) key: String,
    /// When the request's head was read, µs since the epoch.
    pub(crate) at_us: u64,
}

/// What the receiver got since it was last [`Receiver::take`]n.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// First sightings, in the order they arrived.
    pub(crate) first: Vec<Arrival>,
    /// Requests in all (first sightings and repeats).
    pub(crate) requests: usize,
    /// Requests whose `webhook-id` had been seen before (at-least-once resends).
    pub(crate) duplicates: usize,
    /// Requests without a `webhook-id`, or whose body could not be read (answered 4xx).
    pub(crate) bad: usize,
    /// Body bytes read.
    pub(crate) body_bytes: usize,
    seen: HashSet<String>,
}

impl Received {
    /// The last first sighting, µs since the epoch (0: none).
    pub(crate) fn last_at_us(&self) -> u64 {
        self.first.iter().map(|a| a.at_us).max().unwrap_or(0)
    }

    /// First sightings whose id starts with `prefix` (the scenario's tag).
    pub(crate) fn distinct_with(&self, prefix: &str) -> usize {
        (self.first.iter())
            .filter(|a| a.message_id.starts_with(prefix))
            .count()
    }

    /// Per-key order: among the first sightings of one key from one writer
    /// (`<tag>-<writer>-<tx>-<row>`, a writer commits one transaction at a time, so its
    /// rows of a key have a commit order), those that arrived after a later one of theirs.
    /// Rows of one key from different writers have no order the ids could show.
    pub(crate) fn order_violations(&self, tag: &str) -> usize {
        let mut last: HashMap<(&str, usize), (usize, usize)> = HashMap::new();
        let mut violations = 0;
        for a in &self.first {
            let Some(rest) = a
                .message_id
                .strip_prefix(tag)
                .and_then(|r| r.strip_prefix('-'))
            else {
                continue;
            };
            let mut parts = rest.split('-').map(|p| p.parse::<usize>().ok());
            let (Some(Some(writer)), Some(Some(tx)), Some(Some(row))) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let at = last.entry((a.key.as_str(), writer)).or_insert((tx, row));
            if (tx, row) < *at {
                violations += 1;
            } else {
                *at = (tx, row);
            }
        }
        violations
    }
}

struct Shared {
    received: Mutex<Received>,
    /// `true`: every request is held unanswered until it turns `false`.
    stalled: watch::Sender<bool>,
    /// Requests held right now.
    held: AtomicUsize,
    /// The most held at once since the last [`Receiver::take`].
    held_peak: AtomicUsize,
}

fn lock(m: &Mutex<Received>) -> MutexGuard<'_, Received> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// See the module documentation. Dropping it stops the server and its connections.
pub(crate) struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Binds a free port on 127.0.0.1 and serves on a thread of its own.
    pub(crate) fn start() -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            received: Mutex::new(Received::default()),
            stalled: watch::Sender::new(false),
            held: AtomicUsize::new(0),
            held_peak: AtomicUsize::new(0),
        });
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("the receiver's runtime")?;
        let state = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("http-receiver".into())
            .spawn(move || runtime.block_on(serve(listener, state, stopped)))?;
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>/hook`
    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Holds every request (those under way and those to come) unanswered, or lets them go.
    pub(crate) fn stall(&self, stalled: bool) {
        self.shared.stalled.send_replace(stalled);
    }

    /// Distinct `webhook-id`s starting with `prefix` received so far.
    pub(crate) fn distinct_with(&self, prefix: &str) -> usize {
        lock(&self.shared.received).distinct_with(prefix)
    }

    /// What was received since the last call, and the most requests held at once; starts
    /// afresh.
    pub(crate) fn take(&self) -> (Received, usize) {
        let peak = self.shared.held_peak.swap(0, Ordering::Relaxed);
        (std::mem::take(&mut *lock(&self.shared.received)), peak)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stall(false);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts until `stopped`; each connection served on a task of its own, all of them
/// dropped with the runtime.
async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        eprintln!("http receiver: cannot serve its socket");
        return;
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("http receiver: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(request, Arc::clone(&shared)));
            // A connection the client closed, or broke, just ends.
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Empty<Bytes>>, Infallible> {
    let at_us = now_micros();
    let header = |name: &str| {
        (request.headers().get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let id = header("webhook-id");
    let key = header("biz-key").unwrap_or_default();
    let body = Limited::new(request.into_body(), MAX_BODY).collect().await;
    let status = match (id, body) {
        (Some(id), Ok(body)) => {
            let mut received = lock(&shared.received);
            received.requests += 1;
            received.body_bytes += body.to_bytes().len();
            if received.seen.insert(id.clone()) {
                received.first.push(Arrival {
                    message_id: id,
                    key,
                    at_us,
                });
            } else {
                received.duplicates += 1;
            }
            StatusCode::OK
        }
        (None, _) => {
            lock(&shared.received).bad += 1;
            StatusCode::BAD_REQUEST
        }
        (Some(_), Err(_)) => {
            lock(&shared.received).bad += 1;
            StatusCode::PAYLOAD_TOO_LARGE
        }
    };
    if *shared.stalled.borrow() {
        let held = shared.held.fetch_add(1, Ordering::Relaxed) + 1;
        shared.held_peak.fetch_max(held, Ordering::Relaxed);
        let mut stalled = shared.stalled.subscribe();
        let _ = stalled.wait_for(|s| !*s).await;
        shared.held.fetch_sub(1, Ordering::Relaxed);
    }
    let mut response = Response::new(Empty::new());
    *response.status_mut() = status;
    Ok(response)
}

/// The bench's own keep-alive client against `url`: `requests` POSTs of `body_bytes`
/// bytes each, with the sink's headers, `concurrency` at a time over one pooled client
/// (so at most `concurrency` connections). Requests per second; an error if any request
/// failed or was not answered 200.
pub(crate) async fn drive(
    url: &str,
    requests: usize,
    concurrency: usize,
    body_bytes: usize,
    tag: &str,
) -> anyhow::Result<f64> {
    let uri: hyper::Uri = url.parse().context("the receiver's URL")?;
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let pad = "a".repeat(body_bytes.saturating_sub(10));
    let body = Bytes::from(format!("{{\"pad\":\"{pad}\"}}"));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, uri, body, next) = (client.clone(), uri.clone(), body.clone(), next.clone());
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    return anyhow::Ok(());
                }
                let id = format!("{tag}-0-{n}-0");
                let request = Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .header("webhook-id", &id)
                    .header("webhook-timestamp", (now_micros() / 1_000_000).to_string())
                    .header("idempotency-key", &id)
                    .header("message-type", "bench.limit")
                    .header("biz-key", format!("key-{}", n % 1000))
                    .body(Full::new(body.clone()))?;
                let response = client.request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                anyhow::ensure!(status == StatusCode::OK, "the receiver answered {status}");
            }
        }));
    }
    for task in tasks {
        task.await.context("client task")??;
    }
    Ok(requests as f64 / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_client_and_the_receiver_count_every_request_once() {
        let receiver = Receiver::start().unwrap();
        let rate = drive(&receiver.url(), 2000, 8, 256, "t").await.unwrap();
        assert!(rate > 0.0);
        let (got, held) = receiver.take();
        assert_eq!(got.distinct_with("t-"), 2000);
        assert_eq!(
            (got.requests, got.duplicates, got.bad, held),
            (2000, 0, 0, 0)
        );
        assert_eq!(got.body_bytes, 2000 * 256);
        assert_eq!(got.order_violations("t"), 0);
        assert_eq!(receiver.take().0.requests, 0);
    }

    #[tokio::test]
    async fn a_stalled_receiver_holds_requests_until_let_go() {
        let receiver = Receiver::start().unwrap();
        receiver.stall(true);
        let url = receiver.url();
        let client = tokio::spawn(async move { drive(&url, 4, 4, 10, "s").await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!client.is_finished());
        assert_eq!(receiver.distinct_with("s-"), 4);
        receiver.stall(false);
        client.await.unwrap().unwrap();
        let (_, held) = receiver.take();
        assert_eq!(held, 4);
    }

    #[test]
    fn order_is_checked_per_key_and_writer() {
        let arrival = |id: &str, key: &str| Arrival {
            message_id: id.into(),
            key: key.into(),
            at_us: 0,
        };
        let got = Received {
            first: vec![
                arrival("t-0-1-0", "a"),
                arrival("t-1-0-0", "a"), // another writer: no order to keep
                arrival("t-0-0-5", "b"), // another key
                arrival("t-0-0-3", "a"), // before t-0-1-0: out of order
                arrival("t-0-2-0", "a"),
            ],
            ..Received::default()
        };
        assert_eq!(got.order_violations("t"), 1);
    }

    /// The limit alone, e.g. `cargo test --release -p outboxd-bench limit_alone --
    /// --ignored --nocapture` (HTTP_LIMIT_CONCURRENCY=16,64).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, not a test"]
    async fn limit_alone() {
        let receiver = Receiver::start().unwrap();
        let list = std::env::var("HTTP_LIMIT_CONCURRENCY").unwrap_or_else(|_| "64".into());
        for c in list.split(',').filter_map(|c| c.trim().parse().ok()) {
            let rate = drive(&receiver.url(), 100_000, c, 256, "l").await.unwrap();
            let _ = receiver.take();
            println!("concurrency {c}: {rate:.0} requests/s");
        }
    }
}
