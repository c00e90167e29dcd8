//! The operator's actions on a table of rows with a status — the outbox or the inbox —
//! as one trait, [`TableAdmin`], which every engine's outbox store and inbox store
//! implement (`outboxd status|retry|park|resolve|janitor`, with `--inbox` on the inbox).
//!
//! Both tables run the same state machine: a new row (INIT, PENDING) is taken by a worker
//! (PROCESSING) and ends finished (SUCCESS, DONE), or FAILED with retries, or
//! MANUAL_REQUIRED for an operator. So the operator's commands are one set over either
//! table, and what truly differs is said in the trait's types, not by a second trait:
//! [`TableKind`] names the statuses a table uses, and [`JanitorRule`] carries the inbox's
//! deduplication window, inside which its janitor removes nothing.
//!
//! `recover`'s scan of INIT rows is not an operator action on a status but the outbox's
//! rows read to be published, as a claim reads them, and the outbox only: it is
//! [`OutboxStore::scan_init`](crate::OutboxStore::scan_init).

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::{ConnectorError, Position};

/// Which table a [`TableAdmin`] acts on, and so the names of its statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// The outbox: INIT → PROCESSING → SUCCESS (sent), FAILED, MANUAL_REQUIRED.
    Outbox,
    /// The inbox: PENDING → PROCESSING → DONE (handled), FAILED, MANUAL_REQUIRED.
    Inbox,
}

impl TableKind {
    /// `outbox` or `inbox`.
    pub const fn name(self) -> &'static str {
        match self {
            TableKind::Outbox => "outbox",
            TableKind::Inbox => "inbox",
        }
    }

    /// Every status, in the order of the state machine: new, PROCESSING, FAILED,
    /// MANUAL_REQUIRED, finished.
    pub const fn statuses(self) -> [&'static str; 5] {
        [
            self.new_status(),
            "PROCESSING",
            "FAILED",
            "MANUAL_REQUIRED",
            self.finished_status(),
        ]
    }

    /// The status of a row no worker has taken yet: INIT, PENDING.
    pub const fn new_status(self) -> &'static str {
        match self {
            TableKind::Outbox => "INIT",
            TableKind::Inbox => "PENDING",
        }
    }

    /// The status of a finished row, the only one the janitor removes: SUCCESS, DONE.
    pub const fn finished_status(self) -> &'static str {
        match self {
            TableKind::Outbox => "SUCCESS",
            TableKind::Inbox => "DONE",
        }
    }
}

/// Rows of one status and message type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusCount {
    /// One of the table's [`TableKind::statuses`].
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
    /// `created_at` of the oldest row not finished and not waiting for an operator: new
    /// (INIT, PENDING), FAILED or PROCESSING.
    pub oldest_unsent: Option<SystemTime>,
    /// The checkpoint row: position and when it was written (the outbox only).
    pub checkpoint: Option<(Position, SystemTime)>,
    /// How far the source's log is ahead of what outboxd confirmed, in bytes (slot lag on
    /// PostgreSQL, binlog bytes on MySQL), when the server can tell (the outbox only).
    pub source_lag_bytes: Option<u64>,
}

/// Which rows the operator console lists: one status, filtered, newest first, one page
/// at a time by keyset (`before_id`), never by `OFFSET`, so a page costs the same on a
/// table of a million rows as on a small one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowQuery {
    /// One of the table's [`TableKind::statuses`] (the console lists FAILED and
    /// MANUAL_REQUIRED).
    pub status: String,
    /// Only rows of this message type.
    pub message_type: Option<String>,
    /// Only rows of this business key.
    pub biz_key: Option<String>,
    /// Only rows whose `last_error` contains this text (case-sensitive on outboxd's
    /// tables). FAILED and MANUAL_REQUIRED only: it scans the status's rows.
    pub error_contains: Option<String>,
    /// Only rows with a lower id: the last id of the page before.
    pub before_id: Option<i64>,
    /// At most this many rows.
    pub limit: usize,
}

impl RowQuery {
    /// Refuses a status the table does not have, and an empty page.
    pub fn check(&self, table: TableKind) -> Result<(), ConnectorError> {
        if !table.statuses().contains(&self.status.as_str()) {
            return Err(ConnectorError::definite(format!(
                "the {} has no status `{}` (its statuses: {})",
                table.name(),
                self.status,
                table.statuses().join(", ")
            )));
        }
        if self.limit == 0 {
            return Err(ConnectorError::definite(
                "a page of rows needs a limit above 0",
            ));
        }
        // Searching the error text scans the status's rows: the few in trouble, never
        // the whole table's finished ones.
        let in_trouble = matches!(self.status.as_str(), "FAILED" | "MANUAL_REQUIRED");
        if self.error_contains.is_some() && !in_trouble {
            return Err(ConnectorError::definite(
                "the error text is searched among FAILED and MANUAL_REQUIRED rows only",
            ));
        }
        Ok(())
    }
}

