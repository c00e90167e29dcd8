//! One connected session of the log relay: the in-flight window, strict-ordering parking,
//! the write-back batch, and the drain at shutdown or after a stream error.
//!
//! Dataflow: `stream.next()` → for each event, park it (strict ordering, key blocked) or
//! `sink.send` it into `deliveries` → outcomes come back in any order → `complete` turns
//! each into a row write-back and marks its slot in the [`AckFrontier`] → `flush` writes
//! the batch back with the checkpoint it completes, in one transaction, then confirms that
//! position to the stream.
//!
//! Its jobs, file by file: `reading.rs` takes what the stream gives (a transaction, a part
//! of one, a position, an error); `window.rs` sends events, bounds what is in flight and
//! takes the outcomes as they come back (and what to do when none come); `write_back.rs`
//! writes the batch back with its checkpoint and confirms that position, and carries what
//! a session could not write to the next; `blocked_keys.rs` holds strict ordering's keys
//! back and releases them. This file holds the session's state, its opening (where it
//! starts reading from) and the loop that ties the rest together.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::StreamExt;
use outboxd_connector::{
    ChangeStream, ConnectorError, Delivered, DeliveryFailure, OutboxStore, ParkedEvent, Position,
    RowId,
};
use tokio::sync::{watch, Notify};
use tokio::time::sleep_until;

use super::frontier::AckFrontier;
use super::{PipelineError, PipelineSettings, PipelineStats, RetryLink, RowLifecycle};
use crate::config::Ordering as KeyOrdering;
use crate::observability::UncommittedRecords;
use crate::reconnect::ReconnectBackoff;
use crate::sink::{CommittedPosition, Sink};

mod blocked_keys;
mod reading;
mod window;
mod write_back;

