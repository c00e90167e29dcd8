//! [`MemoryConnector`], the twin of an engine's [`Connector`] over one in-memory
//! [`Database`]: `init` creates the tables and, in log mode, the slot; `check` reports
//! them and a checkpoint from another server; `open_*` hand out handles on the database;
//! `reset_log_position` is `recover`'s log half.
//!
//! The twins twin the pipeline's [`OutboxStore`](outboxd_connector::OutboxStore) and
//! [`ChangeStream`](outboxd_connector::ChangeStream), which the core's unit tests run the
//! relay and the claim worker on. The operator's actions ([`TableAdmin`]) and the inbox
//! ([`InboxStore`]) are not twinned: they are definite errors here, but for parking a row
//! (the stream's scenarios park one to show that a status update is not an event).

use std::sync::Arc;

use outboxd_connector::{
    parked_by_operator, CheckLine, CheckReport, ClaimedMessage, Completed, Connector,
    ConnectorError, HeldKey, InboxMessage, InboxOutcome, InboxStore, Ingested, JanitorRule,
    OwnMessageState, ReadMode, ReapPolicy, ReapReport, RetrySchedule, RetrySelector, RowDetail,
    RowQuery, RowSummary, StatusSummary, TableAdmin, TableKind,
};

use super::database::{Database, RECOVER};
use super::{MemoryStore, MemoryStream};

/// The error of what the twins do not twin.
fn not_twinned(what: &str) -> ConnectorError {
    ConnectorError::definite(format!("{what} is not part of the memory twin"))
}

/// A connector to a database of its own, without tables until `init`.
pub(crate) struct MemoryConnector {
    pub(super) db: Arc<Database>,
}

impl Default for MemoryConnector {
    fn default() -> Self {
        Self {
            db: Database::new(false),
        }
    }
}

impl Connector for MemoryConnector {
    type Stream = MemoryStream;
    type Store = MemoryStore;
    type Inbox = UntwinnedInbox;

    /// The tables, and in log mode the slot at the log's current end. Idempotent.
    async fn init(&self, mode: ReadMode) -> Result<Vec<String>, ConnectorError> {
        let mut state = self.db.state();
        let mut lines = vec![if state.initialised {
            "tables: already there".to_owned()
        } else {
            "tables: created".to_owned()
        }];
        state.initialised = true;
        if mode == ReadMode::Log {
            if state.slot.is_some() {
                lines.push("slot: already there".into());
            } else {
                state.slot = Some(state.end_position());
                lines.push("slot: created".into());
            }
        }
        Ok(lines)
    }

    fn schema(&self, mode: ReadMode) -> String {
        format!("-- the memory twin has no DDL ({mode:?} mode)\n")
    }

    async fn check(&self, mode: ReadMode) -> CheckReport {
        let state = self.db.state();
        let mut report = vec![if state.initialised {
            CheckLine::ok("tables", "outbox and checkpoint")
        } else {
            CheckLine::fail("tables", "missing", "run `outboxd init`")
        }];
        if mode == ReadMode::Log {
            report.push(match (&state.slot, state.position_lost) {
                (_, true) => CheckLine::fail("slot", "dropped or invalidated", RECOVER),
                (Some(slot), false) => CheckLine::ok("slot", format!("confirmed {slot}")),
                (None, false) => CheckLine::fail("slot", "missing", "run `outboxd init`"),
            });
            report.push(match &state.checkpoint {
                Some(c) if self.db.is_foreign(c) => CheckLine::fail(
                    "checkpoint",
                    format!("{c} was written on another server"),
                    RECOVER,
                ),
                Some(c) => CheckLine::ok("checkpoint", c.to_string()),
                None => CheckLine::ok("checkpoint", "none yet"),
            });
        }
        report
    }

    async fn open_stream(&self) -> Result<MemoryStream, ConnectorError> {
        MemoryStream::open(Arc::clone(&self.db))
    }

    async fn open_store(&self) -> Result<MemoryStore, ConnectorError> {
        self.db.state().outbox()?;
        Ok(MemoryStore::on(Arc::clone(&self.db)))
    }

    async fn open_inbox(&self) -> Result<UntwinnedInbox, ConnectorError> {
        Err(not_twinned("the inbox"))
    }

    /// A new slot at the log's end, and the checkpoint there (this server's), as
    /// MySQL's reset records it: what was written before is left to `recover`'s scan.
    async fn reset_log_position(&self) -> Result<String, ConnectorError> {
        let mut state = self.db.state();
        state.outbox()?;
        let now = state.end_position();
        state.slot = Some(now.clone());
        state.position_lost = false;
        state.checkpoint = Some(now.clone());
        Ok(format!("the log starts afresh at {now}"))
    }

    fn describe(&self) -> String {
        format!("memory twin {}", self.db.server)
    }
}

