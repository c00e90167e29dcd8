//! One connected session of the log relay: the in-flight window, strict-ordering parking,
//! the write-back batch, and the drain at shutdown or after a stream error.
//!
//! Dataflow: `stream.next()` → for each event, park it (strict ordering, key blocked) or
//! `sink.send` it into `deliveries` → outcomes come back in any order → `complete` turns
//! each into a row write-back and marks its slot in the [`AckFrontier`] → `flush` writes
//! the batch back with the checkpoint it completes, in one transaction, then confirms that
//! position to the stream.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use outboxd_connector::{
    parked_behind_key, ChangeItem, ChangeStream, CommittedTransaction, ConnectorError, Delivered,
    DeliveryFailure, OutboxEvent, OutboxStore, ParkedEvent, Position, RowId, TransactionPart,
    WriteBack,
};
use tokio::sync::{watch, Notify};
use tokio::time::sleep_until;
use tracing::Instrument;

use super::frontier::AckFrontier;
use super::outcome::Outcome;
use super::{PipelineError, PipelineSettings, PipelineStats, RetryLink, RowLifecycle};
use crate::config::Ordering as KeyOrdering;
use crate::observability::{trace_context, UncommittedRecords};
use crate::reconnect::ReconnectBackoff;
use crate::sink::{CommittedPosition, FailureKind, Sink, SinkResult};

/// The shortest period between two looks at the keys the table holds back (see
/// [`Session::refresh_blocked_keys`]): how soon an operator's `park` reaches a busy relay.
const MIN_BLOCKED_REFRESH: Duration = Duration::from_secs(1);

/// The result of one record, tagged with where it belongs.
struct Completed {
    seq: u64,
    /// [`OutboxEvent::size`], counted in flight until written back.
    size: usize,
    row: RowId,
    retry_count: i32,
    message_id: String,
    biz_key: String,
    topic: String,
    commit_time: Option<SystemTime>,
    result: SinkResult,
    /// A traced event's span ([`trace_context::send_span`]): open from its send until its
    /// outcome is handled, so what the session logs about it carries its trace id.
    span: Option<tracing::Span>,
}

/// Outcomes a session collected and could not write back, carried to the next session of
/// the same process (see [`Session::write_unwritten`]). Delivery failures only under
/// strict ordering, and under exactly-once only the rows refused inside a Kafka
/// transaction: see [`Session::take_unwritten`].
#[derive(Debug, Default)]
pub(super) struct Unwritten {
    delivered: Vec<Delivered>,
    failed: Vec<DeliveryFailure>,
    parked: Vec<ParkedEvent>,
    rejected: Vec<ParkedEvent>,
    /// Exactly-once: rows the destination refused inside a Kafka transaction (FAILED in
    /// `failed`, or written so already), not to be sent in one again while their
    /// transaction is read again ([`Session::drop_refused`]).
    refused: HashSet<RowId>,
}

impl Unwritten {
    /// Adds `later`'s outcomes (a session that failed before writing what it carried
    /// in leaves both).
    pub(super) fn merge(&mut self, later: Unwritten) {
        self.delivered.extend(later.delivered);
        self.failed.extend(later.failed);
        self.parked.extend(later.parked);
        self.rejected.extend(later.rejected);
        self.refused.extend(later.refused);
    }

    fn is_empty(&self) -> bool {
        self.delivered.is_empty()
            && self.failed.is_empty()
            && self.parked.is_empty()
            && self.rejected.is_empty()
    }
}

/// Records handed to the sink whose outcome is not yet known.
type Deliveries = FuturesUnordered<BoxFuture<'static, Completed>>;

/// At least once: the write-back under way while the session reads and sends on (at most
/// one, so checkpoints are written and positions confirmed in order).
type Writing<'a> = FuturesUnordered<BoxFuture<'a, Written>>;

/// Outcomes on their way to the table.
#[derive(Debug, Default)]
struct Outcomes {
    delivered: Vec<Delivered>,
    failed: Vec<DeliveryFailure>,
    parked: Vec<ParkedEvent>,
    rejected: Vec<ParkedEvent>,
}

impl Outcomes {
    fn len(&self) -> usize {
        self.delivered.len() + self.failed.len() + self.parked.len() + self.rejected.len()
    }

    /// The write-back of these outcomes with `checkpoint`. Deleted rows
    /// (`tracks_status` false) have no status to write: the checkpoint alone goes, and
    /// the outcomes still count once it is written. `exactly_once`: see
    /// [`WriteBack::replace_positions`].
    fn batch<'b>(
        &'b self,
        tracks_status: bool,
        checkpoint: Option<&'b Position>,
        exactly_once: bool,
    ) -> WriteBack<'b> {
        WriteBack {
            delivered: if tracks_status { &self.delivered } else { &[] },
            failed: &self.failed,
            parked: &self.parked,
            rejected: &self.rejected,
            checkpoint,
            replace_positions: exactly_once,
        }
    }
}

/// A write-back that ended: how, what it wrote, and the position it makes durable.
struct Written {
    result: Result<(), ConnectorError>,
    outcomes: Outcomes,
    bytes: usize,
    checkpoint: Option<Position>,
}

/// Waits for one record's outcome. Keeps only what the outcome needs from the event: the
/// payload, key and headers are dropped here, before the wait, since the sink has them
/// (librdkafka copies a record when it is produced), so a record in flight is not held
/// twice. A plain function around an `async` block: an `async fn` would keep the whole
/// event in its state until it returns. A traced event's wait runs in its span, which
/// ends with a debug line of the outcome.
fn track<D: Future<Output = SinkResult>>(
    seq: u64,
    size: usize,
    event: OutboxEvent,
    topic: String,
    delivery: D,
    span: Option<tracing::Span>,
) -> impl Future<Output = Completed> {
    let OutboxEvent {
        id,
        table,
        retry_count,
        message_id,
        biz_key,
        commit_time,
        ..
    } = event;
    async move {
        let result = match &span {
            Some(span) => delivery.instrument(span.clone()).await,
            None => delivery.await,
        };
        if let Some(span) = &span {
            span.in_scope(|| match &result {
                Ok(receipt) => tracing::debug!(
                    partition = receipt.partition,
                    offset = receipt.offset,
                    "acknowledged by Kafka"
                ),
                Err(failure) => tracing::debug!(error = %failure.error, "not delivered"),
            });
        }
        Completed {
            topic,
            commit_time,
            seq,
            size,
            row: RowId { table, id },
            retry_count,
            message_id,
            biz_key,
            result,
            span,
        }
    }
}

