//! The inbox half of the contract: messages received from Kafka or HTTP are stored
//! before they are acknowledged, deduplicated, and driven PENDING → PROCESSING → DONE /
//! FAILED / MANUAL_REQUIRED by the core's workers.
//!
//! The store is the only place that knows a message was seen: ingress acknowledges (a
//! Kafka offset commit, an HTTP 200) only after [`InboxStore::insert`] returned, and
//! deduplication is the table's two unique keys, so a redelivery finds its row.
//!
//! The operator's actions on the inbox (`--inbox`) are the outbox's, through the same
//! [`TableAdmin`](crate::TableAdmin) with [`TableKind::Inbox`](crate::TableKind): its
//! janitor's rule carries the deduplication window.

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::{ClaimToken, ConnectorError, ReapPolicy, ReapReport, RetrySchedule};

/// One message as received, ready to be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxMessage {
    /// Where it came from: the Kafka topic, or the `{source}` of `POST /v1/inbox/{source}`.
    pub source: String,
    /// The sender's id of the message; unique per source.
    pub message_id: String,
    /// What kind of message it is: selects the handler.
    pub message_type: String,
    /// The business key: messages of one key are handled one at a time, in arrival order.
    pub biz_key: String,
    /// The body as received. For a JSON payload column it must be JSON text unless
    /// `rejected` is set.
    pub payload: Vec<u8>,
    /// The other headers, stored as a JSON object (a repeated name keeps its last value).
    pub headers: Vec<(String, String)>,
    /// Set when the message cannot be handled as received (no message id, a body that is
    /// not JSON): stored MANUAL_REQUIRED with this reason in `last_error`, never dropped.
    pub rejected: Option<String>,
}

/// What [`InboxStore::insert`] did with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingested {
    /// A new row with this id.
    Stored(i64),
    /// A row with the same `(source, message_id)` or `(message_type, biz_key)` exists:
    /// nothing was written.
    Duplicate,
}

/// A row claimed by a worker: now PROCESSING with `claimed_at` and a fresh token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedMessage {
    /// Inbox row id (arrival order).
    pub id: i64,
    /// See [`InboxMessage`].
    pub source: String,
    /// See [`InboxMessage`].
    pub message_id: String,
    /// See [`InboxMessage`].
    pub message_type: String,
    /// See [`InboxMessage`].
    pub biz_key: String,
    /// The stored payload (JSON text for a JSON column).
    pub payload: Vec<u8>,
    /// The stored headers.
    pub headers: Vec<(String, String)>,
    /// Attempts that failed so far.
    pub retry_count: i32,
    /// At this many failed attempts the row becomes MANUAL_REQUIRED.
    pub max_retry_count: i32,
    /// When the row was stored.
    pub created_at: SystemTime,
    /// The token written with the claim.
    pub claim_token: ClaimToken,
}

/// How one claimed message ends, written only while its claim token still matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboxOutcome<'a> {
    /// Handled → DONE with `processed_at = now()`. With a statement, the handler's SQL
    /// runs in the same transaction, so its effect and DONE commit together or not at
    /// all. The statement names the message's fields as `:id`, `:source`,
    /// `:message_id`, `:message_type`, `:biz_key`, `:payload` and `:headers` (text
    /// values; cast them as the statement needs).
    Done {
        /// The SQL handler's statement, if any.
        statement: Option<&'a str>,
    },
    /// A failed attempt → FAILED with `retry_count + 1`, `next_retry_time = now +
    /// retry_delay` and `last_error`, or MANUAL_REQUIRED when `retry_count + 1` reaches
    /// `max_retry_count`.
    Failed {
        /// Stored in `last_error`.
        error: &'a str,
        /// Delay until the row is due again.
        retry_delay: Duration,
    },
    /// Cannot succeed by retrying (a 4xx answer) → MANUAL_REQUIRED with the reason.
    ManualRequired {
        /// Stored in `last_error`.
        reason: &'a str,
    },
    /// The attempt did not happen → back to PENDING, due now, no attempt counted. For an
    /// embedder that gives a claimed message back; outboxd's workers let running handlers
    /// finish on shutdown and leave the rest to the reaper.
    Released {
        /// Stored in `last_error`.
        reason: &'a str,
    },
}

