//! The log relay: source → sink → write-back → checkpoint.
//!
//! One session (`session/`) reads committed transactions from a [`ChangeStream`], hands each outbox
//! event to the [`Sink`], and, as outcomes come back (`outcome.rs`), writes the rows'
//! statuses back in batches. The log position is confirmed only past the longest prefix
//! of transactions whose every event is delivered (or marked FAILED) **and** written back
//! (`frontier.rs`): that is what makes delivery at-least-once across crashes.
//!
//! [`run`] wraps sessions in the one reconnect loop (`src/reconnect.rs`): transient
//! errors (including "another outboxd holds the slot", which is how a standby takes over)
//! reconnect; definite ones and shutdown stop it.
//!
//! [`ChangeStream`]: outboxd_connector::ChangeStream

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outboxd_connector::{Connector, ConnectorError, OutboxStore, Position, RowLifecycle};
use tokio::sync::{mpsc, watch, Notify};

use crate::config::{DeliveryConfig, Ordering as KeyOrdering, RetryConfig};
use crate::reconnect::{reconnecting, ReconnectBackoff, SessionError};
use crate::sink::Sink;

mod frontier;
pub(crate) mod outcome;
mod session;
#[cfg(test)]
mod tests;

use session::{Session, Unwritten};

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
    /// Stuck Kafka producers replaced while the brokers answered.
    pub producer_rebuilds: AtomicU64,
    /// Rows of transactions read again (reconnect, restart, takeover) that the table
    /// already showed SUCCESS, and so were not sent again.
    pub skipped_delivered: AtomicU64,
    /// The last position confirmed to the source.
    pub confirmed: Mutex<Option<Position>>,
    /// True while a log session is open (`/readyz`).
    pub streaming: AtomicBool,
    /// When the last log session ended or failed to open, and why (the operator
    /// console's overview: reconnecting, a standby waiting for the slot or the lock).
    pub last_interruption: Mutex<Option<(std::time::SystemTime, String)>>,
    /// Outcomes by topic, publish latency, lag and checkpoint age (`/metrics`).
    pub metrics: crate::observability::PipelineMetrics,
    /// The inbox's counters, when this process runs one (`/metrics`).
    pub inbox: std::sync::OnceLock<Arc<crate::inbox::InboxStats>>,
    /// The canary (`[canary]`), told of every delivered event.
    pub canary: crate::canary::Canary,
    /// Actions taken in the operator console (`[console]`).
    pub console_actions: crate::console::ActionCounts,
}

/// What a pipeline needs besides its connector and sink.
#[derive(Clone, Debug)]
pub struct PipelineSettings {
    /// In-flight bounds, batching, shutdown deadline.
    pub delivery: DeliveryConfig,
    /// Backoff of failed rows.
    pub retry: RetryConfig,
    /// Per-key ordering under failures.
    pub ordering: KeyOrdering,
    /// After this long without an outcome while records wait (`kafka.message_timeout`),
    /// the session says so. Under strict ordering records wait for the sink without
    /// limit, so this warning is what an operator sees of a broker outage.
    pub stall_warning: Duration,
    /// After this long without an outcome while records wait (`kafka.message_timeout`, at
    /// least 10 s), the session probes the destination with a fresh client and rebuilds
    /// a producer that is stuck while the brokers answer ([`Sink::destination_healthy`]):
    /// at the second healthy look in a row, `stuck_after` after the first
    /// ([`stuck_after`]).
    pub stuck_after: Duration,
    /// `outbox.rows`: with `Deleted` there is no row to write a status to, so nothing is
    /// written back but the checkpoint, and a record that is not delivered holds the log
    /// position and is read and sent again (or, when it can never be sent, stops the
    /// relay) instead of becoming FAILED.
    pub rows: RowLifecycle,
}

/// `stuck_after` for a sink whose records are due an answer within `sink_timeout`
/// (`kafka.message_timeout`): that long with none, and at least 10 s, which leaves a
/// sound producer time to come back from librdkafka's reconnect backoff
/// (`reconnect.backoff.max.ms`, 10 s by default) between the two looks. It was three times
/// as long: up to three minutes with the default between a broker's return and the
/// rebuild, now about one (plus a look's probe, at most 10 s).
pub fn stuck_after(sink_timeout: Duration) -> Duration {
    sink_timeout.max(Duration::from_secs(10))
}

