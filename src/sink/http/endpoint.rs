//! One endpoint of the HTTP sink: its client and signing secrets, and the three rules
//! that keep its deliveries in order and its outages contained:
//!
//! - **One request per key at a time.** A key's requests go out in send order, each once
//!   the one before it has its answer. Under strict ordering a key's request whose
//!   predecessor failed is not sent at all (it fails too, as retryable): sending it would
//!   deliver it before the failed one's retry.
//! - **At most `concurrency` requests at once** (other keys in parallel).
//! - **A circuit breaker.** After `open_after` failed attempts in a row (no answer, or
//!   408/425/429/5xx), the endpoint is taken for down: its requests wait instead of
//!   failing (their rows keep their attempts, as during a Kafka outage), and one request
//!   at a time probes it, with a pause that doubles up to [`MAX_PROBE_PAUSE`], until it
//!   answers. Any answer but those (2xx, another 4xx) closes it. Once its queue is full
//!   (see [`MAX_QUEUED`]), `send` does not wait for room: the event fails at once, as
//!   retryable (see [`Endpoint::reserve`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue};
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::time::Instant;

use super::config::EndpointConfig;
use crate::observability::endpoint_metrics::EndpointSeries;
use crate::sink::{FailureKind, Receipt, SinkFailure, SinkResult};
use crate::webhooks::client::{Answer, Poster};
use crate::webhooks::signature::{signature_header, Secret};

/// The longest pause between two probes of an endpoint taken for down.
pub(super) const MAX_PROBE_PAUSE: Duration = Duration::from_secs(30);
/// The pause before the first probe.
const FIRST_PROBE_PAUSE: Duration = Duration::from_secs(1);
/// At most this many requests wait at an endpoint (or 8 per slot of `concurrency`, when
/// more); past it `send` waits, as on a full Kafka producer queue, while the endpoint is up
/// (its requests end within `http.timeout`). Each waiting request is a task with its
/// request (a few kB): unbounded, `delivery.max_in_flight` of them (10,000) were most of
/// the sink's memory. Not fewer: while an endpoint is down its requests wait here, and the
/// log relay reads on (other endpoints' rows go) until it is full; then its events fail at
/// once instead of waiting (see [`Endpoint::reserve`]).
const MAX_QUEUED: usize = 1024;
/// See [`MAX_QUEUED`].
const QUEUED_PER_SLOT: usize = 8;

/// A request handed to the endpoint: its outcome, and what to forget once it is taken.
pub(super) struct Queued {
    outcome: oneshot::Receiver<SinkResult>,
    endpoint: Arc<Endpoint>,
    key: Bytes,
    seq: u64,
}

impl Queued {
    /// Polls for the outcome; once it is in, the key's chain lets go of the request.
    pub(super) fn poll_outcome(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<SinkResult> {
        use std::future::Future;
        let result = match std::pin::Pin::new(&mut self.outcome).poll(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(Ok(result)) => result,
            std::task::Poll::Ready(Err(_)) => Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: "the HTTP request's task ended without an outcome".into(),
                retry_after: None,
            }),
        };
        self.endpoint.forget(&self.key, self.seq);
        std::task::Poll::Ready(result)
    }

    /// The caller stops waiting. If the outcome is in already, it counts as taken; if not,
    /// the task sees nobody waits (it is not sent if its turn has not come) and forgets.
    pub(super) fn abandon(&mut self) {
        self.outcome.close();
        if self.outcome.try_recv().is_ok() {
            self.endpoint.forget(&self.key, self.seq);
        }
    }
}

