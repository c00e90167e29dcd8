//! Reading the log: what a committed transaction, a part of one still open, a position
//! without outbox rows or a stream error does to the session. Rows of a transaction read
//! again that an earlier session delivered (or, exactly-once, that the destination
//! refused inside a Kafka transaction) are dropped before they are sent.

use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use outboxd_connector::{
    ChangeItem, ChangeStream, CommittedTransaction, ConnectorError, OutboxEvent, OutboxStore,
    Position, RowId, TransactionPart,
};

use super::{RunState, Session};
use crate::reconnect::ReconnectBackoff;
use crate::sink::Sink;

impl<'a, O: OutboxStore, S: Sink> Session<'a, O, S> {
    /// What the log stream gave: a committed transaction (or the end of one read in
    /// parts), a part of one, a position without outbox rows, or an error, after which
    /// the session reads no more and drains.
    pub(super) async fn on_item<T: ChangeStream>(
        &mut self,
        item: Result<ChangeItem, ConnectorError>,
        stream: &mut T,
        backoff: &mut ReconnectBackoff,
        state: &mut RunState<'a>,
    ) {
        match item {
            Ok(ChangeItem::Transaction(tx)) if self.already_written(&tx.commit_position) => {
                tracing::debug!(
                    position = %tx.commit_position,
                    events = tx.events.len(),
                    "already written back before a restart; not sent again"
                );
                self.push_slot(tx.commit_position, 0);
                if self.batch_started.is_none() && !self.exactly_once {
                    self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                        .await;
                }
            }
            Ok(ChangeItem::Transaction(tx)) => {
                self.on_transaction(tx, stream, backoff, state).await;
            }
            Ok(ChangeItem::Part(part)) if self.part_already_written(&part.begin_position) => {
                tracing::debug!(
                    begins = %part.begin_position,
                    events = part.events.len(),
                    "part of a transaction written back before a restart; not sent again"
                );
            }
            Ok(ChangeItem::Part(part)) => self.on_part(part, stream, backoff, state).await,
            Ok(ChangeItem::Progress(position)) => {
                backoff.reset();
                self.push_slot(position, 0);
                if self.batch_started.is_none() && !self.exactly_once {
                    self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                        .await;
                }
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    in_flight = self.in_flight,
                    confirmed = %super::display_position(self.last_confirmed.as_ref()),
                    "log stream failed; draining in-flight deliveries"
                );
                state.stopping_at = Some(Instant::now() + self.settings.delivery.shutdown_deadline);
                state.stream_error = Some(e);
            }
        }
    }

    /// A committed transaction (or the end of one whose parts came before): its events
    /// take its slot (or the open one's) and are sent.
    async fn on_transaction<T: ChangeStream>(
        &mut self,
        tx: CommittedTransaction,
        stream: &mut T,
        backoff: &mut ReconnectBackoff,
        state: &mut RunState<'a>,
    ) {
        backoff.reset();
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        let CommittedTransaction {
            commit_position,
            commit_time,
            mut events,
        } = tx;
        if !self.prepare_events(&mut events, stream, state).await {
            return;
        }
        let seq = match self.open_transaction.take() {
            Some(seq) => {
                self.frontier
                    .extend(seq, events.len(), Some(commit_position));
                self.add_in_flight(events.len());
                seq
            }
            None => self.push_slot(commit_position, events.len()),
        };
        if events.is_empty() {
            // Every row delivered already: only the position moves on.
            if self.batch_started.is_none() && !self.exactly_once {
                self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                    .await;
            }
        } else {
            self.send_read(seq, events, commit_time, state).await;
        }
    }

    /// A part of a large transaction whose end is still to come: it opens the
    /// transaction's slot (or extends it) and its events are sent.
    async fn on_part<T: ChangeStream>(
        &mut self,
        part: TransactionPart,
        stream: &mut T,
        backoff: &mut ReconnectBackoff,
        state: &mut RunState<'a>,
    ) {
        backoff.reset();
        let TransactionPart {
            commit_time,
            mut events,
            ..
        } = part;
        if !self.prepare_events(&mut events, stream, state).await {
            return;
        }
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
            self.send_read(seq, events, commit_time, state).await;
        }
    }

    /// The opening a transaction and a part share: the rows an earlier session delivered
    /// ([`Self::drop_delivered`]) or saw refused ([`Self::drop_refused`]) are dropped.
    /// False when the database failed under it: the session reads no more.
    async fn prepare_events<T: ChangeStream>(
        &mut self,
        events: &mut Vec<OutboxEvent>,
        stream: &mut T,
        state: &mut RunState<'a>,
    ) -> bool {
        if self.uses_store_before_sending(events) {
            // The store has one connection, which the write-back under
            // way holds: end that first (it is polled only here).
            self.settle(&mut state.writing, stream, &mut state.stopping_at)
                .await;
            if self.write_error.is_some() {
                // The database failed under that write-back: read no more.
                return false;
            }
        }
        if let Err(e) = self.drop_delivered(events).await {
            self.stop_on_store_error(e.into(), &mut state.stopping_at);
            return false;
        }
        self.drop_refused(events);
        true
    }

    /// Sends the events read into slot `seq`, after [`Self::before_sending`].
    async fn send_read(
        &mut self,
        seq: u64,
        events: Vec<OutboxEvent>,
        commit_time: Option<SystemTime>,
        state: &mut RunState<'a>,
    ) {
        let store_free = state.writing.is_empty();
        let ready = self
            .before_sending(
                commit_time,
                state.deliveries.is_empty(),
                &mut state.last_progress,
                store_free,
            )
            .await;
        if let Err(e) = ready {
            self.stop_on_store_error(e.into(), &mut state.stopping_at);
            return;
        }
        self.send_events(seq, events, &mut state.deliveries).await;
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
        let delivered = (self.ask(
            "which rows are delivered",
            self.store.delivered_among(&candidates),
        ))
        .await?;
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

    /// A transaction's part is of one written back before a restart when it begins
    /// before the checkpoint read at session start (see [`TransactionPart`]).
    fn part_already_written(&self, begins: &Position) -> bool {
        self.written_through.as_ref().is_some_and(|w| begins < w)
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
}
