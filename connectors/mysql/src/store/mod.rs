//! The MySQL/MariaDB [`OutboxStore`]: status write-back and the checkpoint row.
//!
//! `write_back.rs` holds the write-back (one transaction in one round trip, cut to the
//! server's `max_allowed_packet`, fenced by the pipeline's lock); `sql.rs` its statement
//! texts and the checkpoint upsert; `checkpoint.rs` the checkpoint row's reading.
//!
//! `claims.rs` holds the claims, the claimed write-back, the reaper, the retry schedule,
//! the blocked keys and `recover`'s scan of INIT rows; `operator.rs` the operator's
//! actions ([`outboxd_connector::TableAdmin`]). Rows become events through
//! the connector kit's row conversion, as on the log path.

mod browse;
mod checkpoint;
mod claims;
pub mod inbox;
mod inbox_insert;
mod inbox_operator;
mod inbox_verify;
mod operator;
mod own_rows;
mod sql;
mod table;
mod write_back;

use std::fmt::Write as _;

use mysql_async::Conn;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use outboxd_connector::{
    ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, NewOutboxRow, OutboxEvent,
    OutboxStore, OwnRowState, OwnRowsToDelete, Position, ReapPolicy, ReapReport, RetrySchedule,
    RowId, TransactionEnd, WriteBack,
};
use outboxd_connector_kit::store as kit_store;
use outboxd_connector_kit::tables;
use tokio::sync::Mutex;

use crate::client::execute;
use crate::log::identity::ServerIdentity;
use crate::log::server;
use crate::schema::qualified;
use crate::MysqlConnector;
pub(crate) use checkpoint::load_checkpoint;
pub(crate) use sql::{checkpoint_sql, failure_cases, reason_case};
pub(crate) use table::OutboxTable;

/// The SQL side of one MySQL pipeline. Holds one connection; when it breaks, the failing
/// call returns a transient error and the next call reconnects.
#[derive(Debug)]
pub struct MysqlOutboxStore {
    pub(crate) connector: MysqlConnector,
    /// The first outbox table: the operator's, whose commands act on one table
    /// (`OutboxLayout::for_table`).
    pub(crate) outbox: OutboxTable,
    /// Every outbox table, in the layout's order: an event's `table` indexes it.
    outboxes: Vec<OutboxTable>,
    pub(crate) checkpoint: String,
    /// The server this store writes to, stored with every checkpoint. A store lives for
    /// one relay session: after a reconnect (perhaps to another server) a new one is
    /// opened, and the stream has checked the checkpoint against the server by then.
    pub(crate) server: ServerIdentity,
    pub(crate) conn: Mutex<Option<Conn>>,
    /// `(connection id, max_allowed_packet)` of the connection in `conn`, once read.
    max_packet: std::sync::Mutex<Option<(u32, usize)>>,
    /// The outbox table the next claim starts from (several tables take turns).
    next_claim_table: AtomicUsize,
}

impl MysqlOutboxStore {
    /// Connects and checks that the tables answer; fails definitely when one is missing
    /// (run `outboxd init`).
    pub(crate) async fn open(connector: &MysqlConnector) -> Result<Self, ConnectorError> {
        let mut conn = connector.sql_conn().await?;
        let info = server::info(&mut conn).await?;
        let store = Self {
            connector: connector.clone(),
            outbox: OutboxTable::new(connector.layout.outbox_table(), &connector.layout),
            outboxes: connector
                .layout
                .outbox_tables
                .iter()
                .map(|t| OutboxTable::new(t, &connector.layout))
                .collect(),
            checkpoint: qualified(&connector.layout.checkpoint_table),
            server: ServerIdentity::of(&mut conn, &info).await?,
            conn: Mutex::new(None),
            max_packet: std::sync::Mutex::new(None),
            next_claim_table: AtomicUsize::new(0),
        };
        // With deleted rows the outbox has no status columns, and only the log reads it.
        let mut probe = format!(
            "SELECT pipeline, position, updated_at FROM {} LIMIT 0",
            store.checkpoint
        );
        if connector.layout.tracks_status() {
            for outbox in &store.outboxes {
                let _ = write!(
                    probe,
                    "; SELECT {}, status, retry_count, max_retry_count, next_retry_time, \
                     last_error, sent_at, kafka_partition, kafka_offset, updated_at \
                     FROM {outbox} LIMIT 0",
                    outbox.names.id
                );
            }
        }
        execute(&mut conn, &probe, &store.context("checking the tables")).await?;
        *store.conn.lock().await = Some(conn);
        Ok(store)
    }

    /// The outbox table of index `table`.
    pub(crate) fn outbox_at(&self, table: u16) -> Result<&OutboxTable, ConnectorError> {
        self.outboxes
            .get(usize::from(table))
            .ok_or_else(|| tables::unknown_table(table, self.outboxes.len()))
    }

    /// The outbox table of index `table` as configured, for events and messages.
    pub(crate) fn table_name(&self, table: u16) -> &str {
        let tables = &self.connector.layout.outbox_tables;
        tables
            .get(usize::from(table))
            .map_or(self.connector.layout.outbox_table(), String::as_str)
    }