/// A request ready to go but for its signature, which is made when it is sent (its
/// timestamp must be fresh at the receiver, however long it waited for its key).
pub(super) struct Prepared {
    pub(super) key: Bytes,
    pub(super) message_id: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

/// The last request of a key: its sequence number, and the watch that says how it
/// ended (`Some(true)` delivered, `Some(false)` not).
type LastOfKey = (u64, watch::Receiver<Option<bool>>);

/// See the module documentation.
pub(super) struct Endpoint {
    name: String,
    poster: Poster,
    secrets: Vec<Secret>,
    strict: bool,
    slots: Semaphore,
    /// `max_queued_bytes`, as permits: one per byte of a request until its outcome.
    queued_bytes: Arc<Semaphore>,
    max_queued_bytes: usize,
    /// The fewest bytes a request counts for: `max_queued_bytes` over [`MAX_QUEUED`] (or
    /// [`QUEUED_PER_SLOT`] × `concurrency`), so that at most that many requests wait.
    least_bytes: usize,
    /// The most requests that wait (for the error of a full queue).
    max_queued: usize,
    /// Per key: the last request handed over.
    keys: Mutex<HashMap<Bytes, LastOfKey>>,
    next_seq: AtomicU64,
    breaker: Breaker,
    series: EndpointSeries,
    /// Where the requests' tasks run: the sink's own runtime thread (see `io_thread.rs`).
    io: tokio::runtime::Handle,
}

impl Endpoint {
    /// The endpoint `name` of `config` (its limits: `concurrency`, `open_after`,
    /// `max_queued_bytes`), sending with `poster`, signing with `secrets`.
    pub(super) fn new(
        name: &str,
        config: &EndpointConfig,
        poster: Poster,
        secrets: Vec<Secret>,
        strict: bool,
        series: EndpointSeries,
        io: tokio::runtime::Handle,
    ) -> Self {
        Self {
            name: name.to_owned(),
            poster,
            secrets,
            strict,
            slots: Semaphore::new(config.concurrency),
            queued_bytes: Arc::new(Semaphore::new(config.max_queued_bytes)),
            max_queued_bytes: config.max_queued_bytes,
            least_bytes: config.max_queued_bytes
                / MAX_QUEUED.max(QUEUED_PER_SLOT * config.concurrency),
            max_queued: MAX_QUEUED.max(QUEUED_PER_SLOT * config.concurrency),
            keys: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(0),
            breaker: Breaker::new(config.open_after),
            series,
            io,
        }
    }

    /// The URL as logs show it.
    pub(super) fn shown(&self) -> &str {
        self.poster.shown()
    }

    /// Waits until `bytes` more fit under `max_queued_bytes` (a request larger than the
    /// whole bound waits for the queue to empty, then goes alone; a small one counts as
    /// `least_bytes`); the permit travels with the request until its outcome.
    ///
    /// Only while the endpoint is up: its requests end within `http.timeout`, so the wait
    /// is short. While it is taken for down its requests wait for it to answer, maybe for
    /// hours, and waiting for room would stall the caller as long: the claim worker (every
    /// endpoint's retries), a poll batch larger than the queue (waiting on itself), the log
    /// relay (deaf to shutdown). So with the endpoint down and no room, or once it is taken
    /// for down during the wait, the request is not queued: a retryable failure, and the
    /// row is tried again with its backoff.
    pub(super) async fn reserve(
        &self,
        bytes: usize,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, SinkFailure> {
        let counted = bytes.max(self.least_bytes).clamp(1, self.max_queued_bytes);
        let wanted = u32::try_from(counted).unwrap_or(u32::MAX);
        loop {
            // Made before looking at the breaker, so an opening right after the look still
            // wakes this wait (`notify_waiters` reaches every `Notified` made before it).
            let changed = self.breaker.changed.notified();
            match Arc::clone(&self.queued_bytes).try_acquire_many_owned(wanted) {
                Ok(permit) => return Ok(Some(permit)),
                Err(tokio::sync::TryAcquireError::Closed) => return Ok(None),
                Err(tokio::sync::TryAcquireError::NoPermits) => {}
            }
            if self.breaker.is_open() {
                return Err(SinkFailure {
                    kind: FailureKind::Retryable,
                    error: format!(
                        "not sent: endpoint `{}` is taken for down and its queue is full \
                         (up to {} requests, or max_queued_bytes, already wait for it); it is \
                         tried again with the row's backoff",
                        self.name, self.max_queued
                    ),
                    retry_after: None,
                });
            }
            tokio::select! {
                permit = Arc::clone(&self.queued_bytes).acquire_many_owned(wanted) => {
                    return Ok(permit.ok());
                }
                // The breaker changed (opened, most likely): look again.
                () = changed => {}
            }
        }
    }

    /// A request that failed before it was queued (no room at an endpoint taken for
    /// down): it still takes its place as the last request of its key, not delivered, so
    /// that under strict ordering the key's later requests are not sent before its retry
    /// (a smaller one may find room where it did not).
    pub(super) fn failed_before_queued(
        self: &Arc<Self>,
        key: Bytes,
        failure: SinkFailure,
    ) -> Queued {
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let (_done_tx, done_rx) = watch::channel(Some(false));
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.keys).insert(key.clone(), (seq, done_rx));
        // The receiver is right here: the send cannot fail.
        let _ = outcome_tx.send(Err(failure));
        Queued {
            outcome: outcome_rx,
            endpoint: Arc::clone(self),
            key,
            seq,
        }
    }

