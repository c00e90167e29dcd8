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
//!   answers. Any answer but those (2xx, another 4xx) closes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue};
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::sink::{FailureKind, Receipt, SinkFailure, SinkResult};
use crate::webhooks::client::{Answer, Poster};
use crate::webhooks::signature::{signature_header, Secret};

/// The longest pause between two probes of an endpoint taken for down.
pub(super) const MAX_PROBE_PAUSE: Duration = Duration::from_secs(30);
/// The pause before the first probe.
const FIRST_PROBE_PAUSE: Duration = Duration::from_secs(1);

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
    /// Per key: the last request handed over.
    keys: Mutex<HashMap<Bytes, LastOfKey>>,
    next_seq: AtomicU64,
    breaker: Breaker,
}

impl Endpoint {
    pub(super) fn new(
        name: &str,
        poster: Poster,
        secrets: Vec<Secret>,
        concurrency: usize,
        open_after: u32,
        strict: bool,
    ) -> Self {
        Self {
            name: name.to_owned(),
            poster,
            secrets,
            strict,
            slots: Semaphore::new(concurrency),
            keys: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(0),
            breaker: Breaker::new(open_after),
        }
    }

    /// The URL as logs show it.
    pub(super) fn shown(&self) -> &str {
        self.poster.shown()
    }

    /// Whether the endpoint is taken for down (its circuit breaker holds its requests).
    pub(super) fn is_down(&self) -> bool {
        lock(&self.breaker.state).open
    }

    /// The client (for `check`).
    pub(super) fn poster(&self) -> &Poster {
        &self.poster
    }

    /// Queues `request` behind the last one of its key and returns where its outcome will
    /// arrive. The request runs on a task of its own: a caller that stops waiting (a
    /// claim's deadline) leaves it to finish, which makes a duplicate at worst, never a
    /// reorder.
    pub(super) fn enqueue(self: &Arc<Self>, request: Prepared) -> oneshot::Receiver<SinkResult> {
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let (done_tx, done_rx) = watch::channel(None);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let previous = lock(&self.keys)
            .insert(request.key.clone(), (seq, done_rx))
            .map(|(_, rx)| rx);
        let endpoint = Arc::clone(self);
        tokio::spawn(async move {
            let key = request.key.clone();
            let result = endpoint.deliver_after(previous, request).await;
            done_tx.send_replace(Some(result.is_ok()));
            let mut keys = lock(&endpoint.keys);
            if keys.get(&key).is_some_and(|(last, _)| *last == seq) {
                keys.remove(&key);
            }
            drop(keys);
            let _ = outcome_tx.send(result);
        });
        outcome_rx
    }

    async fn deliver_after(
        &self,
        previous: Option<watch::Receiver<Option<bool>>>,
        request: Prepared,
    ) -> SinkResult {
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
                });
            }
        }
        let Ok(_slot) = self.slots.acquire().await else {
            return Err(SinkFailure {
                kind: FailureKind::Fatal,
                error: format!("endpoint `{}` is closed", self.name),
            });
        };
        let probe = self.breaker.admit(&self.name).await;
        let answer = self.post(request).await;
        let up = !matches!(answer, Answer::Retry { .. });
        self.breaker.record(&self.name, self.shown(), probe, up);
        match answer {
            Answer::Accepted { status, latency } => Ok(Receipt {
                partition: i32::from(status),
                offset: i64::try_from(latency.as_millis()).unwrap_or(i64::MAX),
            }),
            Answer::Retry { error, .. } => Err(SinkFailure {
                kind: FailureKind::Retryable,
                error,
            }),
            Answer::Refused { error } => Err(SinkFailure {
                kind: FailureKind::Rejected,
                error,
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
                state.next_probe
            };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wait_until) => {}
            }
        }
    }

    /// What an attempt showed: `up` when the endpoint answered (anything but no answer,
    /// 408/425/429 or 5xx).
    fn record(&self, name: &str, shown: &str, probe: bool, up: bool) {
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
            return;
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
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
