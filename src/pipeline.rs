//! Source → Kafka → write-back → checkpoint.
//!
//! One session reads committed transactions from a [`ChangeStream`], hands each outbox
//! event to the [`Publisher`], and, as acknowledgements come back, writes the rows'
//! statuses back in batches. The log position is confirmed only past the longest prefix
//! of transactions whose every event is acknowledged (or marked FAILED) **and** written
//! back: that is what makes delivery at-least-once across crashes.
//!
//! [`run`] wraps sessions in a loop that reconnects after transient errors (including
//! "another outboxd holds the slot", which is how a standby takes over) and stops on
//! definite ones or on shutdown.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use outboxd_connector::{
    ChangeItem, ChangeStream, CommittedTransaction, Connector, ConnectorError, Delivered,
    DeliveryFailure, OutboxEvent, OutboxStore, ParkedEvent, Position, WriteBack,
};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::sleep_until;

use crate::config::{DeliveryConfig, Ordering as KeyOrdering, RetryConfig};
use crate::kafka::{DeliveryOutcome, PendingDelivery, Publisher};
use crate::retry::{next_retry_delay, wait_or_shutdown, ReconnectBackoff};

/// Counters of a running pipeline, shared with status reporting and metrics.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Events acknowledged by Kafka and written back SUCCESS.
    pub published: AtomicU64,
    /// Events written back FAILED or MANUAL_REQUIRED.
    pub failed: AtomicU64,
    /// Committed transactions read from the log.
    pub transactions: AtomicU64,
    /// Events read from the log and not yet written back.
    pub in_flight: AtomicU64,
    /// Events parked by strict ordering behind an earlier event of their key.
    pub parked: AtomicU64,
    /// Claimed rows the retry worker (or poll mode) published successfully.
    pub retried: AtomicU64,
    /// Claimed rows that failed again.
    pub retry_failed: AtomicU64,
    /// Rows the reaper returned from an abandoned PROCESSING claim.
    pub reaped: AtomicU64,
    /// The last position confirmed to the source.
    pub confirmed: Mutex<Option<Position>>,
    /// True while a log session is open (`/readyz`).
    pub streaming: AtomicBool,
    /// Outcomes by topic, publish latency, lag and checkpoint age (`/metrics`).
    pub metrics: crate::metrics::PipelineMetrics,
}

/// What a pipeline needs besides its connector and publisher.
#[derive(Clone, Debug)]
pub struct PipelineSettings {
    /// In-flight bounds, batching, shutdown deadline.
    pub delivery: DeliveryConfig,
    /// Backoff of failed rows.
    pub retry: RetryConfig,
    /// Per-key ordering under failures.
    pub ordering: KeyOrdering,
}

/// How the log pipeline and the retry worker talk: the pipeline wakes the worker when
/// it writes FAILED or parked rows; the worker reports keys whose rows it delivered, so
/// the pipeline can check whether strict ordering still holds them back.
pub struct RetryLink {
    /// Notified by the pipeline after FAILED or parked rows are written.
    pub wake_worker: Arc<Notify>,
    /// Keys of rows the retry worker delivered.
    pub delivered_keys: mpsc::UnboundedReceiver<String>,
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The database side failed for good; the message says what to do.
    #[error(transparent)]
    Source(#[from] ConnectorError),
    /// The Kafka producer became unusable.
    #[error(
        "the Kafka producer failed fatally: {0}; outboxd stops so a restart gets a fresh producer"
    )]
    ProducerFatal(String),
}

impl PipelineError {
    fn is_transient(&self) -> bool {
        matches!(self, PipelineError::Source(e) if e.is_transient())
    }
}