/// One connected session: the in-flight window and the write-back batch.
pub(super) struct Session<'a, O, S> {
    store: &'a O,
    sink: &'a S,
    settings: &'a PipelineSettings,
    stats: &'a PipelineStats,
    /// Log positions read and not yet confirmed.
    frontier: AckFrontier,
    /// Events sent and not yet written back.
    in_flight: usize,
    /// Their bytes ([`OutboxEvent::size`]), bounded by `delivery.max_in_flight_bytes`.
    in_flight_bytes: usize,
    /// Bytes of the events in the batch about to be written back.
    batch_bytes: usize,
    /// The slot of a transaction whose parts are arriving (its end not yet read).
    open_transaction: Option<u64>,
    delivered: Vec<Delivered>,
    failed: Vec<DeliveryFailure>,
    parked: Vec<ParkedEvent>,
    /// Rows that cannot become events, to be written MANUAL_REQUIRED.
    rejected: Vec<ParkedEvent>,
    /// Strict ordering: keys with an event FAILED, PROCESSING or MANUAL_REQUIRED; their
    /// later events are parked instead of sent.
    blocked: HashSet<String>,
    /// Blocked keys the retry worker delivered rows of: to check after the next flush.
    maybe_released: HashSet<String>,
    /// When `blocked` last took in the table's view, and how long until it looks again:
    /// an operator's `park` of a row this session has not read yet is seen there.
    blocked_refreshed: Instant,
    /// The last outcome, or the first send after none was waiting (the stall warning does
    /// not move it): records waiting `stuck_after` since make the session ask whether the
    /// producer is stuck ([`Self::rebuild_if_stuck`]).
    waiting_since: tokio::time::Instant,
    /// The last look at the destination found it healthy while records waited.
    destination_seen_healthy: bool,
    blocked_refresh_every: Duration,
    /// Sequence numbers of the slots the batch's rows belong to, one per row.
    batch_seqs: Vec<u64>,
    /// A flush was asked for while a write-back was under way: it follows that one.
    flush_wanted: bool,
    batch_started: Option<Instant>,
    last_confirmed: Option<Position>,
    /// The checkpoint row when the session opened: transactions up to it are already
    /// written back (the row commits with their statuses) and are not sent again, even
    /// when the server's slot had not heard the last confirmation before a restart.
    written_through: Option<Position>,
    /// The highest SUCCESS id when the session opened: a transaction read again (after a
    /// reconnect, restart or takeover) with rows at or below it is looked up, and its rows
    /// already SUCCESS are not sent again. Rows above it were delivered by no one.
    delivered_through: Option<i64>,
    /// Rows of transactions read again that the table already showed SUCCESS.
    skipped_delivered: u64,
    /// Why the session stops reading and ends once what is in flight is collected: a
    /// sink that failed fatally, (exactly-once) a record refused inside the Kafka
    /// transaction, or (`outbox.rows = "deleted"`) a record not delivered or an event
    /// that can never be.
    halt: Option<PipelineError>,
    /// Exactly-once: the failures of records refused inside this session's Kafka
    /// transaction, which is aborted; the next session writes them ([`Unwritten`]).
    refused: Vec<DeliveryFailure>,
    /// Exactly-once: rows refused inside an earlier session's Kafka transaction, FAILED
    /// now: not sent in a transaction again ([`Self::drop_refused`]).
    refused_before: HashSet<RowId>,
    /// Those of `refused_before` dropped from what this session read: once a commit
    /// passes them their transactions are never read again, and they are forgotten.
    dropped_refused: Vec<RowId>,
    /// A write-back that failed (the database went away): the session stops reading,
    /// collects the outcomes of what is still in flight, and ends with this error; the
    /// next session writes those outcomes first ([`Unwritten`]).
    write_error: Option<PipelineError>,
    /// Exactly-once ([`Sink::transactional`]): records go out in a Kafka transaction
    /// that [`Self::flush`] commits with the position it reaches, only at a source
    /// transaction boundary with every record acknowledged.
    exactly_once: bool,
    /// Exactly-once: when the first slot of the open Kafka transaction was read; it is
    /// committed `delivery.transaction_interval` later.
    window_opened: Option<Instant>,
    /// Exactly-once: the records acknowledged in the open Kafka transaction, which count
    /// in the per-topic metrics once it commits.
    uncommitted: UncommittedRecords,
    /// Exactly-once: the position the last committed Kafka transaction reached. The
    /// checkpoint row is written with it, never past it.
    kafka_committed: Option<Position>,
    /// Exactly-once: what the checkpoint row holds (as this session last wrote or read
    /// it); each commit records it, see [`CommittedPosition::checkpoint`].
    checkpoint_written: Option<Position>,
    /// Exactly-once: events and bytes of the source transaction whose parts are arriving.
    /// A Kafka transaction must hold all of it, so reading goes on past the window's
    /// bounds until it ends, as long as it alone stays within them.
    open_events: usize,
    open_bytes: usize,
    wake_worker: Arc<Notify>,
}

impl<'a, O: OutboxStore, S: Sink> Session<'a, O, S> {
    pub(super) fn new(
        store: &'a O,
        sink: &'a S,
        settings: &'a PipelineSettings,
        stats: &'a PipelineStats,
        wake_worker: Arc<Notify>,
    ) -> Self {
        Self {
            store,
            sink,
            settings,
            stats,
            frontier: AckFrontier::default(),
            in_flight: 0,
            in_flight_bytes: 0,
            batch_bytes: 0,
            open_transaction: None,
            delivered: Vec::new(),
            failed: Vec::new(),
            parked: Vec::new(),
            rejected: Vec::new(),
            blocked: HashSet::new(),
            maybe_released: HashSet::new(),
            blocked_refreshed: Instant::now(),
            waiting_since: tokio::time::Instant::now(),
            destination_seen_healthy: false,
            blocked_refresh_every: MIN_BLOCKED_REFRESH,
            batch_seqs: Vec::new(),
            flush_wanted: false,
            batch_started: None,
            last_confirmed: None,
            written_through: None,
            delivered_through: None,
            skipped_delivered: 0,
            halt: None,
            refused: Vec::new(),
            refused_before: HashSet::new(),
            dropped_refused: Vec::new(),
            write_error: None,
            exactly_once: sink.transactional(),
            window_opened: None,
            uncommitted: UncommittedRecords::default(),
            kafka_committed: None,
            checkpoint_written: None,
            open_events: 0,
            open_bytes: 0,
            wake_worker,
        }
    }

    /// The checkpoint row read when the session opened.
    pub(super) fn set_written_through(&mut self, checkpoint: Option<Position>) {
        self.written_through = checkpoint;
    }

    /// Reads the highest SUCCESS id (see `delivered_through`).
    pub(super) async fn load_delivered_through(&mut self) -> Result<(), ConnectorError> {
        // Exactly-once sends again everything past the committed position, rows shown
        // SUCCESS included: their write-back may precede a commit that never happened.
        if !self.exactly_once && self.tracks_status() {
            self.delivered_through = self.store.highest_delivered_id().await?;
        }
        Ok(())
    }

    /// Exactly-once: takes over the pipeline's Kafka transactions (after the session
    /// holds the log): `init_transactions` fences the instance that held them, then the
    /// last committed position is read. Runs **before** the checkpoint is read (see
    /// [`Self::start_from_committed`]): read earlier, the checkpoint could miss what a
    /// fenced instance wrote in between, and the session would send again transactions
    /// already committed.
    pub(super) async fn take_over_transactions(
        &mut self,
    ) -> Result<Option<CommittedPosition>, PipelineError> {
        if !self.exactly_once {
            return Ok(None);
        }
        self.sink
            .committed_position()
            .await
            .map_err(|f| PipelineError::SinkFailed(f.error))
    }

