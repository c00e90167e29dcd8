//! Where events go: the [`Sink`] boundary.
//!
//! The relay and the claim worker hand each outbox event to a sink and get back, later, a
//! [`Receipt`] or a classified [`SinkFailure`]; they never name the destination. Two
//! production sinks: Kafka ([`kafka::KafkaSink`], `[kafka]`) and HTTP endpoints
//! ([`http::HttpSink`], `[http]`); [`AnySink`] is whichever the config chooses.
//! `memory.rs` is an in-memory twin that unit tests of the core drive instead.
//!
//! Adding a sink: a module beside `kafka/` and `http/` implementing [`Sink`], keeping the
//! guarantee stated on the trait, a variant of [`AnySink`], and its branch where
//! `cli/commands.rs` opens the sink.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use outboxd_connector::{CheckLine, OutboxEvent, Position};

use crate::observability::endpoint_metrics::EndpointMetrics;

mod any;
#[cfg(test)]
mod conformance;
pub mod http;
pub mod kafka;
#[cfg(test)]
pub(crate) mod memory;

pub use any::AnySink;

/// Where a delivered record landed: Kafka's partition and offset, or the sink's
/// equivalent (written to the row's `kafka_partition` / `kafka_offset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Partition (or shard, stream) of the record.
    pub partition: i32,
    /// Offset of the record within it.
    pub offset: i64,
}

/// What a failed delivery means for the row and for the sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The record may go later (broker unavailable, timeout): the row becomes FAILED and
    /// is retried with backoff.
    Retryable,
    /// This record can never go as it is (too large, invalid): the row becomes FAILED
    /// with the reason, so an operator sees it; retries reach MANUAL_REQUIRED.
    Rejected,
    /// The destination looked at this record and answered that it is wrong and will stay
    /// wrong (the HTTP sink: a 4xx other than 408/425/429, a redirect): the row becomes
    /// MANUAL_REQUIRED at once with the answer (under strict ordering its key waits), for
    /// an operator to fix the cause and `retry` it. Retrying it by itself would only
    /// repeat the answer.
    Refused,
    /// The sink itself is unusable (for Kafka: a fatal idempotent-producer error). The
    /// row is not to blame: it is sent again, uncounted, once [`Sink::recover`] has
    /// rebuilt the sink (the relay reads it again from the log; the claim worker
    /// releases its claim).
    Fatal,
}

/// A delivery that did not end in a [`Receipt`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkFailure {
    /// What the failure means.
    pub kind: FailureKind,
    /// The destination's or client's error text, stored in `last_error` as is.
    pub error: String,
    /// How long the destination asked to be left alone (an HTTP `Retry-After`): a
    /// retryable row is not due before it (capped at `retry.cap`), whatever the backoff.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for SinkFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

/// Exactly-once: what a committed transaction records besides its records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedPosition {
    /// The log position the transaction reached.
    pub position: Position,
    /// The checkpoint row's position when it was committed. A session accepts the
    /// record only when the checkpoint row still shows this one or `position`: anything
    /// else means the row was reset since (another server, a restore, `recover`).
    pub checkpoint: Option<Position>,
}

/// The outcome of one delivery.
pub type SinkResult = Result<Receipt, SinkFailure>;

/// Waits for `delivery` until `deadline`, for callers that hold a claim (the claim worker,
/// poll mode, `recover`): they must write their rows back before the claim expires, while
/// a sink under strict ordering may wait for the destination without limit. A record
/// still waiting at the deadline is a retryable failure; the sink may deliver it later
/// all the same, which makes a duplicate, never a reorder (the sink keeps a key's records
/// in send order, and the row's retry is sent after it).
pub async fn acknowledged_by<D: Future<Output = SinkResult>>(
    deadline: tokio::time::Instant,
    delivery: D,
) -> SinkResult {
    match tokio::time::timeout_at(deadline, delivery).await {
        Ok(result) => result,
        Err(_) => Err(SinkFailure {
            kind: FailureKind::Retryable,
            error: "no acknowledgement from the destination within kafka.message_timeout \
                    (http.timeout); retried later (the record may still arrive: a duplicate \
                    then)"
                .to_owned(),
            retry_after: None,
        }),
    }
}

/// A destination for outbox events.
///
/// # The guarantee a sink must keep
/// - An `Ok` [`Receipt`] means the record is **durable in the destination** (for Kafka:
///   acknowledged by every in-sync replica). The row is then written SUCCESS and the log
///   position may be confirmed past it: a receipt given too early loses the event.
/// - Records of one key that are [`send`](Sink::send) in order reach the destination in
///   that order, whatever is retried internally (for Kafka: the idempotent producer and
///   the key → partition mapping). The core sends a key's next event only after the
///   previous one was handed over, and stops sending a key after a failure (strict
///   ordering), so together no event overtakes an earlier one of its key.
/// - A failure is classified ([`FailureKind`]); its text is what the row's `last_error`
///   shows.
///
/// Sending is in two steps so many records can be in flight at once: `send` hands the
/// record over (waiting only while the sink's local queue is full) and returns
/// [`Sink::Delivery`], which resolves when the destination has decided.
pub trait Sink: Send + Sync {
    /// Resolves to the outcome of one record. Owned (`'static`) so the relay can keep
    /// thousands in flight without borrowing the sink.
    type Delivery: Future<Output = SinkResult> + Send + 'static;