    /// The client (for `check`).
    pub(super) fn poster(&self) -> &Poster {
        &self.poster
    }

    /// Queues `request` behind the last one of its key; its outcome arrives through the
    /// returned [`Queued`]. The request runs on a task of its own. While it waits for its
    /// turn (its key's previous request, a slot, the circuit breaker), a caller that stops
    /// waiting (a claim's deadline) cancels it: it is not sent, and counts as not
    /// delivered for its key's later requests. Once sent, it runs to its answer.
    /// `in_flight` counts it until its outcome is decided (answered, or not sent): what `flush` and
    /// `queue_depth` see, whether or not anyone still waits for its outcome.
    pub(super) fn enqueue(
        self: &Arc<Self>,
        request: Prepared,
        in_flight: Arc<AtomicI64>,
        bytes: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Queued {
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (mut outcome_tx, outcome_rx) = oneshot::channel();
        let (done_tx, done_rx) = watch::channel(None);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let key = request.key.clone();
        let previous = lock(&self.keys)
            .insert(key.clone(), (seq, done_rx))
            .map(|(_, rx)| rx);
        let endpoint = Arc::clone(self);
        let task_key = key.clone();
        self.io.spawn(async move {
            let turn = tokio::select! {
                turn = endpoint.wait_turn(previous) => Some(turn),
                () = outcome_tx.closed() => None,
            };
            let result = match turn {
                None => Err(SinkFailure {
                    kind: FailureKind::Retryable,
                    error: "not sent: nothing waits for its outcome any more".into(),
                    retry_after: None,
                }),
                Some(Err(failure)) => Err(failure),
                // Boxed: the request's state (hyper's send) is allocated only once it is
                // sent, not by each of the many tasks waiting for their turn.
                Some(Ok((_slot, probe))) => {
                    Box::pin(endpoint.post_and_record(request, probe)).await
                }
            };
            done_tx.send_replace(Some(result.is_ok()));
            // Counted out before the outcome is handed over (the caller may be on another
            // thread and look at once), and its bytes given back.
            in_flight.fetch_sub(1, Ordering::Relaxed);
            drop(bytes);
            // Nobody takes the outcome: the key's entry is this task's to forget.
            if outcome_tx.send(result).is_err() {
                endpoint.forget(&task_key, seq);
            }
        });
        Queued {
            outcome: outcome_rx,
            endpoint: Arc::clone(self),
            key,
            seq,
        }
    }

    /// Drops the key's entry if `seq` is still its last request. Only once its outcome was
    /// taken (or nobody waits for it): until the relay has seen a failure and holds the
    /// key back, a later request of the key must find the failed one and not be sent.
    fn forget(&self, key: &Bytes, seq: u64) {
        let mut keys = lock(&self.keys);
        if keys.get(key).is_some_and(|(last, _)| *last == seq) {
            keys.remove(key);
        }
    }

    /// Waits for the request's turn: its key's previous request answered (under strict
    /// ordering, delivered), a slot, and the circuit breaker's leave. The slot's permit and
    /// whether this request is the breaker's probe.
    async fn wait_turn(
        &self,
        previous: Option<watch::Receiver<Option<bool>>>,
    ) -> Result<(tokio::sync::SemaphorePermit<'_>, bool), SinkFailure> {
        if let Some(mut previous) = previous {
            // A task that ended without saying (it cannot: it always sends) counts as failed.
            let delivered = matches!(
                previous.wait_for(Option::is_some).await.as_deref(),
                Ok(Some(true))
            );
            if !delivered && self.strict {
                return Err(SinkFailure {
                    kind: FailureKind::Retryable,
                    error: format!(
                        "not sent: an earlier event of its key to endpoint `{}` was not \
                         delivered (strict ordering sends it after that one)",
                        self.name
                    ),
                    retry_after: None,
                });
            }
        }
        let Ok(slot) = self.slots.acquire().await else {
            return Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: format!("endpoint `{}` is closed", self.name),
                retry_after: None,
            });
        };
        let probe = self.breaker.admit(&self.name).await;
        Ok((slot, probe))
    }