/// Runs the pipeline until `shutdown` turns true (returns `Ok`) or a definite error.
///
/// Transient errors (connection lost, slot held by another reader, database restarting)
/// are logged and retried with backoff; events in flight at that moment are drained and
/// written back first, and anything unconfirmed is read again from the log.
pub async fn run<C: Connector>(
    connector: &C,
    publisher: &Publisher,
    settings: &PipelineSettings,
    stats: &Arc<PipelineStats>,
    link: &mut RetryLink,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut backoff = ReconnectBackoff::new();
    tracing::info!(source = %connector.describe(), "pipeline starting");
    while !*shutdown.borrow() {
        let session = async {
            let store = connector.open_store().await?;
            let mut stream = connector.open_stream().await?;
            tracing::info!(source = %connector.describe(), "streaming");
            stats.streaming.store(true, Ordering::Relaxed);
            let wake = Arc::clone(&link.wake_worker);
            let mut session = Session::new(&store, publisher, settings, stats, wake);
            session.load_blocked_keys().await?;
            session.written_through = store.load_checkpoint().await?;
            session
                .run(&mut stream, link, &mut shutdown, &mut backoff)
                .await
        };
        let session = session.await;
        stats.streaming.store(false, Ordering::Relaxed);
        match session {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                let delay = backoff.next_delay();
                let confirmed = stats
                    .confirmed
                    .lock()
                    .ok()
                    .and_then(|c| c.as_ref().map(ToString::to_string))
                    .unwrap_or_default();
                tracing::warn!(error = %e, retry_in = ?delay, %confirmed, "source unavailable; retrying");
                wait_or_shutdown(delay, &mut shutdown).await;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A log position and how many of its events still await write-back.
struct Slot {
    position: Position,
    unwritten: usize,
}

/// The result of one record, tagged with where it belongs.
struct Completed {
    seq: u64,
    id: i64,
    retry_count: i32,
    message_id: String,
    biz_key: String,
    topic: String,
    commit_time: Option<SystemTime>,
    outcome: DeliveryOutcome,
}

/// Records handed to Kafka whose outcome is not yet known.
type Deliveries = FuturesUnordered<BoxFuture<'static, Completed>>;

async fn track(seq: u64, event: OutboxEvent, topic: String, pending: PendingDelivery) -> Completed {
    let outcome = pending.outcome().await;
    Completed {
        topic,
        commit_time: event.commit_time,
        seq,
        id: event.id,
        retry_count: event.retry_count,
        message_id: event.message_id,
        biz_key: event.biz_key,
        outcome,
    }
}

/// One connected session: the in-flight window and the write-back batch.
struct Session<'a, O> {
    store: &'a O,
    publisher: &'a Publisher,
    settings: &'a PipelineSettings,
    stats: &'a PipelineStats,
    /// Log positions read and not yet confirmed, in log order.
    slots: VecDeque<Slot>,
    /// Sequence number of `slots[0]`.
    first_seq: u64,
    /// Events sent and not yet written back.
    in_flight: usize,
    delivered: Vec<Delivered>,
    failed: Vec<DeliveryFailure>,
    parked: Vec<ParkedEvent>,
    /// Strict ordering: keys with an event FAILED, PROCESSING or MANUAL_REQUIRED; their
    /// later events are parked instead of sent.
    blocked: HashSet<String>,
    /// Blocked keys the retry worker delivered rows of: to check after the next flush.
    maybe_released: HashSet<String>,
    /// Sequence numbers of the slots the batch's rows belong to, one per row.
    batch_seqs: Vec<u64>,
    batch_started: Option<Instant>,
    last_confirmed: Option<Position>,
    /// The checkpoint row when the session opened: transactions up to it are already
    /// written back (the row commits with their statuses) and are not sent again, even
    /// when the server's slot had not heard the last confirmation before a restart.
    written_through: Option<Position>,
    fatal: Option<String>,
    wake_worker: Arc<Notify>,
}

impl<'a, O: OutboxStore> Session<'a, O> {
    fn new(
        store: &'a O,
        publisher: &'a Publisher,
        settings: &'a PipelineSettings,
        stats: &'a PipelineStats,
        wake_worker: Arc<Notify>,
    ) -> Self {
        Self {
            store,
            publisher,
            settings,
            stats,
            slots: VecDeque::new(),
            first_seq: 0,
            in_flight: 0,
            delivered: Vec::new(),
            failed: Vec::new(),
            parked: Vec::new(),
            blocked: HashSet::new(),
            maybe_released: HashSet::new(),
            batch_seqs: Vec::new(),
            batch_started: None,
            last_confirmed: None,
            written_through: None,
            fatal: None,
            wake_worker,
        }
    }

    fn already_written(&self, position: &Position) -> bool {
        self.written_through.as_ref().is_some_and(|w| position <= w)
    }

    fn strict(&self) -> bool {
        self.settings.ordering == KeyOrdering::Strict
    }

    /// Strict ordering starts from the keys the table says are in trouble.
    async fn load_blocked_keys(&mut self) -> Result<(), ConnectorError> {
        if self.strict() {
            self.blocked = self.store.blocked_keys(None).await?;
            if !self.blocked.is_empty() {
                tracing::info!(
                    keys = self.blocked.len(),
                    "keys held back by earlier failed events"
                );
            }
        }
        Ok(())
    }

    async fn run<S: ChangeStream>(
        &mut self,
        stream: &mut S,
        link: &mut RetryLink,
        shutdown: &mut watch::Receiver<bool>,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), PipelineError> {
        let mut deliveries = Deliveries::new();
        let mut stopping_at: Option<Instant> = None;
        let mut stream_error: Option<ConnectorError> = None;
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);

        loop {
            let reading = stopping_at.is_none()
                && stream_error.is_none()
                && self.fatal.is_none()
                && self.in_flight < self.settings.delivery.max_in_flight;
            let flush_at = self.batch_started.map_or(far_future, |t| {
                t + self.settings.delivery.writeback_interval
            });

            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop), if stopping_at.is_none() => {
                    tracing::info!(
                        in_flight = self.in_flight,
                        "shutting down: draining in-flight deliveries"
                    );
                    stopping_at = Some(Instant::now() + self.settings.delivery.shutdown_deadline);
                }
                Some(done) = deliveries.next(), if !deliveries.is_empty() => {
                    self.complete(done);
                    if self.batch_seqs.len() >= self.settings.delivery.writeback_batch {
                        self.flush(stream).await?;
                    }
                }
                _ = sleep_until(flush_at.into()), if self.batch_started.is_some() => {
                    self.flush(stream).await?;
                }
                Some(key) = link.delivered_keys.recv() => {
                    if self.blocked.contains(&key) {
                        self.maybe_released.insert(key);
                        if self.batch_started.is_none() {
                            self.flush(stream).await?;
                        }
                    }
                }
                item = stream.next(), if reading => match item {
                    Ok(ChangeItem::Transaction(tx)) if self.already_written(&tx.commit_position) => {
                        tracing::debug!(
                            position = %tx.commit_position,
                            events = tx.events.len(),
                            "already written back before a restart; not sent again"
                        );
                        self.push_slot(tx.commit_position, 0);
                        if self.batch_started.is_none() {
                            self.flush(stream).await?;
                        }
                    }
                    Ok(ChangeItem::Transaction(tx)) => {
                        backoff.reset();
                        if self.in_flight == 0 {
                            self.stats.metrics.read_while_idle(tx.commit_time);
                        }
                        let seq = self.push_slot(tx.commit_position.clone(), tx.events.len());
                        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                        self.send_transaction(seq, tx, &mut deliveries).await;
                    }
                    Ok(ChangeItem::Progress(position)) => {
                        backoff.reset();
                        self.push_slot(position, 0);
                        if self.batch_started.is_none() {
                            self.flush(stream).await?;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            in_flight = self.in_flight,
                            confirmed = %display_position(self.last_confirmed.as_ref()),
                            "log stream failed; draining in-flight deliveries"
                        );
                        stopping_at = Some(Instant::now() + self.settings.delivery.shutdown_deadline);
                        stream_error = Some(e);
                    }
                },
                _ = sleep_until(stopping_at.unwrap_or(far_future).into()), if stopping_at.is_some() => {
                    tracing::warn!(
                        unacknowledged = deliveries.len(),
                        resume_from = %display_position(self.last_confirmed.as_ref()),
                        "shutdown deadline passed; their rows stay INIT and are sent again on restart"
                    );
                    break;
                }
            }

            let draining = stopping_at.is_some() || self.fatal.is_some();
            if draining && deliveries.is_empty() {
                break;
            }
        }

        self.flush(stream).await?;
        if let Some(error) = self.fatal.take() {
            return Err(PipelineError::ProducerFatal(error));
        }
        match stream_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    fn push_slot(&mut self, position: Position, events: usize) -> u64 {
        let seq = self.first_seq + self.slots.len() as u64;
        self.slots.push_back(Slot {
            position,
            unwritten: events,
        });
        self.in_flight += events;
        self.stats
            .in_flight
            .store(self.in_flight as u64, Ordering::Relaxed);
        seq
    }

    async fn send_transaction(
        &mut self,
        seq: u64,
        tx: CommittedTransaction,
        deliveries: &mut Deliveries,
    ) {
        for event in tx.events {
            if self.strict() && self.blocked.contains(&event.biz_key) {
                tracing::debug!(
                    id = event.id,
                    message_id = %event.message_id,
                    biz_key = %event.biz_key,
                    "parked behind an earlier event of its key"
                );
                self.parked.push(ParkedEvent {
                    id: event.id,
                    reason: format!(
                        "parked: an earlier event of biz_key `{}` is not delivered yet \
                         (strict ordering)",
                        event.biz_key
                    ),
                });
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                self.batch_seqs.push(seq);
                self.batch_started.get_or_insert_with(Instant::now);
                continue;
            }
            let topic = self.publisher.topic_for(&event);
            let pending = self.publisher.send(&event).await;
            deliveries.push(Box::pin(track(seq, event, topic, pending)));
        }
    }

    fn complete(&mut self, done: Completed) {
        match done.outcome {
            DeliveryOutcome::Acked { partition, offset } => {
                self.stats.metrics.acked(&done.topic, done.commit_time);
                self.delivered.push(Delivered {
                    id: done.id,
                    partition,
                    offset,
                });
            }
            DeliveryOutcome::Failed { error, fatal } => {
                self.stats.metrics.failed(&done.topic);
                let position = done
                    .seq
                    .checked_sub(self.first_seq)
                    .and_then(|i| self.slots.get(i as usize))
                    .map(|slot| &slot.position);
                tracing::warn!(
                    id = done.id,
                    message_id = %done.message_id,
                    topic = %done.topic,
                    position = %display_position(position),
                    %error,
                    "delivery failed; the row becomes FAILED and is retried later"
                );
                if fatal && self.fatal.is_none() {
                    self.fatal = Some(error.clone());
                }
                if self.strict() {
                    self.blocked.insert(done.biz_key);
                }
                let retry_delay = next_retry_delay(&self.settings.retry, done.retry_count);
                self.failed.push(DeliveryFailure {
                    id: done.id,
                    error,
                    retry_delay,
                });
            }
        }
        self.batch_seqs.push(done.seq);
        self.batch_started.get_or_insert_with(Instant::now);
    }

    /// Writes the batch back with the checkpoint it completes, then confirms that
    /// position to the source. Transient store errors are retried a few times before
    /// the session gives up (and the rows are read again from the log).
    async fn flush<S: ChangeStream>(&mut self, stream: &mut S) -> Result<(), PipelineError> {
        for seq in self.batch_seqs.drain(..) {
            // Every seq in the batch belongs to a slot still queued: slots leave the queue
            // only once all their events are written back.
            let index = (seq - self.first_seq) as usize;
            if let Some(slot) = self.slots.get_mut(index) {
                slot.unwritten -= 1;
            }
        }
        let done_prefix = self.slots.iter().take_while(|s| s.unwritten == 0).count();
        let checkpoint = done_prefix
            .checked_sub(1)
            .map(|i| self.slots[i].position.clone());
        let checkpoint = checkpoint.filter(|p| self.last_confirmed.as_ref() < Some(p));

        if !self.delivered.is_empty() || !self.failed.is_empty() || !self.parked.is_empty() {
            let batch = WriteBack {
                delivered: &self.delivered,
                failed: &self.failed,
                parked: &self.parked,
                checkpoint: checkpoint.as_ref(),
            };
            write_back_with_retries(self.store, batch).await?;
            let written = self.delivered.len() + self.failed.len() + self.parked.len();
            self.in_flight -= written;
            self.stats
                .in_flight
                .store(self.in_flight as u64, Ordering::Relaxed);
            self.stats
                .published
                .fetch_add(self.delivered.len() as u64, Ordering::Relaxed);
            self.stats
                .failed
                .fetch_add(self.failed.len() as u64, Ordering::Relaxed);
            if !self.failed.is_empty() || !self.parked.is_empty() {
                self.wake_worker.notify_one();
            }
            self.delivered.clear();
            self.failed.clear();
            self.parked.clear();
        }
        self.batch_started = None;
        self.release_keys().await?;

        self.slots.drain(..done_prefix);
        self.first_seq += done_prefix as u64;
        if let Some(position) = checkpoint {
            stream.confirm(&position).await?;
            tracing::debug!(%position, "confirmed");
            self.stats.metrics.confirmed();
            if let Ok(mut confirmed) = self.stats.confirmed.lock() {
                *confirmed = Some(position.clone());
            }
            self.last_confirmed = Some(position);
        }
        Ok(())
    }
}

