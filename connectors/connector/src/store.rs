use std::future::Future;
use std::time::Duration;

use std::collections::HashSet;

use crate::{
    ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, OutboxEvent, ParkedEvent,
    Position, ReapPolicy, ReapReport, RetrySchedule,
};

/// One outbox row: its table (the index in [`crate::OutboxLayout::outbox_tables`], as
/// [`crate::OutboxEvent::table`]) and its id there. Ids are unique per table only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowId {
    /// Index of the row's outbox table.
    pub table: u16,
    /// The row's id in that table.
    pub id: i64,
}

/// A row whose record Kafka acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// Outbox row id.
    pub id: i64,
    /// The row's outbox table ([`crate::OutboxEvent::table`]).
    pub table: u16,
    /// Partition the record landed in.
    pub partition: i32,
    /// Offset of the record in that partition.
    pub offset: i64,
}

/// A row whose record could not be delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryFailure {
    /// Outbox row id.
    pub id: i64,
    /// The row's outbox table ([`crate::OutboxEvent::table`]).
    pub table: u16,
    /// The broker's or client's error, stored in `last_error`.
    pub error: String,
    /// Delay until the row is due for a retry (`next_retry_time = now + retry_delay`).
    pub retry_delay: Duration,
}

/// One durable write-back: statuses and, optionally, the checkpoint.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteBack<'a> {
    /// Rows to mark SUCCESS with `sent_at = now()` and where they landed.
    pub delivered: &'a [Delivered],
    /// Rows to mark FAILED (or MANUAL_REQUIRED when `retry_count + 1` reaches
    /// `max_retry_count`), with `last_error` and `next_retry_time`; only rows still INIT
    /// (or SUCCESS, see `replace_positions`).
    pub failed: &'a [DeliveryFailure],
    /// Rows parked by strict ordering → FAILED, due now, `retry_count` unchanged,
    /// `last_error` = the reason; only rows still INIT (or SUCCESS, see
    /// `replace_positions`).
    pub parked: &'a [ParkedEvent],
    /// Rows that cannot become events ([`crate::OutboxEvent::rejected`]) →
    /// MANUAL_REQUIRED, `next_retry_time` now (so they hold their key back),
    /// `retry_count` unchanged, `last_error` = the reason; only rows still INIT (or
    /// SUCCESS, see `replace_positions`).
    pub rejected: &'a [ParkedEvent],
    /// The position up to which every event is now delivered or failed and written back.
    pub checkpoint: Option<&'a Position>,
    /// Exactly-once: the rows' SUCCESS may be an aborted window's. `delivered` rows
    /// already SUCCESS take the new partition and offset too: such a row is one sent
    /// again after a crash between its write-back and the commit of its Kafka
    /// transaction, which aborted, so its old position names a record no
    /// `read_committed` consumer sees. For the same reason `failed`, `parked` and
    /// `rejected` rows already SUCCESS take their new status (their `sent_at`,
    /// `kafka_partition` and `kafka_offset` cleared): a row read again that strict
    /// ordering now holds back would otherwise stay SUCCESS with no committed record.
    pub replace_positions: bool,
}

/// A row outboxd writes into the outbox itself, as an application would (the canary of
/// `[canary]`, the synthetic events of `outboxd verify`): into the first outbox table, the
/// other columns taking their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOutboxRow {
    /// Unique: the row is found (and deleted) by it.
    pub message_id: String,
    /// The message type.
    pub message_type: String,
    /// The business key; unique per message type on outboxd's table.
    pub biz_key: String,
    /// For the table's topic column, when it has one; `None` leaves it NULL.
    pub topic: Option<String>,
    /// A JSON document, written as text (a JSON or binary payload column takes it).
    pub payload: String,
    /// A JSON object for the table's headers column (extra record headers), when it has
    /// one; `None` leaves it NULL.
    pub headers: Option<String>,
}

/// How the transaction of [`OutboxStore::insert_rows`] ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransactionEnd {
    /// Committed: the log carries the rows and the relay delivers them.
    Commit,
    /// Rolled back: nothing may reach the sink (`outboxd verify` checks that none does).
    Rollback,
}

/// Which of its own rows [`OutboxStore::delete_own_rows`] deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnRowsToDelete {
    /// Only those that show SUCCESS (a canary still on its way is left alone).
    Delivered,
    /// Every one, whatever its status (`outboxd verify` cleaning up after itself).
    All,
}

/// One of the rows outboxd wrote itself, as the table shows it now
/// ([`OutboxStore::own_rows`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnRowState {
    /// Its message id.
    pub message_id: String,
    /// `status`.
    pub status: String,
    /// `retry_count`.
    pub retry_count: i32,
    /// `kafka_partition` and `kafka_offset`, when both are set.
    pub position: Option<(i32, i64)>,
    /// `last_error`.
    pub last_error: Option<String>,
}