/// One row as a console list shows it: its state, not its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSummary {
    /// The row's id.
    pub id: i64,
    /// Its message type.
    pub message_type: String,
    /// Its business key.
    pub biz_key: String,
    /// Its status.
    pub status: String,
    /// Attempts made.
    pub retry_count: i64,
    /// Attempts allowed before MANUAL_REQUIRED.
    pub max_retry_count: i64,
    /// When it is due again (FAILED), or since when it waits (MANUAL_REQUIRED).
    pub next_retry_time: Option<SystemTime>,
    /// The last failure, or the operator's note.
    pub last_error: Option<String>,
    /// When it was written, if the table says.
    pub created_at: Option<SystemTime>,
    /// When its state last changed, if the table says.
    pub updated_at: Option<SystemTime>,
}

/// One row in full for the console's detail page: its state and what it carries, the
/// payload cut to a preview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowDetail {
    /// Its state, as in a list.
    pub summary: RowSummary,
    /// Its message id (the outbox's, or the sender's on the inbox).
    pub message_id: String,
    /// Where it came from: the inbox's source (`http:<name>`, `kafka:<topic>`); `None`
    /// on the outbox.
    pub source: Option<String>,
    /// The outbox row's own topic or endpoint, when it names one.
    pub topic: Option<String>,
    /// Its headers as the table stores them (a JSON object), when it has any.
    pub headers: Option<String>,
    /// The payload's first characters as text (bytes as the engine escapes them).
    pub payload_preview: String,
    /// The payload's whole length in bytes, as text.
    pub payload_bytes: i64,
    /// Whether the preview is cut (the payload is longer than the preview asked for).
    pub payload_cut: bool,
    /// When it was sent (outbox) or handled (inbox).
    pub finished_at: Option<SystemTime>,
    /// Where the sink took it: Kafka's partition and offset (the HTTP sink's status and
    /// latency in ms), on an outbox row sent.
    pub sink_position: Option<(i64, i64)>,
}

/// A business key with a row in trouble (FAILED or MANUAL_REQUIRED): under strict
/// ordering nothing later of the key is sent (the outbox) or handled (the inbox) before
/// the row holding it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldKey {
    /// The row that holds the key: its lowest in FAILED, PROCESSING or MANUAL_REQUIRED,
    /// as the claims see it (a retry under way comes before the rows parked behind it).
    pub holder: RowSummary,
    /// How many later rows of the key are in trouble behind it on the outbox (FAILED,
    /// PROCESSING or MANUAL_REQUIRED: the rows parked behind it among them; in poll mode
    /// later rows also wait as INIT, not counted here), or not handled yet on the inbox.
    pub waiting: i64,
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

/// What `outboxd janitor` does with the finished rows it removes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JanitorAction {
    /// DELETE them.
    Delete,
    /// Move them into this table (same columns), then delete them.
    Archive(String),
}

/// Which finished rows (SUCCESS, DONE) `outboxd janitor` removes, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JanitorRule {
    /// Rows finished longer ago than this go (`--older-than`). An outbox row resolved by
    /// an operator was never sent: it ages from its last update.
    pub older_than: Duration,
    /// The inbox's deduplication window (`inbox.dedupe_retention`): an inbox row created
    /// within it stays however long ago it was handled, so a late redelivery still finds
    /// it and is a duplicate. `None` for the outbox, which deduplicates nothing. A rule
    /// whose window does not match its table is refused ([`JanitorRule::window_for`]).
    pub dedupe_window: Option<Duration>,
    /// Delete or archive.
    pub action: JanitorAction,
}

impl JanitorRule {
    /// The outbox's rule: no deduplication window.
    pub fn outbox(older_than: Duration, action: JanitorAction) -> Self {
        Self {
            older_than,
            dedupe_window: None,
            action,
        }
    }

    /// The inbox's rule, which never cuts into `dedupe_window`.
    pub fn inbox(older_than: Duration, dedupe_window: Duration, action: JanitorAction) -> Self {
        Self {
            older_than,
            dedupe_window: Some(dedupe_window),
            action,
        }
    }

    /// The deduplication window of the rule for a table of `table`: zero for the outbox.
    /// A definite error when the rule is the other table's (an outbox rule on the inbox
    /// would delete rows a redelivery must still find).
    pub fn window_for(&self, table: TableKind) -> Result<Duration, ConnectorError> {
        match (table, self.dedupe_window) {
            (TableKind::Outbox, None) => Ok(Duration::ZERO),
            (TableKind::Inbox, Some(window)) => Ok(window),
            (TableKind::Outbox, Some(_)) => Err(ConnectorError::definite(
                "janitor: the outbox deduplicates nothing, its rule takes no deduplication window",
            )),
            (TableKind::Inbox, None) => Err(ConnectorError::definite(
                "janitor: the inbox's rule needs its deduplication window (inbox.dedupe_retention)",
            )),
        }
    }
}

/// The operator's actions on one table of rows with a status, the outbox or the inbox
/// ([`TableAdmin::TABLE`]), each one short transaction, each noted in `last_error` where
/// it changes a row's fate. Both tables' stores implement it; the core's commands are
/// written once over it.
pub trait TableAdmin: Send + Sync {
    /// The table the actions change, which names its statuses.
    const TABLE: TableKind;

