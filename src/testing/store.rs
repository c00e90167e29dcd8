//! [`MemoryStore`], the twin of an engine's [`OutboxStore`]: the write-back with its status
//! rules and the checkpoint, the rows outboxd writes itself, `recover`'s scan; the claim
//! path is in [`super::claims`]. Its inherent methods are the test's hand on the table:
//! rows inserted or set as another writer would, and faults (a slow commit, a restarting
//! or silent database).

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use outboxd_connector::{
    ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, NewOutboxRow, OutboxEvent,
    OutboxStore, OwnRowState, OwnRowsToDelete, Position, ReapPolicy, ReapReport, RetrySchedule,
    RowId, TransactionEnd, WriteBack,
};

use super::claims;
use super::database::{Database, Row};

/// The default of the table's `max_retry_count` column (`schemas/*/outbox.sql`).
const DEFAULT_MAX_RETRIES: i32 = 10;

/// An outbox table and checkpoint row in memory with the contract's rules: see
/// [`OutboxStore`]'s documentation, which each method follows. A handle on a
/// [`Database`]: the stores a [`super::connector::MemoryConnector`] opens share its rows,
/// as connections to one server do; [`MemoryStore::default`] is a database of its own
/// with its tables (and no log: the test scripts the log with a
/// [`super::LogWriter`]).
pub(crate) struct MemoryStore {
    pub(super) db: Arc<Database>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            db: Database::new(true),
        }
    }
}

impl MemoryStore {
    /// A store on `db`, as `open_store` opens one.
    pub(super) fn on(db: Arc<Database>) -> Self {
        Self { db }
    }

    /// Inserts INIT rows of ids and keys the test chose, each read back as
    /// [`super::event`]`(id, key)`. Nothing is logged: the test writes the log itself.
    pub(crate) fn insert(&self, rows: &[(i64, &str)]) {
        let mut state = self.db.state();
        for (id, key) in rows {
            state.rows.insert(*id, Row::fixture(*id, key));
            state.next_id = state.next_id.max(*id);
        }
    }

    pub(crate) fn row(&self, id: i64) -> Option<Row> {
        self.db.state().rows.get(&id).cloned()
    }

    pub(crate) fn status(&self, id: i64) -> &'static str {
        self.row(id).map_or("absent", |r| r.status)
    }

    /// The row's `kafka_offset`.
    pub(crate) fn offset(&self, id: i64) -> Option<i64> {
        self.row(id).and_then(|r| r.offset)
    }

    /// A row shown SUCCESS at `offset`, as a write-back before a crash left it.
    pub(crate) fn set_delivered(&self, id: i64, offset: i64) {
        if let Some(row) = self.db.state().rows.get_mut(&id) {
            row.deliver(0, offset, SystemTime::now());
        }
    }

    /// What another writer (the claim worker, an operator) would do. As every writer of
    /// a status in trouble does, it leaves `next_retry_time` set (now, unless it was), so
    /// the row holds its key back; SUCCESS clears it, as a write-back does.
    pub(crate) fn set_status(&self, id: i64, status: &'static str) {
        if let Some(row) = self.db.state().rows.get_mut(&id) {
            row.status = status;
            if super::database::BLOCKING.contains(&status) {
                row.next_retry_time = row.next_retry_time.or(Some(SystemTime::now()));
            } else if status == "SUCCESS" {
                row.next_retry_time = None;
            }
        }
    }

    /// Claims wait with no answer while `silent` (a database behind a network black hole).
    pub(crate) fn silence_claims(&self, silent: bool) {
        self.db.silent_claims.store(silent, SeqCst);
    }

    /// Calls of `claim` so far, answered or not.
    pub(crate) fn claim_calls(&self) -> usize {
        self.db.claim_calls.load(SeqCst)
    }

    /// Write-backs wait while `held` (a slow commit), and go on once it is cleared.
    pub(crate) fn hold_write_backs(&self, held: bool) {
        self.db.hold_write_backs.store(held, SeqCst);
    }

    /// How many write-backs are waiting behind [`Self::hold_write_backs`].
    pub(crate) fn held_write_backs(&self) -> usize {
        self.db.held_write_backs.load(SeqCst)
    }

    /// Write-backs fail (transient) while `down`, as during a database restart.
    pub(crate) fn set_unavailable(&self, down: bool) {
        self.db.state().unavailable = down;
    }

    /// How many write-backs were refused while unavailable.
    pub(crate) fn refused_write_backs(&self) -> usize {
        self.db.state().refused
    }

    /// Replaces the checkpoint row, as `outboxd recover` (or a restore) does.
    pub(crate) fn reset_checkpoint(&self, position: Option<Position>) {
        self.db.state().checkpoint = position;
    }

    pub(crate) fn checkpoint(&self) -> Option<Position> {
        self.db.state().checkpoint.clone()
    }

    /// Waits while [`Self::hold_write_backs`] holds the write-backs back.
    async fn behind_a_slow_commit(&self) {
        if self.db.hold_write_backs.load(SeqCst) {
            self.db.held_write_backs.fetch_add(1, SeqCst);
            while self.db.hold_write_backs.load(SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            self.db.held_write_backs.fetch_sub(1, SeqCst);
        }
    }
}