use blocked_keys::MIN_BLOCKED_REFRESH;
use window::Deliveries;
pub(super) use write_back::Unwritten;
use write_back::Writing;

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
            self.delivered_through = (self.ask(
                "the highest delivered id",
                self.store.highest_delivered_id(),
            ))
            .await?;
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

    /// Reads, sends and writes back until shutdown, a stream or store error or a halt;
    /// then drains what is in flight (up to `delivery.shutdown_deadline`) and writes it
    /// back.
    pub(super) async fn run<T: ChangeStream>(
        &mut self,
        stream: &mut T,
        link: &mut RetryLink,
        shutdown: &mut watch::Receiver<bool>,
        backoff: &mut ReconnectBackoff,
    ) -> Result<(), PipelineError> {
        let far_future = Instant::now() + Duration::from_secs(86_400 * 365);
        let mut state = RunState {
            deliveries: Deliveries::new(),
            writing: Writing::new(),
            stopping_at: None,
            stream_error: None,
            last_progress: tokio::time::Instant::now(),
        };
        self.waiting_since = tokio::time::Instant::now();
        // The two timers of the busy path live across iterations and are moved, not made
        // anew: a fresh `Sleep` per iteration registers a timer entry each time (6 % of
        // outboxd's CPU in a drain, docs/benchmarks.md).
        let flush_timer = tokio::time::sleep_until(far_future.into());
        let stall_timer = tokio::time::sleep_until(far_future.into());
        tokio::pin!(flush_timer, stall_timer);

        loop {
            let reading = state.stopping_at.is_none()
                && state.stream_error.is_none()
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
            let stall_at = state.last_progress + self.settings.stall_warning;
            if stall_timer.is_elapsed() || stall_timer.deadline() > stall_at {
                stall_timer.as_mut().reset(stall_at);
            }

            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop), if state.stopping_at.is_none() => {
                    self.on_shutdown(&mut state);
                }
                Some(written) = state.writing.next(), if !state.writing.is_empty() => {
                    self.on_written(written, stream, &mut state).await;
                }
                Some(done) = state.deliveries.next(), if !state.deliveries.is_empty() => {
                    self.on_outcome(done, stream, &mut state).await;
                }
                _ = &mut flush_timer,
                    if self.batch_started.is_some()
                        && state.writing.is_empty()
                        && self.write_error.is_none()
                        && !self.exactly_once =>
                {
                    self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                        .await;
                }
                _ = sleep_until(self.window_closes_at(far_future).into()),
                    if self.exactly_once && state.deliveries.is_empty() && self.may_commit() =>
                {
                    self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                        .await;
                }
                _ = &mut stall_timer, if !state.deliveries.is_empty() => {
                    self.on_stall(&mut state).await;
                }
                Some(key) = link.delivered_keys.recv() => {
                    self.on_delivered_key(key, stream, &mut state).await;
                }
                item = stream.next(), if reading => {
                    self.on_item(item, stream, backoff, &mut state).await;
                }
                _ = sleep_until(state.stopping_at.unwrap_or(far_future).into()),
                    if state.stopping_at.is_some() =>
                {
                    tracing::warn!(
                        unacknowledged = state.deliveries.len(),
                        resume_from = %display_position(self.last_confirmed.as_ref()),
                        "shutdown deadline passed; their rows stay INIT and are sent again on \
                         restart"
                    );
                    break;
                }
            }

            if self.exactly_once && state.deliveries.is_empty() {
                if self.may_commit() && (self.window_due() || state.stopping_at.is_some()) {
                    self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
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
                state.stopping_at.is_some() || self.halt.is_some() || self.write_error.is_some();
            if draining && state.deliveries.is_empty() {
                break;
            }
        }

        // A write-back under way ends first.
        self.settle(&mut state.writing, stream, &mut state.stopping_at)
            .await;
        if let Some(error) = self.write_error.take() {
            self.abort_uncommitted().await;
            return Err(error);
        }
        if !self.exactly_once {
            self.flush_now(stream).await?;
        } else if state.deliveries.is_empty() && self.may_commit() {
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
        match state.stream_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Shutdown was asked for: the session reads no more and drains what is in flight.
    fn on_shutdown(&mut self, state: &mut RunState<'a>) {
        tracing::info!(
            in_flight = self.in_flight,
            "shutting down: draining in-flight deliveries"
        );
        state.stopping_at = Some(Instant::now() + self.settings.delivery.shutdown_deadline);
    }
}

/// What one [`Session::run`] keeps across the turns of its loop, shared by its arms.
struct RunState<'a> {
    /// Records handed to the sink whose outcome is not yet known.
    deliveries: Deliveries,
    /// At least once: the write-back under way.
    writing: Writing<'a>,
    /// Once the session stops reading (shutdown, a stream or store error): the deadline
    /// of the drain.
    stopping_at: Option<Instant>,
    /// The log stream failed: the session drains and ends with this error.
    stream_error: Option<ConnectorError>,
    /// The last outcome, or the first send after none was waiting: a broker outage
    /// shows as records waiting with no outcome for `stall_warning`. Tokio's clock, so
    /// that tests can advance it.
    last_progress: tokio::time::Instant,
}

impl<O: OutboxStore, S: Sink> Session<'_, O, S> {
    /// `call` bounded by `delivery.store_timeout` (see [`crate::reconnect::answered`]).
    pub(in crate::relay) async fn ask<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, ConnectorError>>,
    ) -> Result<T, ConnectorError> {
        crate::reconnect::answered(self.settings.delivery.store_timeout, what, call).await
    }
}

/// Moves `timer` to `at` unless it is already there (a reset re-registers the entry).
fn reset_timer(timer: std::pin::Pin<&mut tokio::time::Sleep>, at: Instant) {
    let at = tokio::time::Instant::from_std(at);
    if timer.deadline() != at {
        timer.reset(at);
    }
}

/// A position for logs; `none` before the first confirmation.
fn display_position(position: Option<&Position>) -> String {
    position.map_or_else(|| "none".to_owned(), ToString::to_string)
}