    /// Hands one record to the sink. Errors that concern only this record come back
    /// through the returned delivery, immediately.
    fn send(&self, event: &OutboxEvent) -> impl Future<Output = Self::Delivery> + Send;

    /// What the log says records wait for when they get no outcome (`Kafka`, `the HTTP
    /// endpoints`).
    fn waits_for(&self) -> &'static str {
        "Kafka"
    }

    /// The destination of an event (the Kafka topic), used as the `topic` label of the
    /// outcome metrics.
    fn destination(&self, event: &OutboxEvent) -> String;

    /// Why this sink will never take `event` as it is (for Kafka: a topic outside
    /// `kafka.allowed_topics`), or `None`. The caller then does not send it and writes
    /// the row MANUAL_REQUIRED with the reason, as for a row that cannot become an event.
    fn refusal(&self, event: &OutboxEvent) -> Option<String> {
        let _ = event;
        None
    }

    /// Waits up to `deadline` for records handed over to be delivered (at shutdown).
    fn flush(&self, deadline: Duration) -> impl Future<Output = ()> + Send;

    /// `outboxd check` and `/readyz`: can the destination be reached.
    fn check(&self, timeout: Duration) -> impl Future<Output = CheckLine> + Send;

    /// Records handed over and not yet decided (the `outboxd_producer_queue` gauge).
    fn queue_depth(&self) -> i64;

    /// Exactly-once (`delivery.exactly_once`): the sink keeps what is sent in an open
    /// transaction that only [`Sink::commit`] makes visible. Its receipts then mean
    /// "written, not yet committed", and the relay commits only at a source transaction
    /// boundary with every receipt in (see `sink/kafka/transaction.rs`). A failed record
    /// leaves the transaction nothing but an abort: [`FailureKind::Fatal`] when the sink
    /// is to blame (the relay sends the whole transaction again), another kind only when
    /// the destination refused that record itself (the relay makes its row FAILED outside
    /// the transactions and sends the rest again).
    fn transactional(&self) -> bool {
        false
    }

    /// Exactly-once, at the start of a session that holds the log: takes over the
    /// transactions of this pipeline (fencing an older instance, aborting what it left
    /// open) and returns the position the last committed transaction reached; everything
    /// past it is to be sent again. `None` when nothing was ever committed, or when the
    /// sink is not [`transactional`](Sink::transactional).
    fn committed_position(
        &self,
    ) -> impl Future<Output = Result<Option<CommittedPosition>, SinkFailure>> + Send {
        async { Ok(None) }
    }

    /// Exactly-once: commits every record sent since the last commit together with
    /// `committed`, atomically. A failure leaves nothing of it visible.
    fn commit(
        &self,
        committed: &CommittedPosition,
    ) -> impl Future<Output = Result<(), SinkFailure>> + Send {
        let _ = committed;
        async { Ok(()) }
    }

    /// Exactly-once: aborts the open transaction, if any (a session ends without
    /// committing), so `read_committed` readers of its partitions do not wait for the
    /// broker's transaction timeout.
    fn abort(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Whether a fresh client finds the destination healthy within `timeout` (for Kafka:
    /// metadata answers, and every partition of every topic but Kafka's own has a leader
    /// and all its replicas in sync). The relay asks when records have waited long past
    /// their timeout: twice healthy with still no acknowledgement, the producer is stuck
    /// and is [rebuilt](Sink::rebuild). Any doubt (no answer, a leaderless or
    /// under-replicated partition: an outage the producer waits out by itself) is
    /// `Ok(false)`.
    fn destination_healthy(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, String>> + Send;

    /// Replaces a stuck producer: the old one's queued and in-flight records are purged
    /// at once, whoever still holds it, so their deliveries fail [`FailureKind::Fatal`]
    /// (their rows stay INIT and the relay reads and sends them again, in order).
    fn rebuild(&self) -> impl Future<Output = Result<(), String>> + Send;

    /// After a [`FailureKind::Fatal`] failure, makes the sink usable again (for Kafka: a
    /// fresh producer replaces the one librdkafka declared fatal). `Ok(true)` when it
    /// replaced something, `Ok(false)` when the sink was healthy; `Err` when it cannot
    /// be rebuilt. Records the old client did not acknowledge are the caller's to send
    /// again: a fatal failure says nothing about the row, so it costs the row no attempt.
    fn recover(&self) -> impl Future<Output = Result<bool, String>> + Send;

    /// The series the sink keeps per destination, for `/metrics` (the HTTP sink: each
    /// endpoint's requests, their duration, those in flight, and whether its circuit
    /// breaker holds its rows). None by default.
    fn endpoint_metrics(&self) -> Option<EndpointMetrics> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_delivery_still_waiting_at_the_deadline_is_a_retryable_failure() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        let waiting = std::future::pending::<SinkResult>();
        let failure = acknowledged_by(deadline, waiting).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Retryable);
        assert!(failure.error.contains("kafka.message_timeout"));

        let receipt = Receipt {
            partition: 1,
            offset: 7,
        };
        let decided = async move { Ok(receipt) };
        assert_eq!(acknowledged_by(deadline, decided).await, Ok(receipt));
    }
}