/// The SQL side of a connector: the outbox row is the source of truth.
pub trait OutboxStore: Send + Sync {
    /// Applies `batch` in **one** database transaction: the status updates and the
    /// checkpoint row commit together or not at all. Durable when it returns `Ok`.
    ///
    /// Idempotent, so a batch replayed after a crash is harmless: SUCCESS is written only
    /// to rows in INIT, FAILED or MANUAL_REQUIRED (an operator may park a row that was
    /// already on its way: the record is in Kafka, so SUCCESS is the truth), FAILED only
    /// to rows in INIT (and SUCCESS under [`WriteBack::replace_positions`]), and the
    /// checkpoint never moves backward. Each statement covers the
    /// whole batch (one round trip per kind of update, never one per row).
    fn write_back(
        &self,
        batch: WriteBack<'_>,
    ) -> impl Future<Output = Result<(), ConnectorError>> + Send;

    /// The last checkpoint written by [`OutboxStore::write_back`] for this pipeline.
    fn load_checkpoint(
        &self,
    ) -> impl Future<Output = Result<Option<Position>, ConnectorError>> + Send;

    /// Claims rows in one short transaction (`… ORDER BY id LIMIT n FOR UPDATE SKIP
    /// LOCKED`, then PROCESSING with `claimed_at = now()` and a fresh token). Rows locked
    /// by another worker are skipped, so two workers never claim the same row at once.
    fn claim(
        &self,
        request: ClaimRequest,
    ) -> impl Future<Output = Result<Vec<ClaimedEvent>, ConnectorError>> + Send;

    /// Writes back claimed rows in one transaction, each only while its claim token still
    /// matches. Returns how many rows were updated (the others lost their claim).
    fn complete_claimed(
        &self,
        batch: ClaimedWriteBack<'_>,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;

    /// Returns PROCESSING rows claimed longer ago than `policy.claim_timeout` to FAILED
    /// (retry_count + 1, next_retry_time = now + retry_delay, claim cleared, last_error
    /// says why) or to MANUAL_REQUIRED at max_retry_count.
    fn reap(
        &self,
        policy: ReapPolicy,
    ) -> impl Future<Output = Result<ReapReport, ConnectorError>> + Send;

    /// When the retry worker and the reaper next have work, read from the rows (served by
    /// the `next_retry_time` index, cheap however large the table).
    fn retry_schedule(&self) -> impl Future<Output = Result<RetrySchedule, ConnectorError>> + Send;

    /// Of `keys` (all keys when `None`), those with a row in FAILED, PROCESSING or
    /// MANUAL_REQUIRED: the keys strict ordering holds back.
    fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> impl Future<Output = Result<HashSet<String>, ConnectorError>> + Send;

    /// The highest id of a SUCCESS row (`None` when there is none), read when a session
    /// opens: a transaction read again from the log whose rows are all above it cannot
    /// hold a row an earlier session delivered, so only those at or below it are looked
    /// up ([`OutboxStore::delivered_among`]). Served by the primary key, newest first.
    /// With several outbox tables, the highest over all of them (a bound for each).
    fn highest_delivered_id(
        &self,
    ) -> impl Future<Output = Result<Option<i64>, ConnectorError>> + Send;

    /// Of `ids`, the rows the table shows SUCCESS: a transaction read again after a
    /// reconnect, restart or takeover is not sent again where it was delivered already.
    fn delivered_among(
        &self,
        rows: &[RowId],
    ) -> impl Future<Output = Result<HashSet<RowId>, ConnectorError>> + Send;

    /// INIT rows of the outbox table of index `table` (see
    /// [`crate::OutboxLayout::outbox_tables`]) with `id > after_id`, in id order, at most
    /// `limit`, as events: `outboxd recover` publishes them table by table after the log
    /// position was lost. Here rather than with the operator's actions
    /// ([`crate::TableAdmin`]): it reads the outbox's rows to publish them, as
    /// [`OutboxStore::claim`] does, changes no status, and has no inbox counterpart.
    fn scan_init(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxEvent>, ConnectorError>> + Send;

    /// Writes `rows` into the first outbox table in one transaction of their own, which
    /// ends as `end` says (committed when it returns `Ok` with [`TransactionEnd::Commit`]):
    /// the relay then reads them as any other rows. One round trip.
    fn insert_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> impl Future<Output = Result<(), ConnectorError>> + Send;

    /// The rows of the first outbox table whose message ids are among `message_ids`, as
    /// they are now (a row not found is left out). For rows outboxd wrote itself: the
    /// statement names every id, so callers pass them a few hundred at a time.
    fn own_rows(
        &self,
        message_ids: &[String],
    ) -> impl Future<Output = Result<Vec<OwnRowState>, ConnectorError>> + Send;

    /// Deletes the rows of the first outbox table whose message ids are among
    /// `message_ids`, those `which` names. Returns how many it deleted.
    fn delete_own_rows(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;
}
