use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::{ConnectorError, OutboxEvent, Position};

/// Rows of one status and message type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusCount {
    /// INIT, PROCESSING, SUCCESS, FAILED or MANUAL_REQUIRED.
    pub status: String,
    /// The rows' message type.
    pub message_type: String,
    /// How many.
    pub rows: i64,
}

/// What `outboxd status` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusSummary {
    /// Rows by status and message type.
    pub counts: Vec<StatusCount>,
    /// `created_at` of the oldest INIT, FAILED or PROCESSING row.
    pub oldest_unsent: Option<SystemTime>,
    /// The checkpoint row: position and when it was written.
    pub checkpoint: Option<(Position, SystemTime)>,
    /// How far the source's log is ahead of what outboxd confirmed, in bytes (slot lag on
    /// PostgreSQL, binlog bytes on MySQL), when the server can tell.
    pub source_lag_bytes: Option<u64>,
}

/// Which rows `outboxd retry` makes due again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetrySelector {
    /// One row.
    Id(i64),
    /// Every row of a status (FAILED or MANUAL_REQUIRED), optionally of one type.
    Status {
        /// FAILED or MANUAL_REQUIRED.
        status: String,
        /// Only rows of this message type.
        message_type: Option<String>,
    },
}

impl RetrySelector {
    /// Only FAILED and MANUAL_REQUIRED rows can be made due again; INIT and PROCESSING
    /// rows are on their way already.
    pub fn check(&self) -> Result<(), ConnectorError> {
        match self {
            RetrySelector::Status { status, .. }
                if status != "FAILED" && status != "MANUAL_REQUIRED" =>
            {
                Err(ConnectorError::definite(format!(
                    "cannot retry rows in status `{status}`: only FAILED and MANUAL_REQUIRED \
                     rows are retried (INIT and PROCESSING rows are on their way already)"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// What `outboxd janitor` does with old SUCCESS rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JanitorAction {
    /// DELETE them.
    Delete,
    /// Move them into this table (same columns), then delete them.
    Archive(String),
}

/// Operator actions on the outbox, each one short transaction, each logged in
/// `last_error` where it changes a row's fate.
pub trait OutboxAdmin: Send + Sync {
    /// Counts, oldest unsent row, checkpoint and source lag.
    fn status_summary(&self) -> impl Future<Output = Result<StatusSummary, ConnectorError>> + Send;

    /// Makes the selected FAILED / MANUAL_REQUIRED rows due now (`status = FAILED`,
    /// `next_retry_time = now()`, `retry_count = 0`, claim cleared). Returns the rows
    /// changed.
    fn retry_rows(
        &self,
        selector: &RetrySelector,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;

    /// Takes one INIT or FAILED row out of automatic retries: MANUAL_REQUIRED with
    /// `last_error = "parked by operator: <reason>"`. Strict ordering keeps its key's later
    /// events waiting. Returns whether the row was changed.
    fn park_row(
        &self,
        id: i64,
        reason: &str,
    ) -> impl Future<Output = Result<bool, ConnectorError>> + Send;

    /// Skips one unsent row for good: SUCCESS without a Kafka position, with
    /// `last_error = "resolved by operator without sending: <reason>"`. Releases its key.
    /// Returns whether the row was changed.
    fn resolve_row(
        &self,
        id: i64,
        reason: &str,
    ) -> impl Future<Output = Result<bool, ConnectorError>> + Send;

    /// Deletes (or archives) up to `batch` SUCCESS rows whose `sent_at` is older than
    /// `retention`, in one short transaction. Returns the rows removed; call again until 0.
    fn janitor_batch(
        &self,
        retention: Duration,
        action: &JanitorAction,
        batch: usize,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;

    /// INIT rows of the outbox table of index `table` (see
    /// [`crate::OutboxLayout::outbox_tables`]) with `id > after_id`, in id order, at most
    /// `limit` (for `outboxd recover`, which scans each table in turn).
    fn scan_init(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxEvent>, ConnectorError>> + Send;
}