impl<O: OutboxStore> Session<'_, O> {
    /// Unblocks the keys whose rows the retry worker delivered, once the table shows no
    /// FAILED, PROCESSING or MANUAL_REQUIRED row of theirs. Runs after a flush, so every
    /// row this session parked is already in the table when it looks.
    async fn release_keys(&mut self) -> Result<(), ConnectorError> {
        if self.maybe_released.is_empty() {
            return Ok(());
        }
        let candidates: Vec<String> = self.maybe_released.drain().collect();
        let still_blocked = self.store.blocked_keys(Some(&candidates)).await?;
        for key in candidates {
            if !still_blocked.contains(&key) {
                tracing::debug!(biz_key = %key, "key released: its earlier events are delivered");
                self.blocked.remove(&key);
            }
        }
        Ok(())
    }
}

async fn write_back_with_retries<O: OutboxStore>(
    store: &O,
    batch: WriteBack<'_>,
) -> Result<(), ConnectorError> {
    const ATTEMPTS: u32 = 5;
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        match store.write_back(batch).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::warn!(
                    error = %e,
                    attempt,
                    rows = batch.delivered.len() + batch.failed.len() + batch.parked.len(),
                    first_id = ?batch.delivered.first().map(|d| d.id).or(batch.failed.first().map(|f| f.id)),
                    checkpoint = %display_position(batch.checkpoint),
                    "status write-back failed; retrying"
                );
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A position for logs; `none` before the first confirmation.
fn display_position(position: Option<&Position>) -> String {
    position.map_or_else(|| "none".to_owned(), ToString::to_string)
}