impl OutboxStore for MemoryStore {
    /// One statement under the database's lock, so the statuses and the checkpoint are
    /// written together or, when a table is missing, not at all. The twin has one outbox
    /// table: rows are found by id.
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        self.behind_a_slow_commit().await;
        let mut state = self.db.state();
        if state.unavailable {
            state.refused += 1;
            return Err(ConnectorError::transient(
                "the database system is shutting down",
            ));
        }
        let rows_named = !(batch.delivered.is_empty()
            && batch.failed.is_empty()
            && batch.parked.is_empty()
            && batch.rejected.is_empty());
        if rows_named {
            state.outbox()?;
        }
        if batch.checkpoint.is_some() {
            state.checkpoint_table()?;
        }
        let now = SystemTime::now();
        let replace = batch.replace_positions;
        // In the engines' order (SUCCESS, then FAILED, then parked and rejected), so a
        // row both delivered and failed in one batch ends SUCCESS (FAILED under
        // `replace_positions`, whose FAILED takes SUCCESS rows too).
        for d in batch.delivered {
            let Some(row) = state.rows.get_mut(&d.id) else {
                continue;
            };
            let resent = replace && row.status == "SUCCESS";
            if matches!(row.status, "INIT" | "FAILED" | "MANUAL_REQUIRED") || resent {
                row.deliver(d.partition, d.offset, now);
            }
        }
        // From INIT, and under exactly-once from SUCCESS too (an aborted window's
        // write-back): see `WriteBack::replace_positions`.
        let failable =
            |row: &&mut Row| row.status == "INIT" || (replace && row.status == "SUCCESS");
        for f in batch.failed {
            if let Some(row) = state.rows.get_mut(&f.id).filter(failable) {
                row.fail(&f.error, f.retry_delay, now);
                row.unsend();
            }
        }
        let parked = batch.parked.iter().map(|p| (p, "FAILED"));
        let rejected = batch.rejected.iter().map(|r| (r, "MANUAL_REQUIRED"));
        for (p, status) in parked.chain(rejected) {
            if let Some(row) = state.rows.get_mut(&p.id).filter(failable) {
                row.set_aside(status, &p.reason, now);
                row.unsend();
            }
        }
        if let Some(position) = batch.checkpoint {
            if state.checkpoint.as_ref() < Some(position) {
                state.checkpoint = Some(position.clone());
            }
        }
        Ok(())
    }

    /// Refuses a checkpoint another server wrote: the relay would skip by it.
    async fn load_checkpoint(&self) -> Result<Option<Position>, ConnectorError> {
        let state = self.db.state();
        state.checkpoint_table()?;
        match &state.checkpoint {
            Some(position) if self.db.is_foreign(position) => {
                Err(self.db.foreign_checkpoint(position))
            }
            checkpoint => Ok(checkpoint.clone()),
        }
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        claims::claim(&self.db, request).await
    }

    async fn complete_claimed(&self, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
        claims::complete(&self.db, batch)
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        claims::reap(&self.db, policy)
    }

    async fn retry_schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        claims::schedule(&self.db)
    }

    async fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> Result<std::collections::HashSet<String>, ConnectorError> {
        claims::blocked_keys(&self.db, keys)
    }

    async fn highest_delivered_id(&self) -> Result<Option<i64>, ConnectorError> {
        let state = self.db.state();
        state.outbox()?;
        let delivered = state.rows.iter().rev().find(|(_, r)| r.status == "SUCCESS");
        Ok(delivered.map(|(id, _)| *id))
    }

    /// One table: rows are found by id.
    async fn delivered_among(
        &self,
        rows: &[RowId],
    ) -> Result<std::collections::HashSet<RowId>, ConnectorError> {
        let state = self.db.state();
        state.outbox()?;
        let delivered =
            |row: &&RowId| (state.rows.get(&row.id)).is_some_and(|r| r.status == "SUCCESS");
        Ok(rows.iter().filter(delivered).copied().collect())
    }

    /// One table (index 0): its INIT rows after `after_id`, in id order.
    async fn scan_init(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        let state = self.db.state();
        state.outbox()?;
        if table != 0 {
            return Ok(Vec::new());
        }
        Ok((state.rows.range(after_id.saturating_add(1)..))
            .filter(|(_, row)| row.status == "INIT")
            .take(limit)
            .map(|(id, row)| row.event(*id, None))
            .collect())
    }

    /// Committed: one transaction in the log, read by a stream as the application's
    /// rows are. Rolled back: nothing but the ids the sequence handed out.
    async fn insert_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> Result<(), ConnectorError> {
        {
            let mut state = self.db.state();
            state.outbox()?;
            if end == TransactionEnd::Rollback {
                state.next_id += i64::try_from(rows.len()).unwrap_or(i64::MAX);
                return Ok(());
            }
        }
        let rows = rows.iter().map(|new| {
            let mut row = Row::new(
                new.message_id.clone(),
                new.message_type.clone(),
                new.biz_key.clone(),
                Bytes::from(new.payload.clone()),
                Row::headers_of(new.headers.as_deref()),
                DEFAULT_MAX_RETRIES,
            );
            row.topic = new.topic.clone();
            row
        });
        self.db.commit(rows.collect());
        Ok(())
    }

    async fn own_rows(&self, message_ids: &[String]) -> Result<Vec<OwnRowState>, ConnectorError> {
        let state = self.db.state();
        state.outbox()?;
        let found = state
            .rows
            .values()
            .filter(|row| message_ids.contains(&row.message_id))
            .map(|row| OwnRowState {
                message_id: row.message_id.clone(),
                status: row.status.to_owned(),
                retry_count: row.retry_count,
                position: row.partition.zip(row.offset),
                last_error: row.last_error.clone(),
            });
        Ok(found.collect())
    }

    async fn delete_own_rows(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> Result<u64, ConnectorError> {
        let mut state = self.db.state();
        state.outbox()?;
        let before = state.rows.len();
        state.rows.retain(|_, row| {
            let chosen = which == OwnRowsToDelete::All || row.status == "SUCCESS";
            !(chosen && message_ids.contains(&row.message_id))
        });
        Ok(u64::try_from(before - state.rows.len()).unwrap_or(u64::MAX))
    }
}