    /// POSTs, tells the breaker and the endpoint's series what the answer showed, and
    /// maps the answer.
    async fn post_and_record(&self, request: Prepared, probe: bool) -> SinkResult {
        let sent = self.series.sending();
        let started = Instant::now();
        let answer = self.post(request).await;
        self.series
            .answered(answer.status(), started.elapsed().as_secs_f64());
        drop(sent);
        let up = !matches!(answer, Answer::Retry { .. });
        let open = self.breaker.record(&self.name, self.shown(), probe, up);
        self.series.set_up(!open);
        match answer {
            Answer::Accepted { status, latency } => Ok(Receipt {
                partition: i32::from(status),
                offset: i64::try_from(latency.as_millis()).unwrap_or(i64::MAX),
            }),
            Answer::Retry { error, after, .. } => Err(SinkFailure {
                kind: FailureKind::Retryable,
                error,
                retry_after: after,
            }),
            Answer::Refused { error, .. } => Err(SinkFailure {
                kind: FailureKind::Refused,
                error,
                retry_after: None,
            }),
        }
    }

    /// Signs (when the endpoint has secrets) and POSTs.
    async fn post(&self, request: Prepared) -> Answer {
        let Prepared {
            message_id,
            mut headers,
            body,
            ..
        } = request;
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if let Ok(value) = HeaderValue::from_str(&timestamp.to_string()) {
            headers.insert("webhook-timestamp", value);
        }
        if !self.secrets.is_empty() {
            let signature = signature_header(&self.secrets, &message_id, timestamp, &body);
            if let Ok(value) = HeaderValue::from_str(&signature) {
                headers.insert("webhook-signature", value);
            }
        }
        self.poster.post(headers, body, &[]).await
    }
}

/// See the module documentation.
struct Breaker {
    open_after: u32,
    state: Mutex<BreakerState>,
    changed: Notify,
}

struct BreakerState {
    /// Failed attempts in a row.
    failures: u32,
    open: bool,
    /// A probe is under way.
    probing: bool,
    next_probe: Instant,
    pause: Duration,
}

impl Breaker {
    fn new(open_after: u32) -> Self {
        Self {
            open_after,
            state: Mutex::new(BreakerState {
                failures: 0,
                open: false,
                probing: false,
                next_probe: Instant::now(),
                pause: FIRST_PROBE_PAUSE,
            }),
            changed: Notify::new(),
        }
    }

    /// Whether the endpoint is taken for down now.
    fn is_open(&self) -> bool {
        lock(&self.state).open
    }

    /// Waits until a request may go: at once while the endpoint is up; while it is taken
    /// for down, until this request is the probe (`true`) or the endpoint is up again.
    async fn admit(&self, name: &str) -> bool {
        loop {
            let changed = self.changed.notified();
            let wait_until = {
                let mut state = lock(&self.state);
                if !state.open {
                    return false;
                }
                if !state.probing && Instant::now() >= state.next_probe {
                    state.probing = true;
                    tracing::debug!(endpoint = name, "probing an endpoint taken for down");
                    return true;
                }
                // While a probe is under way only its answer can change anything: no timer
                // (its `next_probe` is past, and would wake this loop at once, again and
                // again).
                (!state.probing).then_some(state.next_probe)
            };
            match wait_until {
                Some(at) => tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep_until(at) => {}
                },
                None => changed.await,
            }
        }
    }

    /// What an attempt showed: `up` when the endpoint answered (anything but no answer,
    /// 408/425/429 or 5xx). Whether the endpoint is taken for down now.
    fn record(&self, name: &str, shown: &str, probe: bool, up: bool) -> bool {
        let mut state = lock(&self.state);
        if up {
            state.failures = 0;
            state.probing = false;
            if state.open {
                state.open = false;
                state.pause = FIRST_PROBE_PAUSE;
                tracing::info!(
                    endpoint = name,
                    url = shown,
                    "the endpoint answers again; its waiting rows go"
                );
                self.changed.notify_waiters();
            }
            return false;
        }
        state.failures = state.failures.saturating_add(1);
        if probe {
            state.probing = false;
            state.pause = (state.pause * 2).min(MAX_PROBE_PAUSE);
            state.next_probe = Instant::now() + state.pause;
            self.changed.notify_waiters();
        } else if !state.open && state.failures >= self.open_after {
            state.open = true;
            state.pause = FIRST_PROBE_PAUSE;
            state.next_probe = Instant::now() + state.pause;
            tracing::warn!(
                endpoint = name,
                url = shown,
                failures = state.failures,
                "the endpoint failed this many times in a row and is taken for down: its rows \
                 wait (their attempts are kept) while one request at a time probes it"
            );
            // Wakes the sends waiting for room in its queue (`Endpoint::reserve`): with the
            // endpoint down, room may not come for hours, and they stop waiting.
            self.changed.notify_waiters();
        }
        state.open
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