/// Parking a row is twinned (see the module's doc); the other actions are not.
impl TableAdmin for MemoryStore {
    const TABLE: TableKind = TableKind::Outbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        Err(not_twinned("status_summary"))
    }

    async fn retry_rows(&self, _selector: &RetrySelector) -> Result<u64, ConnectorError> {
        Err(not_twinned("retry_rows"))
    }

    /// INIT or FAILED → MANUAL_REQUIRED with the operator's note, claim cleared, in the
    /// retry index (it holds its key back), as the engines' statement does.
    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let mut state = self.db.state();
        state.outbox()?;
        let row = state.rows.get_mut(&id);
        let Some(row) = row.filter(|r| matches!(r.status, "INIT" | "FAILED")) else {
            return Ok(false);
        };
        row.status = "MANUAL_REQUIRED";
        row.next_retry_time = row.next_retry_time.or(Some(std::time::SystemTime::now()));
        row.last_error = Some(parked_by_operator(reason));
        row.unclaim();
        Ok(true)
    }

    async fn resolve_row(&self, _id: i64, _reason: &str) -> Result<bool, ConnectorError> {
        Err(not_twinned("resolve_row"))
    }

    async fn list_rows(&self, _query: &RowQuery) -> Result<Vec<RowSummary>, ConnectorError> {
        Err(not_twinned("list_rows"))
    }

    async fn row_detail(
        &self,
        _id: i64,
        _preview_chars: usize,
    ) -> Result<Option<RowDetail>, ConnectorError> {
        Err(not_twinned("row_detail"))
    }

    async fn held_keys(
        &self,
        _after_key: Option<&str>,
        _limit: usize,
    ) -> Result<Vec<HeldKey>, ConnectorError> {
        Err(not_twinned("held_keys"))
    }

    async fn janitor_batch(
        &self,
        _rule: &JanitorRule,
        _batch: usize,
    ) -> Result<u64, ConnectorError> {
        Err(not_twinned("janitor_batch"))
    }
}

/// The inbox side of [`MemoryConnector`], which is not twinned: no value of it exists
/// (`open_inbox` fails), so none of its methods can be called.
pub(crate) enum UntwinnedInbox {}

impl InboxStore for UntwinnedInbox {
    fn payload_is_json(&self) -> bool {
        match *self {}
    }

    async fn insert(&self, _messages: &[InboxMessage]) -> Result<Vec<Ingested>, ConnectorError> {
        match *self {}
    }

    async fn claim(&self, _limit: usize) -> Result<Vec<ClaimedMessage>, ConnectorError> {
        match *self {}
    }

    async fn complete(
        &self,
        _message: &ClaimedMessage,
        _outcome: InboxOutcome<'_>,
    ) -> Result<Completed, ConnectorError> {
        match *self {}
    }

    async fn reap(&self, _policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        match *self {}
    }

    async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        match *self {}
    }

    async fn own_messages(
        &self,
        _source: &str,
        _message_ids: &[String],
    ) -> Result<Vec<OwnMessageState>, ConnectorError> {
        match *self {}
    }

    async fn delete_own_messages(
        &self,
        _source: &str,
        _message_ids: &[String],
    ) -> Result<u64, ConnectorError> {
        match *self {}
    }

    async fn create_scratch_table(&self, _name: &str) -> Result<String, ConnectorError> {
        match *self {}
    }

    async fn scratch_rows(&self, _name: &str) -> Result<Vec<(String, String)>, ConnectorError> {
        match *self {}
    }

    async fn drop_scratch_table(&self, _name: &str) -> Result<(), ConnectorError> {
        match *self {}
    }
}

impl TableAdmin for UntwinnedInbox {
    const TABLE: TableKind = TableKind::Inbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        match *self {}
    }

    async fn retry_rows(&self, _selector: &RetrySelector) -> Result<u64, ConnectorError> {
        match *self {}
    }

    async fn park_row(&self, _id: i64, _reason: &str) -> Result<bool, ConnectorError> {
        match *self {}
    }

    async fn resolve_row(&self, _id: i64, _reason: &str) -> Result<bool, ConnectorError> {
        match *self {}
    }

    async fn list_rows(&self, _query: &RowQuery) -> Result<Vec<RowSummary>, ConnectorError> {
        match *self {}
    }

    async fn row_detail(
        &self,
        _id: i64,
        _preview_chars: usize,
    ) -> Result<Option<RowDetail>, ConnectorError> {
        match *self {}
    }

    async fn held_keys(
        &self,
        _after_key: Option<&str>,
        _limit: usize,
    ) -> Result<Vec<HeldKey>, ConnectorError> {
        match *self {}
    }

    async fn janitor_batch(
        &self,
        _rule: &JanitorRule,
        _batch: usize,
    ) -> Result<u64, ConnectorError> {
        match *self {}
    }
}