/// How the log relay and the claim worker talk: the relay wakes the worker when it
/// writes FAILED or parked rows; the worker reports keys whose rows it delivered, so the
/// relay can check whether strict ordering still holds them back.
pub struct RetryLink {
    /// Notified by the relay after FAILED or parked rows are written.
    pub wake_worker: Arc<Notify>,
    /// Keys of rows the claim worker delivered.
    pub delivered_keys: mpsc::UnboundedReceiver<String>,
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The database side failed for good; the message says what to do.
    #[error(transparent)]
    Source(#[from] ConnectorError),
    /// The sink (the Kafka producer) failed fatally: the session ends, the sink is
    /// rebuilt and a new session sends again what was not acknowledged.
    #[error(
        "the Kafka producer failed fatally: {0}; it is rebuilt and what it did not \
         acknowledge is read from the log and sent again"
    )]
    SinkFailed(String),
    /// The sink failed fatally and could not be rebuilt.
    #[error("the Kafka producer failed fatally and cannot be rebuilt: {0}")]
    ProducerFatal(String),
    /// `outbox.rows = "deleted"`: a record was not delivered and there is no row to mark
    /// FAILED; the log position holds and the session reads it again, after a backoff.
    #[error(
        "a record was not delivered: {0}; with outbox.rows = \"deleted\" there is no row to \
         mark FAILED, so the log position is held and the record is read and sent again"
    )]
    NotDelivered(String),
    /// Exactly-once: the destination refused a record inside the open Kafka transaction
    /// (too large for its topic, say), which can then only be aborted. The session ends;
    /// the next one writes the record's row FAILED before it reads and does not send it
    /// in a transaction again, and sends the rest again.
    #[error(
        "exactly-once: Kafka refused the record of the outbox row with message_id \
         `{message_id}`: {reason}; the Kafka transaction holding it is aborted, the row \
         becomes FAILED (retried by the claim worker, at least once; under strict ordering \
         its key waits behind it) and the rest of the transaction is sent again"
    )]
    RefusedInTransaction {
        /// The row's message id.
        message_id: String,
        /// The destination's error.
        reason: String,
    },
    /// `outbox.rows = "deleted"`: an event that can never be sent (an unreadable row, a
    /// topic the configuration refuses); the relay stops before it rather than skip it.
    #[error(
        "the outbox row with message_id `{message_id}` cannot be published: {reason}; with \
         outbox.rows = \"deleted\" there is no row to mark MANUAL_REQUIRED, so outboxd stops \
         before it rather than skip it. Fix the configuration (kafka.allowed_topics, the \
         topic template) and start again; to skip the rows from here on for good, \
         `outboxd recover --config <file>` starts the log at its current end"
    )]
    Unpublishable {
        /// The row's message id.
        message_id: String,
        /// Why it cannot be sent.
        reason: String,
    },
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SessionError for PipelineError {
    fn is_transient(&self) -> bool {
        match self {
            PipelineError::Source(e) => e.is_transient(),
            PipelineError::SinkFailed(_) => true,
            PipelineError::ProducerFatal(_) => false,
            PipelineError::NotDelivered(_) => true,
            PipelineError::RefusedInTransaction { .. } => true,
            PipelineError::Unpublishable { .. } => false,
        }
    }
}

/// Runs the relay until `shutdown` turns true (returns `Ok`) or a definite error.
///
/// Transient errors (connection lost, slot held by another reader, database restarting)
/// are logged and retried with backoff; events in flight at that moment are drained and
/// written back first, and anything unconfirmed is read again from the log.
pub async fn run<C: Connector, S: Sink>(
    connector: &C,
    sink: &S,
    settings: &PipelineSettings,
    stats: &Arc<PipelineStats>,
    link: &mut RetryLink,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    tracing::info!(source = %connector.describe(), "pipeline starting");
    // Outcomes a session could not write back (the database went away while Kafka kept
    // acknowledging; under exactly-once, rows refused inside an aborted Kafka
    // transaction), written by the next one before it reads.
    let unwritten = Mutex::new(Unwritten::default());
    let session = async |backoff: &mut ReconnectBackoff, mut shutdown: watch::Receiver<bool>| {
        // After a session that ended on a fatal sink failure: a fresh sink first.
        if sink.recover().await.map_err(PipelineError::ProducerFatal)? {
            tracing::info!("the sink was rebuilt; unacknowledged events are read again");
        }
        let store = connector.open_store().await?;
        let mut stream = connector.open_stream().await?;
        let wake = Arc::clone(&link.wake_worker);
        // A session start may be a takeover: the instance that held the log may have
        // left FAILED rows and PROCESSING claims that nothing here has been told of (its
        // failures woke its own worker, not ours). Wake the claim worker so it reaps,
        // claims what is due and learns the schedule of the rest.
        wake.notify_one();
        let mut session = Session::new(&store, sink, settings, stats, wake);
        let result = async {
            let mut carried = std::mem::take(&mut *lock(&unwritten));
            if let Err(e) = session.write_unwritten(&mut carried).await {
                *lock(&unwritten) = carried;
                return Err(e.into());
            }
            session.load_blocked_keys().await?;
            session.load_delivered_through().await?;
            // Exactly-once: fence the instance that held the transactions before reading
            // the checkpoint, which that instance may still have been writing.
            let committed = session.take_over_transactions().await?;
            let checkpoint = crate::reconnect::answered(
                settings.delivery.store_timeout,
                "the checkpoint",
                store.load_checkpoint(),
            )
            .await?;
            session.set_written_through(checkpoint);
            session.start_from_committed(committed);
            // Ready (`/readyz`) once the relay can send: under exactly-once, taking the
            // transactions over (fencing, the committed position) comes first.
            tracing::info!(source = %connector.describe(), "streaming");
            stats.streaming.store(true, Ordering::Relaxed);
            session.run(&mut stream, link, &mut shutdown, backoff).await
        }
        .await;
        if result.is_err() {
            lock(&unwritten).merge(session.take_unwritten());
        }
        stats.streaming.store(false, Ordering::Relaxed);
        result
    };
    let on_retry = |e: &PipelineError, delay| {
        let confirmed = stats
            .confirmed
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(ToString::to_string))
            .unwrap_or_default();
        tracing::warn!(error = %e, retry_in = ?delay, %confirmed, "source unavailable; retrying");
        if let Ok(mut last) = stats.last_interruption.lock() {
            *last = Some((std::time::SystemTime::now(), e.to_string()));
        }
    };
    reconnecting(ReconnectBackoff::new(), shutdown, session, on_retry).await
}