    /// Exactly-once: starts from the position the last committed transaction reached
    /// (`record`, from [`Self::take_over_transactions`]) when it follows the checkpoint:
    /// transactions up to it are in Kafka and are not sent again. Runs after
    /// [`Self::set_written_through`].
    pub(super) fn start_from_committed(&mut self, record: Option<CommittedPosition>) {
        if !self.exactly_once {
            return;
        }
        let checkpoint = self.written_through.clone();
        self.checkpoint_written.clone_from(&checkpoint);
        // The record belongs to this checkpoint row when the row shows what the record
        // says it showed, or the record's own position (written by the next window).
        let follows = record.as_ref().is_some_and(|r| {
            r.checkpoint == checkpoint || Some(&r.position) == checkpoint.as_ref()
        });
        match record {
            Some(r) if follows => {
                tracing::info!(
                    committed = %r.position,
                    checkpoint = %display_position(checkpoint.as_ref()),
                    "exactly-once: sending from the position the last Kafka transaction committed"
                );
                if checkpoint.as_ref() < Some(&r.position) {
                    self.written_through = Some(r.position.clone());
                }
                self.kafka_committed = self.written_through.clone();
            }
            Some(r) => {
                tracing::warn!(
                    committed = %r.position,
                    recorded_checkpoint = %display_position(r.checkpoint.as_ref()),
                    checkpoint = %display_position(checkpoint.as_ref()),
                    "exactly-once: the last Kafka transaction does not follow the checkpoint \
                     row (another server, a restore, `outboxd recover`, or at-least-once runs \
                     since); sending from the checkpoint, so rows past it may be seen twice"
                );
                self.kafka_committed = checkpoint;
            }
            None => {
                tracing::info!(
                    checkpoint = %display_position(checkpoint.as_ref()),
                    "exactly-once: no Kafka transaction committed yet; sending from the checkpoint"
                );
                self.kafka_committed = checkpoint;
            }
        }
    }

    /// Whether reading `events` queries the store before they are sent: a look-up of rows
    /// read again ([`Self::drop_delivered`]) or strict ordering's look at the table
    /// ([`Self::refresh_blocked_keys`]).
    fn uses_store_before_sending(&self, events: &[OutboxEvent]) -> bool {
        let read_again = self
            .delivered_through
            .is_some_and(|through| events.iter().any(|e| e.id <= through));
        let refresh_due =
            self.strict() && self.blocked_refreshed.elapsed() >= self.blocked_refresh_every;
        read_again || refresh_due
    }

    /// Ends the write-back under way, if any.
    async fn settle<T: ChangeStream>(
        &mut self,
        writing: &mut Writing<'a>,
        stream: &mut T,
        stopping_at: &mut Option<Instant>,
    ) {
        while let Some(written) = writing.next().await {
            self.finish_write(written, stream, stopping_at).await;
        }
    }