    /// Counts by status and message type and the oldest unsent row; for the outbox also
    /// the checkpoint and the source's lag.
    fn status_summary(&self) -> impl Future<Output = Result<StatusSummary, ConnectorError>> + Send;

    /// Makes the selected FAILED / MANUAL_REQUIRED rows due now (`status = FAILED`,
    /// `next_retry_time = now()`, `retry_count = 0`, claim cleared). Returns the rows
    /// changed.
    fn retry_rows(
        &self,
        selector: &RetrySelector,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;

    /// Takes one new (INIT, PENDING) or FAILED row out of automatic retries and handling:
    /// MANUAL_REQUIRED with `last_error = "parked by operator: <reason>"`. The later rows
    /// of its key wait (on the outbox, under strict ordering). Returns whether the row was
    /// changed.
    fn park_row(
        &self,
        id: i64,
        reason: &str,
    ) -> impl Future<Output = Result<bool, ConnectorError>> + Send;

    /// Finishes one unfinished row for good without sending or handling it: SUCCESS
    /// without a Kafka position, with `last_error = "resolved by operator without
    /// sending: <reason>"`, or DONE with `"resolved by operator without handling:
    /// <reason>"`. Releases its key. Returns whether the row was changed.
    fn resolve_row(
        &self,
        id: i64,
        reason: &str,
    ) -> impl Future<Output = Result<bool, ConnectorError>> + Send;

    /// One page of rows of a status, newest first ([`RowQuery`]); served by the table's
    /// indexes of rows in trouble for FAILED and MANUAL_REQUIRED.
    fn list_rows(
        &self,
        query: &RowQuery,
    ) -> impl Future<Output = Result<Vec<RowSummary>, ConnectorError>> + Send;

    /// One row with its headers and the first `preview_chars` characters of its payload;
    /// `None` when there is no such row.
    fn row_detail(
        &self,
        id: i64,
        preview_chars: usize,
    ) -> impl Future<Output = Result<Option<RowDetail>, ConnectorError>> + Send;

    /// Up to `limit` held keys in key order, after `after_key` (the last key of the page
    /// before): each with the row that holds it and how many wait behind it.
    fn held_keys(
        &self,
        after_key: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<HeldKey>, ConnectorError>> + Send;

    /// Deletes (or archives) up to `batch` finished rows that `rule` selects, in one
    /// short transaction; a rule of the other table is a definite error
    /// ([`JanitorRule::window_for`]). Returns the rows removed; call again until 0.
    fn janitor_batch(
        &self,
        rule: &JanitorRule,
        batch: usize,
    ) -> impl Future<Output = Result<u64, ConnectorError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_query_names_a_status_of_its_table_and_searches_errors_in_trouble_only() {
        let query = |status: &str, error: Option<&str>| RowQuery {
            status: status.into(),
            error_contains: error.map(str::to_owned),
            limit: 10,
            ..RowQuery::default()
        };
        assert!(query("FAILED", Some("x")).check(TableKind::Outbox).is_ok());
        assert!(query("MANUAL_REQUIRED", Some("x"))
            .check(TableKind::Inbox)
            .is_ok());
        assert!(query("SUCCESS", None).check(TableKind::Outbox).is_ok());
        assert!(query("SUCCESS", Some("x"))
            .check(TableKind::Outbox)
            .is_err());
        assert!(query("DONE", None).check(TableKind::Outbox).is_err());
        assert!(query("PENDING", None).check(TableKind::Inbox).is_ok());
        let empty = RowQuery {
            limit: 0,
            ..query("FAILED", None)
        };
        assert!(empty.check(TableKind::Outbox).is_err());
    }

    #[test]
    fn a_janitor_rule_fits_only_its_table() {
        let day = Duration::from_secs(86_400);
        let outbox = JanitorRule::outbox(day, JanitorAction::Delete);
        let inbox = JanitorRule::inbox(day, 7 * day, JanitorAction::Delete);
        assert_eq!(
            outbox.window_for(TableKind::Outbox).ok(),
            Some(Duration::ZERO)
        );
        assert_eq!(inbox.window_for(TableKind::Inbox).ok(), Some(7 * day));
        assert!(!outbox
            .window_for(TableKind::Inbox)
            .unwrap_err()
            .is_transient());
        assert!(!inbox
            .window_for(TableKind::Outbox)
            .unwrap_err()
            .is_transient());
    }

    #[test]
    fn each_table_names_its_statuses_in_state_machine_order() {
        assert_eq!(
            TableKind::Outbox.statuses(),
            ["INIT", "PROCESSING", "FAILED", "MANUAL_REQUIRED", "SUCCESS"]
        );
        assert_eq!(
            TableKind::Inbox.statuses(),
            ["PENDING", "PROCESSING", "FAILED", "MANUAL_REQUIRED", "DONE"]
        );
    }
}