    pub(crate) fn context(&self, what: &str) -> String {
        format!(
            "{what} ({} / {} on {}; run `outboxd check`, `outboxd init` creates missing tables)",
            self.connector.layout.outbox_table(),
            self.connector.layout.checkpoint_table,
            self.connector.endpoint()
        )
    }
}

impl MysqlOutboxStore {
    /// A definite error unless the outbox rows carry their status (`outbox.rows`).
    fn rows_carry_status(&self) -> Result<(), ConnectorError> {
        match self.connector.layout.tracks_status() {
            true => Ok(()),
            false => Err(kit_store::rows_carry_no_status()),
        }
    }
}

impl OutboxStore for MysqlOutboxStore {
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        if kit_store::is_empty(&batch) {
            return Ok(());
        }
        let context = self.context(&format!(
            "writing back {} delivered, {} failed and {} parked outbox rows",
            batch.delivered.len(),
            batch.failed.len(),
            batch.parked.len()
        ));
        self.run_write_back(&batch, &context).await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        self.rows_carry_status()?;
        // Each table in turn, from the one after the last claim's first, while the claim
        // has room: with several tables, a backlog in one does not starve the others.
        let count = self.outboxes.len();
        let start = self.next_claim_table.fetch_add(1, Ordering::Relaxed) % count.max(1);
        let mut claimed = Vec::new();
        for index in (start..count).chain(0..start) {
            let limit = request.limit.saturating_sub(claimed.len());
            if limit == 0 {
                break;
            }
            let table = u16::try_from(index).unwrap_or(u16::MAX);
            let request = ClaimRequest { limit, ..request };
            claimed.extend(self.claim_rows(table, request).await?);
        }
        Ok(claimed)
    }

    async fn complete_claimed(&self, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
        self.rows_carry_status()?;
        self.complete_claimed_rows(batch).await
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        self.rows_carry_status()?;
        let mut report = ReapReport::default();
        for outbox in &self.outboxes {
            let reaped = self.reap_rows(outbox, policy).await?;
            report.failed += reaped.failed;
            report.manual_required += reaped.manual_required;
        }
        Ok(report)
    }

    async fn retry_schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        self.rows_carry_status()?;
        // The earliest of every table's.
        let earliest = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut schedule = RetrySchedule::default();
        for outbox in &self.outboxes {
            let one = self.schedule(outbox).await?;
            schedule.next_due = earliest(schedule.next_due, one.next_due);
            schedule.oldest_claim = earliest(schedule.oldest_claim, one.oldest_claim);
        }
        Ok(schedule)
    }

    async fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        if !self.connector.layout.tracks_status() {
            return Ok(HashSet::new());
        }
        // A key in trouble in any table is held back: the record key is the same key
        // whatever the table.
        let mut blocked = HashSet::new();
        for outbox in &self.outboxes {
            blocked.extend(self.blocked(outbox, keys).await?);
        }
        Ok(blocked)
    }

    async fn insert_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> Result<(), ConnectorError> {
        self.insert_own_rows(rows, end).await
    }

    async fn own_rows(&self, message_ids: &[String]) -> Result<Vec<OwnRowState>, ConnectorError> {
        self.read_own_rows(message_ids).await
    }

    async fn delete_own_rows(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> Result<u64, ConnectorError> {
        self.delete_own_rows_of(message_ids, which).await
    }

    async fn scan_init(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        self.init_rows(table, after_id, limit).await
    }

    async fn highest_delivered_id(&self) -> Result<Option<i64>, ConnectorError> {
        if !self.connector.layout.tracks_status() {
            return Ok(None);
        }
        let mut highest = None;
        for outbox in &self.outboxes {
            highest = highest.max(self.highest_success_id(outbox).await?);
        }
        Ok(highest)
    }

    async fn delivered_among(&self, rows: &[RowId]) -> Result<HashSet<RowId>, ConnectorError> {
        if !self.connector.layout.tracks_status() {
            return Ok(HashSet::new());
        }
        let mut delivered = HashSet::new();
        for (table, ids) in tables::ids_by_table(rows) {
            let found = self.success_among(self.outbox_at(table)?, &ids).await?;
            delivered.extend(tables::rows_of(table, found));
        }
        Ok(delivered)
    }

    async fn load_checkpoint(&self) -> Result<Option<Position>, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = load_checkpoint(conn, &self.connector).await;
        if result.as_ref().is_err_and(ConnectorError::is_transient) {
            *slot = None;
        }
        let Some(checkpoint) = result? else {
            return Ok(None);
        };
        // The stream checks the binlog too; this is what a session skips by.
        if let Some(theirs) = checkpoint.server.as_ref().filter(|s| **s != self.server) {
            return Err(server::foreign_checkpoint_error(
                &checkpoint.position,
                &self.connector.pipeline,
                &format!(
                    "was written on another server ({theirs}; this server has {})",
                    self.server
                ),
            ));
        }
        Ok(Some(checkpoint.position.position()))
    }
}

pub(crate) use outboxd_connector_kit::retry::delay_ms;
