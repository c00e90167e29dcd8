//! The write-back: outcomes gathered into a batch and written back with the checkpoint
//! they complete, in one database transaction, before that position is confirmed to the
//! stream. At least once the write-back runs while the session reads and sends on;
//! exactly-once it goes with the Kafka transaction's commit. Outcomes a session could not
//! write back are carried to the next session of the process ([`Unwritten`]).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use outboxd_connector::{
    ChangeStream, ConnectorError, Delivered, DeliveryFailure, OutboxStore, ParkedEvent, Position,
    RowId, WriteBack,
};

use super::{display_position, RunState, Session};
use crate::observability::UncommittedRecords;
use crate::relay::PipelineError;
use crate::sink::{CommittedPosition, Sink};

/// Outcomes a session collected and could not write back, carried to the next session of
/// the same process (see [`Session::write_unwritten`]). Delivery failures only under
/// strict ordering, and under exactly-once only the rows refused inside a Kafka
/// transaction: see [`Session::take_unwritten`].
#[derive(Debug, Default)]
pub(in crate::relay) struct Unwritten {
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
    pub(in crate::relay) fn merge(&mut self, later: Unwritten) {
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

/// At least once: the write-back under way while the session reads and sends on (at most
/// one, so checkpoints are written and positions confirmed in order).
pub(super) type Writing<'a> = FuturesUnordered<BoxFuture<'a, Written>>;

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
pub(super) struct Written {
    result: Result<(), ConnectorError>,
    outcomes: Outcomes,
    bytes: usize,
    checkpoint: Option<Position>,
}

impl<'a, O: OutboxStore, S: Sink> Session<'a, O, S> {
    /// Ends the write-back under way, if any.
    pub(super) async fn settle<T: ChangeStream>(
        &mut self,
        writing: &mut Writing<'a>,
        stream: &mut T,
        stopping_at: &mut Option<Instant>,
    ) {
        while let Some(written) = writing.next().await {
            self.finish_write(written, stream, stopping_at).await;
        }
    }

    /// Flushes; when the write-back fails, the session stops reading and drains instead:
    /// the records in flight are acknowledged all the same, and their outcomes, kept in
    /// memory, are what the next session writes first. Without that they would be read
    /// again from the log and sent a second time.
    pub(super) async fn flush_or_drain<T: ChangeStream>(
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
        let limit = self.settings.delivery.store_timeout;
        self.stats.metrics.writing_back(true);
        writing.push(Box::pin(async move {
            let batch = outcomes.batch(tracks_status, checkpoint.as_ref(), false);
            let result = write_back_with_retries(store, batch, limit).await;
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

    /// The write-back under way ended; the next starts at once when one was asked for
    /// meanwhile or the batch is full.
    pub(super) async fn on_written<T: ChangeStream>(
        &mut self,
        written: Written,
        stream: &mut T,
        state: &mut RunState<'a>,
    ) {
        self.finish_write(written, stream, &mut state.stopping_at)
            .await;
        let batch_full = self.batch_seqs.len() >= self.settings.delivery.writeback_batch;
        if self.flush_wanted || batch_full {
            self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                .await;
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
    pub(super) fn stop_on_store_error(
        &mut self,
        error: PipelineError,
        stopping_at: &mut Option<Instant>,
    ) {
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
    pub(in crate::relay) fn take_unwritten(&mut self) -> Unwritten {
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
    pub(in crate::relay) async fn write_unwritten(
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
        write_back_with_retries(self.store, batch, self.settings.delivery.store_timeout).await?;
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

    /// Writes the batch back with the checkpoint it completes, then confirms that
    /// position to the source, before it returns (exactly-once, and the last flush of a
    /// session). Transient store errors are retried a few times before the session gives
    /// up (and the rows are read again from the log).
    pub(super) async fn flush_now<T: ChangeStream>(
        &mut self,
        stream: &mut T,
    ) -> Result<(), PipelineError> {
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
            let written =
                write_back_with_retries(self.store, batch, self.settings.delivery.store_timeout)
                    .await;
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
                for canary in window.canaries() {
                    self.stats.canary.delivered(canary);
                }
            }
            self.window_opened = None;
        }
        self.release_keys().await?;
        self.confirm(stream, checkpoint).await
    }
}

/// The write-back, tried again after a transient error. Each attempt is bounded by
/// `limit` (`delivery.store_timeout`); one that gets no answer is not tried again on the
/// same connection, whose unanswered statement would hold the next one too: the session
/// ends, and the next one writes the outcomes on a new connection.
async fn write_back_with_retries<O: OutboxStore>(
    store: &O,
    batch: WriteBack<'_>,
    limit: Duration,
) -> Result<(), ConnectorError> {
    const ATTEMPTS: u32 = 5;
    let mut delay = Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        let answer = tokio::time::timeout(limit, store.write_back(batch)).await;
        let Ok(result) = answer else {
            return Err(crate::reconnect::unanswered("the status write-back", limit));
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::warn!(
                    error = %e,
                    attempt,
                    rows = batch.delivered.len() + batch.failed.len() + batch.parked.len(),
                    first_id = ?batch
                        .delivered
                        .first()
                        .map(|d| d.id)
                        .or(batch.failed.first().map(|f| f.id)),
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