/// What [`InboxStore::complete`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completed {
    /// The outcome is written.
    Written,
    /// The row's claim is no longer this worker's (reaped, re-claimed, or changed by an
    /// operator): nothing was written, the handler's statement included.
    ClaimLost,
    /// The handler's statement failed with this error; nothing was written. The caller
    /// records it as a failed attempt.
    StatementFailed(String),
}

/// One of the messages `outboxd verify --inbox` sent, as the inbox table shows it
/// ([`InboxStore::own_messages`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnMessageState {
    /// Its message id.
    pub message_id: String,
    /// `status`.
    pub status: String,
    /// `retry_count`.
    pub retry_count: i32,
}

/// The SQL side of the inbox, on the database of its table.
pub trait InboxStore: Send + Sync {
    /// Whether the payload column holds JSON (`jsonb`, `JSON`) rather than bytes. Ingress
    /// refuses (HTTP) or rejects (Kafka) a body that is not JSON for such a column.
    fn payload_is_json(&self) -> bool;

    /// Stores `messages` in **one** transaction, ignoring each one whose `(source,
    /// message_id)` or `(message_type, biz_key)` is already stored (also when the earlier
    /// one is in the same batch). Durable when it returns `Ok`; one [`Ingested`] per
    /// message, in order.
    fn insert(
        &self,
        messages: &[InboxMessage],
    ) -> impl Future<Output = Result<Vec<Ingested>, ConnectorError>> + Send;

    /// Claims up to `limit` due rows (PENDING, or FAILED with `next_retry_time` passed)
    /// in one short transaction with `FOR UPDATE SKIP LOCKED`, oldest first. A row is
    /// claimed only when no row of the same `biz_key` with a lower id is still open
    /// (PENDING, PROCESSING, FAILED or MANUAL_REQUIRED): a key's messages are handled one
    /// at a time and in arrival order, while other keys flow.
    fn claim(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ClaimedMessage>, ConnectorError>> + Send;

    /// Writes `outcome` for `message` in one transaction, only while its claim token
    /// still matches.
    fn complete(
        &self,
        message: &ClaimedMessage,
        outcome: InboxOutcome<'_>,
    ) -> impl Future<Output = Result<Completed, ConnectorError>> + Send;

    /// Returns PROCESSING rows claimed longer ago than `policy.claim_timeout` to FAILED
    /// (or MANUAL_REQUIRED at `max_retry_count`), as the outbox's reaper does.
    fn reap(
        &self,
        policy: ReapPolicy,
    ) -> impl Future<Output = Result<ReapReport, ConnectorError>> + Send;

    /// When the workers next have work: the earliest due time of a PENDING or FAILED row
    /// (`next_due`) and the oldest claim (`oldest_claim`).
    fn schedule(&self) -> impl Future<Output = Result<RetrySchedule, ConnectorError>> + Send;

    /// The rows of `source` whose message ids are among `message_ids`, as they are now (a
    /// message not stored is left out): `outboxd verify --inbox` reads back what it sent.
    /// The statement names every id, so callers pass them a few hundred at a time.
    fn own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> impl Future<Output = Result<Vec<OwnMessageState>, ConnectorError>> + Send;

    /// Deletes the rows of `source` whose message ids are among `message_ids`, whatever
    /// their status. Returns how many it deleted.
    fn delete_own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;

    /// Creates table `name` (a plain identifier) for the effects of `outboxd verify
    /// --inbox`'s SQL handler: `(n` in insertion order`, message_id, biz_key)`; the
    /// config's role needs the right to create a table. Returns the handler's statement,
    /// which inserts `:message_id` and `:biz_key` into it.
    fn create_scratch_table(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<String, ConnectorError>> + Send;

    /// The `(message_id, biz_key)` rows of scratch table `name`, in insertion order.
    fn scratch_rows(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Vec<(String, String)>, ConnectorError>> + Send;

    /// Drops scratch table `name` if it exists.
    fn drop_scratch_table(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), ConnectorError>> + Send;
}
