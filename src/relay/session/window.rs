//! The in-flight window: events handed to the sink (or parked behind their key, or
//! rejected), the bounds on what is in flight, the outcomes as they come back, and what
//! the session does when none come (the stall warning, a stuck producer's rebuild). Under
//! exactly-once the window is the open Kafka transaction, committed when it is due and
//! whole.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use outboxd_connector::{
    parked_behind_key, ChangeStream, OutboxEvent, OutboxStore, ParkedEvent, Position, RowId,
};
use tracing::Instrument;

use super::super::outcome::Outcome;
use super::{display_position, RunState, Session};
use crate::observability::trace_context;
use crate::relay::PipelineError;
use crate::sink::{FailureKind, Sink, SinkResult};

/// Outcomes taken per turn of the session loop once one is ready.
const READY_OUTCOMES_PER_TURN: usize = 256;

/// The result of one record, tagged with where it belongs.
pub(super) struct Completed {
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

/// Records handed to the sink whose outcome is not yet known.
pub(super) type Deliveries = FuturesUnordered<BoxFuture<'static, Completed>>;

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

impl<'a, O: OutboxStore, S: Sink> Session<'a, O, S> {
    /// Exactly-once: the session ends without committing its window.
    pub(super) async fn abort_uncommitted(&self) {
        if self.exactly_once {
            self.sink.abort().await;
        }
    }

    /// Exactly-once: the open Kafka transaction may be committed (nothing failed, no
    /// source transaction half read, something to commit).
    pub(super) fn may_commit(&self) -> bool {
        self.window_opened.is_some()
            && self.open_transaction.is_none()
            && self.halt.is_none()
            && self.write_error.is_none()
    }

    /// Exactly-once: the open Kafka transaction has lasted its interval, or no more can
    /// be read into it.
    pub(super) fn window_due(&self) -> bool {
        self.window_opened
            .is_some_and(|t| t.elapsed() >= self.settings.delivery.transaction_interval)
            || self.window_full()
    }

    /// Whether reading may go on. Exactly-once, inside a source transaction: as long as
    /// that transaction alone is within the bounds (the window may hold up to twice them
    /// then), since its Kafka transaction cannot be committed before its end.
    pub(super) fn within_bounds(&self) -> bool {
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

    pub(super) fn window_closes_at(&self, never: Instant) -> Instant {
        self.window_opened
            .map_or(never, |t| t + self.settings.delivery.transaction_interval)
    }

    pub(super) fn push_slot(&mut self, position: Position, events: usize) -> u64 {
        self.window_opened.get_or_insert_with(Instant::now);
        let seq = self.frontier.push(position, events);
        self.add_in_flight(events);
        seq
    }

    pub(super) fn add_in_flight(&mut self, events: usize) {
        self.in_flight += events;
        self.stats
            .in_flight
            .store(self.in_flight as u64, Ordering::Relaxed);
    }

    pub(super) async fn send_events(
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
                    // A canary arrives once the transaction holding it commits.
                    if self.stats.canary.expects(&done.message_id) {
                        self.uncommitted.add_canary(done.message_id.clone());
                    }
                    self.uncommitted.add(done.topic, done.commit_time);
                } else {
                    self.stats.canary.delivered(&done.message_id);
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
                    FailureKind::Rejected | FailureKind::Refused => PipelineError::Unpublishable {
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
            Outcome::Failed {
                failure,
                kind: FailureKind::Refused,
            } => {
                self.stats.metrics.failed(&done.topic);
                tracing::warn!(
                    id = done.row.id,
                    message_id = %done.message_id,
                    topic = %done.topic,
                    error = %failure.error,
                    "the destination refused the record; the row becomes MANUAL_REQUIRED \
                     (fix the cause, then `outboxd retry`)"
                );
                if self.strict() {
                    self.blocked.insert(done.biz_key);
                }
                self.rejected.push(ParkedEvent {
                    id: failure.id,
                    table: failure.table,
                    reason: failure.error,
                });
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

    /// Records have waited `stuck_after` with no outcome. A fresh client's look at the
    /// destination tells an outage (no answer, a leaderless or under-replicated
    /// partition: keep waiting, strict ordering) from a stuck producer: healthy at two
    /// looks in a row, `stuck_after` apart, with still no acknowledgement (the first look
    /// gives a producer coming back from its reconnect backoff time to notice). Then the
    /// producer is rebuilt, its deliveries fail Fatal (rows INIT, no attempt counted), and
    /// the session halts at once (nothing more is read or sent through the new producer
    /// while the old records are undecided), so the next session reads them again and
    /// sends them in order.
    async fn rebuild_if_stuck(&mut self, waiting: usize, now: tokio::time::Instant) {
        let waited = now.duration_since(self.waiting_since);
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
        // From the look's start, not its end (see `on_stall`).
        self.waiting_since = now;
    }

    /// An outcome came back: it, and every other one already in, goes to the batch, which
    /// is written back once full (at least once).
    pub(super) async fn on_outcome<T: ChangeStream>(
        &mut self,
        done: Completed,
        stream: &mut T,
        state: &mut RunState<'a>,
    ) {
        state.last_progress = tokio::time::Instant::now();
        self.waiting_since = state.last_progress;
        self.destination_seen_healthy = false;
        self.complete(done);
        // Every other outcome already in: one turn of the loop for all of
        // them, not one each (bounded, so reading is not starved).
        for _ in 0..READY_OUTCOMES_PER_TURN {
            match state.deliveries.next().now_or_never() {
                Some(Some(done)) => self.complete(done),
                _ => break,
            }
            if self.batch_seqs.len() >= self.settings.delivery.writeback_batch {
                break;
            }
        }
        let batch_full = self.batch_seqs.len() >= self.settings.delivery.writeback_batch;
        if batch_full && !self.exactly_once {
            self.flush_or_drain(stream, &mut state.writing, &mut state.stopping_at)
                .await;
        }
    }

    /// Records wait with no outcome: past `stall_warning` the session says so, past
    /// `stuck_after` it asks whether the producer is stuck ([`Self::rebuild_if_stuck`]).
    pub(super) async fn on_stall(&mut self, state: &mut RunState<'a>) {
        // One instant for this tick: the next tick is `stall_warning` after it, and so is
        // the next look's due time, however long this look takes (a look that moved
        // `waiting_since` to its own end missed every other tick).
        let now = tokio::time::Instant::now();
        // The timer may go off early (see `Session::run`): then it is only moved on.
        if now.duration_since(state.last_progress) >= self.settings.stall_warning {
            tracing::warn!(
                waiting = state.deliveries.len(),
                for_at_least = ?self.settings.stall_warning,
                strict_order = self.strict(),
                "records wait for {} with no acknowledgement; under strict \
                 ordering they are kept and sent in order once it answers \
                 (their rows stay INIT and the log position is held)",
                self.sink.waits_for()
            );
            state.last_progress = now;
        }
        if now.duration_since(self.waiting_since) >= self.settings.stuck_after {
            self.rebuild_if_stuck(state.deliveries.len(), now).await;
        }
    }
}