    /// Drops the events of a transaction read again whose rows the table already shows
    /// SUCCESS: one lookup per transaction, and only for transactions with a row at or
    /// below `delivered_through`, so a session that reads new transactions pays nothing.
    async fn drop_delivered(
        &mut self,
        events: &mut Vec<OutboxEvent>,
    ) -> Result<(), ConnectorError> {
        let Some(through) = self.delivered_through else {
            return Ok(());
        };
        let candidates: Vec<RowId> = events
            .iter()
            .filter(|e| e.id <= through)
            .map(OutboxEvent::row)
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let delivered = self.store.delivered_among(&candidates).await?;
        if delivered.is_empty() {
            return Ok(());
        }
        events.retain(|e| !delivered.contains(&e.row()));
        if self.skipped_delivered == 0 {
            tracing::info!(
                "reading again transactions an earlier session delivered; rows already \
                 SUCCESS are not sent again"
            );
        }
        self.skipped_delivered += delivered.len() as u64;
        self.stats
            .skipped_delivered
            .fetch_add(delivered.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Exactly-once: drops the events of rows the destination refused inside an earlier
    /// session's Kafka transaction. Their rows are FAILED now (the claim worker retries
    /// them, at least once); sent in a transaction again they would doom it again, and
    /// every session after it. Under strict ordering their keys are held back by the
    /// table's FAILED rows (read when the session opened).
    fn drop_refused(&mut self, events: &mut Vec<OutboxEvent>) {
        if self.refused_before.is_empty() {
            return;
        }
        let (refused, dropped) = (&self.refused_before, &mut self.dropped_refused);
        events.retain(|e| {
            let row = e.row();
            if !refused.contains(&row) {
                return true;
            }
            tracing::info!(
                id = e.id,
                message_id = %e.message_id,
                "exactly-once: not sent again in a Kafka transaction: the destination \
                 refused it in one, and its row is FAILED for the claim worker"
            );
            dropped.push(row);
            false
        });
    }

    fn already_written(&self, position: &Position) -> bool {
        self.written_through.as_ref().is_some_and(|w| position <= w)
    }

    /// Strict ordering's parking, which the table's statuses carry. With deleted rows a
    /// key cannot be held back in the table: any failure ends the session instead, and
    /// the next one sends again from the last confirmed transaction, in order.
    fn strict(&self) -> bool {
        self.settings.ordering == KeyOrdering::Strict && self.tracks_status()
    }

    /// Whether outbox rows carry their status (`outbox.rows = "kept"`).
    fn tracks_status(&self) -> bool {
        self.settings.rows == RowLifecycle::Kept
    }

    /// Strict ordering starts from the keys the table says are in trouble.
    pub(super) async fn load_blocked_keys(&mut self) -> Result<(), ConnectorError> {
        if self.strict() {
            self.blocked = self.store.blocked_keys(None).await?;
            self.blocked_refreshed = Instant::now();
            if !self.blocked.is_empty() {
                tracing::info!(
                    keys = self.blocked.len(),
                    "keys held back by earlier failed events"
                );
            }
        }
        Ok(())
    }

    /// Takes in the keys the table holds back, at most once per refresh period and only
    /// when a transaction is about to be sent: an operator may have parked a row (or
    /// another process failed one) since the session started, and rows of that key read
    /// from now on must wait behind it. An idle outbox costs no query; a busy one one
    /// indexed query per period, and the period grows with the query's cost (at most
    /// 1/20 of the time goes to it). Keys are only added here: one this session blocked
    /// may not be in the table yet, and keys are released by [`Self::release_keys`].
    async fn refresh_blocked_keys(&mut self) -> Result<(), ConnectorError> {
        if !self.strict() || self.blocked_refreshed.elapsed() < self.blocked_refresh_every {
            return Ok(());
        }
        let started = Instant::now();
        let in_table = self.store.blocked_keys(None).await?;
        self.blocked_refreshed = Instant::now();
        self.blocked_refresh_every = (started.elapsed() * 20).max(MIN_BLOCKED_REFRESH);
        for key in in_table {
            if self.blocked.insert(key.clone()) {
                tracing::info!(biz_key = %key, "key held back: the table shows an earlier event of it not delivered (parked by an operator or failed elsewhere)");
            }
        }
        Ok(())
    }

    pub(super) async fn run<T: ChangeStream>(
        &mut self,
        stream: &mut T,
        link: &mut RetryLink,
        shutdown: &mut watch::Receiver<bool>,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), PipelineError> {
        let mut deliveries = Deliveries::new();
        let mut writing = Writing::new();
        let mut stopping_at: Option<Instant> = None;
        let mut stream_error: Option<ConnectorError> = None;
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);
        // The last outcome, or the first send after none was waiting: a broker outage
        // shows as records waiting with no outcome for `stall_warning`. Tokio's clock, so
        // that tests can advance it.
        let mut last_progress = tokio::time::Instant::now();
        self.waiting_since = tokio::time::Instant::now();
        // The two timers of the busy path live across iterations and are moved, not made
        // anew: a fresh `Sleep` per iteration registers a timer entry each time (6 % of
        // outboxd's CPU in a drain, BENCHMARKS.md).
        let flush_timer = tokio::time::sleep_until(far_future.into());
        let stall_timer = tokio::time::sleep_until(far_future.into());
        tokio::pin!(flush_timer, stall_timer);

        loop {
            let reading = stopping_at.is_none()
                && stream_error.is_none()
                && self.halt.is_none()
                && self.write_error.is_none()
                && !(self.exactly_once && self.window_due() && self.open_transaction.is_none())
                && self.within_bounds();
            let flush_at = self.batch_started.map_or(far_future, |t| {
                t + self.settings.delivery.writeback_interval
            });
            reset_timer(flush_timer.as_mut(), flush_at);
            // Progress moves the stall deadline at every outcome: the timer is only moved
            // once it went off or would go off too late; going off early costs a look.
            let stall_at = last_progress + self.settings.stall_warning;
            if stall_timer.is_elapsed() || stall_timer.deadline() > stall_at {
                stall_timer.as_mut().reset(stall_at);
            }

            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop), if stopping_at.is_none() => {
                    tracing::info!(
                        in_flight = self.in_flight,
                        "shutting down: draining in-flight deliveries"
                    );
                    stopping_at = Some(Instant::now() + self.settings.delivery.shutdown_deadline);
                }
                Some(written) = writing.next(), if !writing.is_empty() => {
                    self.finish_write(written, stream, &mut stopping_at).await;
                    let batch_full =
                        self.batch_seqs.len() >= self.settings.delivery.writeback_batch;
                    if self.flush_wanted || batch_full {
                        self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                    }
                }
                Some(done) = deliveries.next(), if !deliveries.is_empty() => {
                    last_progress = tokio::time::Instant::now();
                    self.waiting_since = last_progress;
                    self.destination_seen_healthy = false;
                    self.complete(done);
                    // Every other outcome already in: one turn of the loop for all of
                    // them, not one each (bounded, so reading is not starved).
                    for _ in 0..READY_OUTCOMES_PER_TURN {
                        match deliveries.next().now_or_never() {
                            Some(Some(done)) => self.complete(done),
                            _ => break,
                        }
                        if self.batch_seqs.len() >= self.settings.delivery.writeback_batch {
                            break;
                        }
                    }
                    let batch_full =
                        self.batch_seqs.len() >= self.settings.delivery.writeback_batch;
                    if batch_full && !self.exactly_once {
                        self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                    }
                }
                _ = &mut flush_timer,
                    if self.batch_started.is_some()
                        && writing.is_empty()
                        && self.write_error.is_none()
                        && !self.exactly_once =>
                {
                    self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                }
                _ = sleep_until(self.window_closes_at(far_future).into()),
                    if self.exactly_once && deliveries.is_empty() && self.may_commit() =>
                {
                    self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                }
                _ = &mut stall_timer, if !deliveries.is_empty() => {
                    // The timer may go off early (see above): then it is only moved on.
                    if last_progress.elapsed() >= self.settings.stall_warning {
                        tracing::warn!(
                            waiting = deliveries.len(),
                            for_at_least = ?self.settings.stall_warning,
                            strict_order = self.strict(),
                            "records wait for Kafka with no acknowledgement; under strict \
                             ordering they are kept and sent in order once the brokers answer \
                             (their rows stay INIT and the log position is held)"
                        );
                        last_progress = tokio::time::Instant::now();
                    }
                    if self.waiting_since.elapsed() >= self.settings.stuck_after {
                        self.rebuild_if_stuck(deliveries.len()).await;
                    }
                }
                Some(key) = link.delivered_keys.recv() => {
                    if self.blocked.contains(&key) {
                        self.maybe_released.insert(key);
                        if self.batch_started.is_none() && !self.exactly_once {
                            self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
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
                        if self.batch_started.is_none() && !self.exactly_once {
                            self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                        }
                    }
                    Ok(ChangeItem::Transaction(tx)) => 'item: {
                        backoff.reset();
                        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
                        let CommittedTransaction { commit_position, commit_time, mut events } = tx;
                        if self.uses_store_before_sending(&events) {
                            // The store has one connection, which the write-back under
                            // way holds: end that first (it is polled only here).
                            self.settle(&mut writing, stream, &mut stopping_at).await;
                            if self.write_error.is_some() {
                                // The database failed under that write-back: read no more.
                                break 'item;
                            }
                        }
                        if let Err(e) = self.drop_delivered(&mut events).await {
                            self.stop_on_store_error(e.into(), &mut stopping_at);
                            break 'item;
                        }
                        self.drop_refused(&mut events);
                        let seq = match self.open_transaction.take() {
                            Some(seq) => {
                                self.frontier.extend(seq, events.len(), Some(commit_position));
                                self.add_in_flight(events.len());
                                seq
                            }
                            None => self.push_slot(commit_position, events.len()),
                        };
                        if events.is_empty() {
                            // Every row delivered already: only the position moves on.
                            if self.batch_started.is_none() && !self.exactly_once {
                                self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
                            }
                        } else {
                            let store_free = writing.is_empty();
                            let ready = self.before_sending(commit_time, deliveries.is_empty(), &mut last_progress, store_free).await;
                            if let Err(e) = ready {
                                self.stop_on_store_error(e.into(), &mut stopping_at);
                                break 'item;
                            }
                            self.send_events(seq, events, &mut deliveries).await;
                        }
                    }
                    Ok(ChangeItem::Part(part)) if self.part_already_written(&part.begin_position) => {
                        tracing::debug!(
                            begins = %part.begin_position,
                            events = part.events.len(),
                            "part of a transaction written back before a restart; not sent again"
                        );
                    }
                    Ok(ChangeItem::Part(part)) => 'item: {
                        backoff.reset();
                        let TransactionPart { commit_time, mut events, .. } = part;
                        if self.uses_store_before_sending(&events) {
                            // The store has one connection, which the write-back under
                            // way holds: end that first (it is polled only here).
                            self.settle(&mut writing, stream, &mut stopping_at).await;
                            if self.write_error.is_some() {
                                // The database failed under that write-back: read no more.
                                break 'item;
                            }
                        }
                        if let Err(e) = self.drop_delivered(&mut events).await {
                            self.stop_on_store_error(e.into(), &mut stopping_at);
                            break 'item;
                        }
                        self.drop_refused(&mut events);
                        if self.open_transaction.is_none() {
                            self.open_events = 0;
                            self.open_bytes = 0;
                        }
                        self.open_events += events.len();
                        self.open_bytes += events.iter().map(OutboxEvent::size).sum::<usize>();
                        let seq = match self.open_transaction {
                            Some(seq) => {
                                self.frontier.extend(seq, events.len(), None);
                                self.add_in_flight(events.len());
                                seq
                            }
                            None => {
                                self.window_opened.get_or_insert_with(Instant::now);
                                let seq = self.frontier.open(events.len());
                                self.add_in_flight(events.len());
                                self.open_transaction = Some(seq);
                                seq
                            }
                        };
                        if !events.is_empty() {
                            let store_free = writing.is_empty();
                            let ready = self.before_sending(commit_time, deliveries.is_empty(), &mut last_progress, store_free).await;
                            if let Err(e) = ready {
                                self.stop_on_store_error(e.into(), &mut stopping_at);
                                break 'item;
                            }
                            self.send_events(seq, events, &mut deliveries).await;
                        }
                    }
                    Ok(ChangeItem::Progress(position)) => {
                        backoff.reset();
                        self.push_slot(position, 0);
                        if self.batch_started.is_none() && !self.exactly_once {
                            self.flush_or_drain(stream, &mut writing, &mut stopping_at).await;
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

            if self.exactly_once && deliveries.is_empty() {
                if self.may_commit() && (self.window_due() || stopping_at.is_some()) {
                    self.flush_or_drain(stream, &mut writing, &mut stopping_at)
                        .await;
                } else if self.open_transaction.is_some() && !self.within_bounds() {
                    self.abort_uncommitted().await;
                    return Err(ConnectorError::definite(format!(
                        "exactly-once: a database transaction holds more than \
                         delivery.max_in_flight ({}) events or delivery.max_in_flight_bytes \
                         ({} bytes), and a Kafka transaction must hold a whole one; raise \
                         them (memory grows with them) or set delivery.exactly_once = false",
                        self.settings.delivery.max_in_flight,
                        self.settings.delivery.max_in_flight_bytes
                    ))
                    .into());
                }
            }
            let draining =
                stopping_at.is_some() || self.halt.is_some() || self.write_error.is_some();
            if draining && deliveries.is_empty() {
                break;
            }
        }

        // A write-back under way ends first.
        self.settle(&mut writing, stream, &mut stopping_at).await;
        if let Some(error) = self.write_error.take() {
            self.abort_uncommitted().await;
            return Err(error);
        }
        if !self.exactly_once {
            self.flush_now(stream).await?;
        } else if deliveries.is_empty() && self.may_commit() {
            if let Err(e) = self.flush_now(stream).await {
                self.abort_uncommitted().await;
                return Err(e);
            }
        } else {
            // Only a whole, acknowledged window is committed; this one is aborted and its
            // rows are sent again by the next session.
            self.abort_uncommitted().await;
        }
        if let Some(error) = self.halt.take() {
            return Err(error);
        }
        match stream_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Flushes; when the write-back fails, the session stops reading and drains instead:
    /// the records in flight are acknowledged all the same, and their outcomes, kept in
    /// memory, are what the next session writes first. Without that they would be read
    /// again from the log and sent a second time.
    async fn flush_or_drain<T: ChangeStream>(
        &mut self,
        stream: &mut T,
        writing: &mut Writing<'a>,
        stopping_at: &mut Option<Instant>,
    ) {
        if self.write_error.is_some() {
            return;
        }
        if let Err(e) = self.flush(stream, writing).await {
            self.stop_on_store_error(e, stopping_at);
        }
    }

    /// Flushes. Exactly-once: now, stop-and-wait ([`Self::flush_now`]). At least once:
    /// the batch's write-back starts and the session reads and sends on meanwhile; its
    /// position is confirmed when it ends ([`Self::finish_write`]). While one is under
    /// way the batch keeps growing, and the next one starts when it ends: a write-back
    /// waits for the database (a commit, an fsync), and the relay no longer waits with
    /// it.
    async fn flush<T: ChangeStream>(
        &mut self,
        stream: &mut T,
        writing: &mut Writing<'a>,
    ) -> Result<(), PipelineError> {
        if self.exactly_once {
            return self.flush_now(stream).await;
        }
        if !writing.is_empty() {
            self.flush_wanted = true;
            return Ok(());
        }
        self.flush_wanted = false;
        for seq in self.batch_seqs.drain(..) {
            self.frontier.written(seq);
        }
        // The frontier may move before the write-back is durable: if it fails the
        // session ends, and what it did not confirm is read again from the log.
        let checkpoint = self.frontier.advance();
        self.batch_started = None;
        let outcomes = self.take_outcomes();
        if outcomes.len() == 0 {
            // Only the position moves (transactions without outbox rows, rows already
            // written): nothing to make durable first.
            self.release_keys().await?;
            return self.confirm(stream, checkpoint).await;
        }
        let bytes = std::mem::take(&mut self.batch_bytes);
        let store = self.store;
        let tracks_status = self.tracks_status();
        self.stats.metrics.writing_back(true);
        writing.push(Box::pin(async move {
            let batch = outcomes.batch(tracks_status, checkpoint.as_ref(), false);
            let result = write_back_with_retries(store, batch).await;
            Written {
                result,
                outcomes,
                bytes,
                checkpoint,
            }
        }));
        Ok(())
    }

    /// A write-back ended: count its rows out of flight, release the keys the retry
    /// worker delivered, and confirm its position. When it failed, its outcomes go back
    /// to the session (the next one writes them, see [`Self::take_unwritten`]) and the
    /// session drains.
    async fn finish_write<T: ChangeStream>(
        &mut self,
        written: Written,
        stream: &mut T,
        stopping_at: &mut Option<Instant>,
    ) {
        self.stats.metrics.writing_back(false);
        let Written {
            result,
            outcomes,
            bytes,
            checkpoint,
        } = written;
        if let Err(e) = result {
            self.restore_outcomes(outcomes);
            self.batch_bytes += bytes;
            self.stop_on_store_error(e.into(), stopping_at);
            return;
        }
        self.count_written(&outcomes, bytes);
        // Keys the retry worker delivered are released only once no FAILED, parked or
        // rejected outcome of this session waits in memory: the table does not show
        // those yet, so a key with one there would look free (they are written by a
        // later write-back, which looks again).
        let blocking_in_memory =
            !self.failed.is_empty() || !self.parked.is_empty() || !self.rejected.is_empty();
        let released = match blocking_in_memory {
            true => Ok(()),
            false => self.release_keys().await,
        };
        let confirmed = match released {
            Ok(()) => self.confirm(stream, checkpoint).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = confirmed {
            self.stop_on_store_error(e, stopping_at);
        }
    }

    /// Rows written back leave the in-flight count (and their bytes the budget); the
    /// counters take them in, and FAILED or parked rows wake the retry worker.
    fn count_written(&mut self, outcomes: &Outcomes, bytes: usize) {
        let Outcomes {
            delivered,
            failed,
            parked,
            rejected,
        } = outcomes;
        self.in_flight -= outcomes.len();
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
        self.stats
            .in_flight
            .store(self.in_flight as u64, Ordering::Relaxed);
        if !self.exactly_once {
            // Exactly-once counts them once their Kafka transaction commits.
            self.stats
                .published
                .fetch_add(delivered.len() as u64, Ordering::Relaxed);
        }
        self.stats
            .failed
            .fetch_add((failed.len() + rejected.len()) as u64, Ordering::Relaxed);
        if !failed.is_empty() || !parked.is_empty() {
            self.wake_worker.notify_one();
        }
    }

    /// The batch's outcomes, leaving the session's lists empty.
    fn take_outcomes(&mut self) -> Outcomes {
        Outcomes {
            delivered: std::mem::take(&mut self.delivered),
            failed: std::mem::take(&mut self.failed),
            parked: std::mem::take(&mut self.parked),
            rejected: std::mem::take(&mut self.rejected),
        }
    }

    /// Outcomes whose write-back failed, back with the session's (for the next session).
    fn restore_outcomes(&mut self, outcomes: Outcomes) {
        self.delivered.extend(outcomes.delivered);
        self.failed.extend(outcomes.failed);
        self.parked.extend(outcomes.parked);
        self.rejected.extend(outcomes.rejected);
    }

    /// Confirms `checkpoint` (durable in the table) to the source.
    async fn confirm<T: ChangeStream>(
        &mut self,
        stream: &mut T,
        checkpoint: Option<Position>,
    ) -> Result<(), PipelineError> {
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

    /// The database failed under the session (a write-back, or a lookup while reading):
    /// it reads no more, drains what is in flight, and ends with `error`; the outcomes
    /// collected meanwhile go to the next session ([`Self::take_unwritten`]).
    fn stop_on_store_error(&mut self, error: PipelineError, stopping_at: &mut Option<Instant>) {
        tracing::warn!(
            %error,
            in_flight = self.in_flight,
            "the database failed under the session; draining in-flight deliveries, whose \
             outcomes are written back once it answers again"
        );
        stopping_at
            .get_or_insert_with(|| Instant::now() + self.settings.delivery.shutdown_deadline);
        self.write_error.get_or_insert(error);
    }

    /// The outcomes this session collected and did not write back (it ended on an
    /// error): for the next session of this process.
    pub(super) fn take_unwritten(&mut self) -> Unwritten {
        if !self.tracks_status() {
            // Deleted rows have no status to write.
            return Unwritten::default();
        }
        if self.exactly_once {
            // Outcomes of records whose Kafka transaction was never committed: they are
            // sent again from the committed position, not written back. Except the rows
            // the destination refused inside it (see `complete`): FAILED, and not sent in
            // a transaction again, like those refused earlier and not yet passed.
            let failed = std::mem::take(&mut self.refused);
            let mut refused = std::mem::take(&mut self.refused_before);
            refused.extend(failed.iter().map(|f| RowId {
                table: f.table,
                id: f.id,
            }));
            return Unwritten {
                failed,
                refused,
                ..Unwritten::default()
            };
        }
        // Failures are carried only under strict ordering. There a parked row may be
        // parked behind one of them, and carried alone it would be written FAILED and due
        // while the failed row is still INIT: the claim worker, which takes a key's
        // earliest row in trouble, would send it before the relay reads the failed row
        // again. Written first, the failure holds its key back (the next session reads
        // the blocked keys after writing what it carried), so the transaction read again
        // parks the row instead of sending it next to the claim worker's retry. Without
        // strict ordering nothing is parked behind a failure, and nothing would hold the
        // failed row back when read again: left INIT, it is sent again once, by the relay.
        let failed = match self.strict() {
            true => std::mem::take(&mut self.failed),
            false => Vec::new(),
        };
        Unwritten {
            delivered: std::mem::take(&mut self.delivered),
            failed,
            parked: std::mem::take(&mut self.parked),
            rejected: std::mem::take(&mut self.rejected),
            refused: HashSet::new(),
        }
    }

    /// Writes the outcomes an earlier session of this process collected and could not
    /// write back, before anything is read: rows Kafka acknowledged become SUCCESS now
    /// instead of being sent again when their transaction is read again; failed, parked
    /// and rejected rows take their status in the same database transaction, so a parked
    /// row is never due before the failure it waits behind. No checkpoint moves: their
    /// transactions are read again and skip those rows ([`Self::load_delivered_through`]
    /// and [`Self::load_blocked_keys`] run after this).
    pub(super) async fn write_unwritten(
        &mut self,
        unwritten: &mut Unwritten,
    ) -> Result<(), ConnectorError> {
        if unwritten.is_empty() {
            self.refused_before = std::mem::take(&mut unwritten.refused);
            return Ok(());
        }
        let batch = WriteBack {
            delivered: &unwritten.delivered,
            failed: &unwritten.failed,
            parked: &unwritten.parked,
            rejected: &unwritten.rejected,
            checkpoint: None,
            // Exactly-once carries only refused rows, which an aborted window may have
            // shown SUCCESS: FAILED is the truth (see `WriteBack::replace_positions`).
            replace_positions: self.exactly_once,
        };
        write_back_with_retries(self.store, batch).await?;
        // Counted now: the session that collected them could not write them.
        let failed = unwritten.failed.len() + unwritten.rejected.len();
        self.stats
            .failed
            .fetch_add(failed as u64, Ordering::Relaxed);
        if !unwritten.failed.is_empty() || !unwritten.parked.is_empty() {
            self.wake_worker.notify_one();
        }
        tracing::info!(
            delivered = unwritten.delivered.len(),
            failed = unwritten.failed.len(),
            rejected = unwritten.rejected.len(),
            parked = unwritten.parked.len(),
            "outcomes the previous session could not write back are written; those rows \
             are not sent again"
        );
        self.refused_before = std::mem::take(&mut unwritten.refused);
        *unwritten = Unwritten::default();
        Ok(())
    }

    /// Exactly-once: the session ends without committing its window.
    async fn abort_uncommitted(&self) {
        if self.exactly_once {
            self.sink.abort().await;
        }
    }

    /// Exactly-once: the open Kafka transaction may be committed (nothing failed, no
    /// source transaction half read, something to commit).
    fn may_commit(&self) -> bool {
        self.window_opened.is_some()
            && self.open_transaction.is_none()
            && self.halt.is_none()
            && self.write_error.is_none()
    }

    /// Exactly-once: the open Kafka transaction has lasted its interval, or no more can
    /// be read into it.
    fn window_due(&self) -> bool {
        self.window_opened
            .is_some_and(|t| t.elapsed() >= self.settings.delivery.transaction_interval)
            || self.window_full()
    }

    /// Whether reading may go on. Exactly-once, inside a source transaction: as long as
    /// that transaction alone is within the bounds (the window may hold up to twice them
    /// then), since its Kafka transaction cannot be committed before its end.
    fn within_bounds(&self) -> bool {
        let d = &self.settings.delivery;
        if self.exactly_once && self.open_transaction.is_some() {
            self.open_events < d.max_in_flight && self.open_bytes < d.max_in_flight_bytes
        } else {
            self.in_flight < d.max_in_flight && self.in_flight_bytes < d.max_in_flight_bytes
        }
    }

    fn window_full(&self) -> bool {
        self.in_flight >= self.settings.delivery.max_in_flight
            || self.in_flight_bytes >= self.settings.delivery.max_in_flight_bytes
    }

    fn window_closes_at(&self, never: Instant) -> Instant {
        self.window_opened
            .map_or(never, |t| t + self.settings.delivery.transaction_interval)
    }

    fn push_slot(&mut self, position: Position, events: usize) -> u64 {
        self.window_opened.get_or_insert_with(Instant::now);
        let seq = self.frontier.push(position, events);
        self.add_in_flight(events);
        seq
    }

    fn add_in_flight(&mut self, events: usize) {
        self.in_flight += events;
        self.stats
            .in_flight
            .store(self.in_flight as u64, Ordering::Relaxed);
    }

    /// A transaction's part is of one written back before a restart when it begins
    /// before the checkpoint read at session start (see [`TransactionPart`]).
    fn part_already_written(&self, begins: &Position) -> bool {
        self.written_through.as_ref().is_some_and(|w| begins < w)
    }

    /// Records have waited `stuck_after` with no outcome. A fresh client's look at the
    /// destination tells an outage (no answer, a leaderless or under-replicated
    /// partition: keep waiting, strict ordering) from a stuck producer: healthy at two
    /// looks in a row, `stuck_after` apart, with still no acknowledgement (the first look
    /// gives a producer coming back from its reconnect backoff time to notice). Then the
    /// producer is rebuilt, its deliveries fail Fatal (rows INIT, no attempt counted), and
    /// the session halts at once (nothing more is read or sent through the new producer
    /// while the old records are undecided), so the next session reads them again and
    /// sends them in order.
    async fn rebuild_if_stuck(&mut self, waiting: usize) {
        let waited = self.waiting_since.elapsed();
        let probe_timeout = self
            .settings
            .stall_warning
            .clamp(Duration::from_secs(1), Duration::from_secs(10));
        match self.sink.destination_healthy(probe_timeout).await {
            Ok(true) if self.destination_seen_healthy => match self.sink.rebuild().await {
                Ok(()) => {
                    self.stats.producer_rebuilds.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        waiting,
                        for_at_least = ?waited,
                        "records waited for Kafka with no acknowledgement while a fresh \
                         client found the brokers healthy twice: the producer was stuck and \
                         has been rebuilt; its records are read again from the log and sent \
                         again in order (outboxd_kafka_producer_rebuilds_total)"
                    );
                    self.halt.get_or_insert(PipelineError::SinkFailed(
                        "the Kafka producer was stuck and has been rebuilt; the records it \
                         held are read again from the log"
                            .into(),
                    ));
                    self.destination_seen_healthy = false;
                }
                Err(e) => tracing::warn!(error = %e, "cannot rebuild a stuck Kafka producer"),
            },
            Ok(true) => {
                tracing::info!(
                    waiting,
                    "records still wait for Kafka while a fresh client finds the brokers \
                     healthy; the producer is rebuilt if nothing is acknowledged by the next look"
                );
                self.destination_seen_healthy = true;
            }
            Ok(false) => {
                tracing::debug!(
                    waiting,
                    "records still wait for Kafka, and a fresh client does not find it healthy"
                );
                self.destination_seen_healthy = false;
            }
            Err(e) => tracing::warn!(error = %e, "cannot probe Kafka for a stuck producer"),
        }
        self.waiting_since = tokio::time::Instant::now();
    }

    /// What reading events to send does besides sending them: the lag measure when
    /// nothing was in flight, the stall clock, and strict ordering's look at the table.
    /// `store_free`: no write-back holds the store's connection (its look at the table
    /// waits for the next transaction otherwise; see [`Self::uses_store_before_sending`]).
    async fn before_sending(
        &mut self,
        commit_time: Option<SystemTime>,
        nothing_waiting: bool,
        last_progress: &mut tokio::time::Instant,
        store_free: bool,
    ) -> Result<(), ConnectorError> {
        if self.in_flight_bytes == 0 {
            self.stats.metrics.read_while_idle(commit_time);
        }
        if nothing_waiting {
            *last_progress = tokio::time::Instant::now();
            self.waiting_since = *last_progress;
        }
        match store_free {
            true => self.refresh_blocked_keys().await,
            false => Ok(()),
        }
    }

    async fn send_events(
        &mut self,
        seq: u64,
        events: Vec<OutboxEvent>,
        deliveries: &mut Deliveries,
    ) {
        let mut events = events.into_iter();
        while let Some(mut event) = events.next() {
            let size = event.size();
            self.in_flight_bytes += size;
            if let Some(reason) = event.rejected.take().or_else(|| self.sink.refusal(&event)) {
                if !self.tracks_status() {
                    // No row to mark: stop before it, never skip it (nor send what follows).
                    self.in_flight_bytes = self.in_flight_bytes.saturating_sub(size);
                    self.in_flight -= 1 + events.len();
                    self.stats
                        .in_flight
                        .store(self.in_flight as u64, Ordering::Relaxed);
                    self.halt.get_or_insert(PipelineError::Unpublishable {
                        message_id: event.message_id,
                        reason,
                    });
                    return;
                }
                // Retrying cannot help: MANUAL_REQUIRED with the reason, never sent; its
                // key waits behind it like behind any event in trouble.
                if self.strict() && !event.biz_key.is_empty() {
                    self.blocked.insert(event.biz_key);
                }
                self.rejected.push(ParkedEvent {
                    id: event.id,
                    table: event.table,
                    reason,
                });
                self.batch_bytes += size;
                self.batch_seqs.push(seq);
                self.batch_started.get_or_insert_with(Instant::now);
                continue;
            }
            if self.strict() && self.blocked.contains(&event.biz_key) {
                tracing::debug!(
                    id = event.id,
                    message_id = %event.message_id,
                    biz_key = %event.biz_key,
                    "parked behind an earlier event of its key"
                );
                self.parked.push(ParkedEvent {
                    id: event.id,
                    table: event.table,
                    reason: parked_behind_key("parked", &event.biz_key),
                });
                self.stats.parked.fetch_add(1, Ordering::Relaxed);
                self.batch_bytes += size;
                self.batch_seqs.push(seq);
                self.batch_started.get_or_insert_with(Instant::now);
                continue;
            }
            let topic = self.sink.destination(&event);
            // Only a traced event gets a span: the relay's path pays a look at the
            // headers per event, no span.
            let span = trace_context::send_span(&event);
            let delivery = match &span {
                Some(span) => self.sink.send(&event).instrument(span.clone()).await,
                None => self.sink.send(&event).await,
            };
            deliveries.push(Box::pin(track(seq, size, event, topic, delivery, span)));
        }
    }

    fn complete(&mut self, done: Completed) {
        // What is logged about a traced event below is inside its span.
        let _entered = done.span.as_ref().map(tracing::Span::enter);
        let outcome = Outcome::new(
            done.row,
            done.retry_count,
            done.result,
            &self.settings.retry,
        );
        match outcome {
            Outcome::Delivered(delivered) => {
                if self.exactly_once {
                    self.uncommitted.add(done.topic, done.commit_time);
                } else {
                    self.stats.metrics.acked(&done.topic, done.commit_time);
                }
                self.delivered.push(delivered);
            }
            Outcome::Failed {
                failure,
                kind: FailureKind::Fatal,
            } => {
                // The sink failed, not the row: it stays INIT and unwritten, so its
                // transaction holds the checkpoint, and the next session (after the sink
                // is rebuilt) reads it from the log and sends it again. No attempt counts.
                tracing::warn!(
                    id = done.row.id,
                    message_id = %done.message_id,
                    error = %failure.error,
                    "the sink failed fatally; the row stays INIT and is sent again once the \
                     sink is rebuilt"
                );
                self.halt
                    .get_or_insert(PipelineError::SinkFailed(failure.error));
                self.in_flight -= 1;
                self.in_flight_bytes = self.in_flight_bytes.saturating_sub(done.size);
                self.stats
                    .in_flight
                    .store(self.in_flight as u64, Ordering::Relaxed);
                return;
            }
            Outcome::Failed { failure, kind } if !self.tracks_status() => {
                // No row to mark FAILED: the transaction holds the log position, and the
                // session ends once what is in flight is collected; the next one reads it
                // again (after a backoff) and sends it again. A record that can never go
                // as it is (too large, invalid) would fail the same way every time: the
                // relay stops before it instead.
                self.stats.metrics.failed(&done.topic);
                tracing::warn!(
                    message_id = %done.message_id,
                    topic = %done.topic,
                    position = %display_position(self.frontier.position(done.seq)),
                    error = %failure.error,
                    "delivery failed; the log position is held and the record is sent again"
                );
                self.halt.get_or_insert(match kind {
                    FailureKind::Rejected => PipelineError::Unpublishable {
                        message_id: done.message_id,
                        reason: failure.error,
                    },
                    _ => PipelineError::NotDelivered(failure.error),
                });
                self.in_flight -= 1;
                self.in_flight_bytes = self.in_flight_bytes.saturating_sub(done.size);
                self.stats
                    .in_flight
                    .store(self.in_flight as u64, Ordering::Relaxed);
                return;
            }
            Outcome::Failed { failure, .. } if self.exactly_once => {
                // Inside a Kafka transaction a record the destination does not take (too
                // large for its topic, say) dooms the transaction: it can only be aborted,
                // and sent again as it is, it would be doomed again, every session. So the
                // row leaves the relay's transactions: the session ends without writing
                // or committing this window (nothing of it is written SUCCESS), and the
                // next one writes the row FAILED before it reads, does not send it again
                // (`drop_refused`; strict ordering: its key waits behind the FAILED row),
                // and sends the rest. One bad row does not stop the relay.
                self.stats.metrics.failed(&done.topic);
                tracing::warn!(
                    id = done.row.id,
                    message_id = %done.message_id,
                    topic = %done.topic,
                    error = %failure.error,
                    "exactly-once: the destination refused a record inside the Kafka \
                     transaction, which is aborted; the row becomes FAILED outside it and \
                     the rest is sent again"
                );
                self.halt
                    .get_or_insert(PipelineError::RefusedInTransaction {
                        message_id: done.message_id,
                        reason: failure.error.clone(),
                    });
                self.refused.push(failure);
                self.in_flight -= 1;
                self.in_flight_bytes = self.in_flight_bytes.saturating_sub(done.size);
                self.stats
                    .in_flight
                    .store(self.in_flight as u64, Ordering::Relaxed);
                return;
            }
            Outcome::Failed { failure, .. } => {
                self.stats.metrics.failed(&done.topic);
                tracing::warn!(
                    id = done.row.id,
                    message_id = %done.message_id,
                    topic = %done.topic,
                    position = %display_position(self.frontier.position(done.seq)),
                    error = %failure.error,
                    "delivery failed; the row becomes FAILED and is retried later"
                );
                if self.strict() {
                    self.blocked.insert(done.biz_key);
                }
                self.failed.push(failure);
            }
        }
        self.batch_bytes += done.size;
        self.batch_seqs.push(done.seq);
        self.batch_started.get_or_insert_with(Instant::now);
    }

    /// Writes the batch back with the checkpoint it completes, then confirms that
    /// position to the source, before it returns (exactly-once, and the last flush of a
    /// session). Transient store errors are retried a few times before the session gives
    /// up (and the rows are read again from the log).
    async fn flush_now<T: ChangeStream>(&mut self, stream: &mut T) -> Result<(), PipelineError> {
        for seq in self.batch_seqs.drain(..) {
            self.frontier.written(seq);
        }
        // If anything below fails the session ends, and what it did not confirm is read
        // again from the log: the frontier may move before the write-back is durable.
        let checkpoint = self.frontier.advance();
        // Exactly-once: records delivered in this window, published once it commits.
        let mut delivered_in_window = 0;
        let mut window = UncommittedRecords::default();
        // Exactly-once: the checkpoint row never passes what Kafka has committed (a crash
        // before the commit below must find these transactions still to send).
        let written_checkpoint = if self.exactly_once {
            self.kafka_committed.clone()
        } else {
            checkpoint.clone()
        };

        // Exactly-once writes the checkpoint row at every commit, rows or not: a commit
        // records what the row shows (see `start_from_committed`).
        let checkpoint_moves = self.exactly_once
            && written_checkpoint.is_some()
            && written_checkpoint != self.checkpoint_written;
        if !self.delivered.is_empty()
            || !self.failed.is_empty()
            || !self.parked.is_empty()
            || !self.rejected.is_empty()
            || checkpoint_moves
        {
            let outcomes = self.take_outcomes();
            // Exactly-once: the records of these outcomes are the window's (a failure
            // below ends the session, and they are sent again in the next).
            window = std::mem::take(&mut self.uncommitted);
            let batch = outcomes.batch(
                self.tracks_status(),
                written_checkpoint.as_ref(),
                self.exactly_once,
            );
            self.stats.metrics.writing_back(true);
            let written = write_back_with_retries(self.store, batch).await;
            self.stats.metrics.writing_back(false);
            if let Err(e) = written {
                // Kept for the next session (see `take_unwritten`).
                self.restore_outcomes(outcomes);
                return Err(e.into());
            }
            let bytes = std::mem::take(&mut self.batch_bytes);
            self.count_written(&outcomes, bytes);
            delivered_in_window = outcomes.delivered.len();
        }
        self.batch_started = None;
        if self.exactly_once {
            if written_checkpoint.is_some() {
                self.checkpoint_written.clone_from(&written_checkpoint);
            }
            // A window of transactions read again below the committed position sent
            // nothing: its position must not replace a later one.
            let advanced = checkpoint
                .as_ref()
                .filter(|p| Some(*p) > self.kafka_committed.as_ref());
            if let Some(position) = advanced {
                let committed = CommittedPosition {
                    position: position.clone(),
                    checkpoint: self.checkpoint_written.clone(),
                };
                self.sink
                    .commit(&committed)
                    .await
                    .map_err(|f| PipelineError::SinkFailed(f.error))?;
                self.kafka_committed = Some(committed.position);
                // What this session read is committed now, the refused rows it dropped
                // included: their transactions are not read again.
                for row in self.dropped_refused.drain(..) {
                    self.refused_before.remove(&row);
                }
                self.stats
                    .published
                    .fetch_add(delivered_in_window as u64, Ordering::Relaxed);
                self.stats.metrics.committed(&window);
            }
            self.window_opened = None;
        }
        self.release_keys().await?;
        self.confirm(stream, checkpoint).await
    }

    /// Unblocks the keys whose rows the retry worker delivered, once the table shows no
    /// FAILED, PROCESSING or MANUAL_REQUIRED row of theirs. Runs after a write-back, and
    /// only when every row this session parked or failed is in the table (see
    /// [`Self::finish_write`]), so the table's answer is the whole truth.
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

/// Outcomes taken per turn of the session loop once one is ready.
const READY_OUTCOMES_PER_TURN: usize = 256;

/// Moves `timer` to `at` unless it is already there (a reset re-registers the entry).
fn reset_timer(timer: std::pin::Pin<&mut tokio::time::Sleep>, at: Instant) {
    let at = tokio::time::Instant::from_std(at);
    if timer.deadline() != at {
        timer.reset(at);
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
