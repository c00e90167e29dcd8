//! The MySQL/MariaDB [`OutboxStore`]: status write-back and the checkpoint row.
//!
//! A write-back is one transaction sent as one multi-statement text query (one round
//! trip): a SUCCESS `UPDATE … JOIN (SELECT … UNION ALL …)` for the whole batch, a FAILED
//! single-table `UPDATE … CASE id WHEN …` for the failures, and the checkpoint upsert, then
//! `COMMIT`. Every value is a number or a hex literal, so no `sql_mode` or character set can
//! change what a statement means. When any statement fails the connection is dropped, so
//! the server rolls the transaction back.
//!
//! The server refuses a query text larger than its `max_allowed_packet` (read once per
//! connection), and refuses it again on every retry: so statements are cut by size as well
//! as by rows, and a write-back too large for one text (a transaction of 100,000 rows parked
//! behind their key) is sent in several, each under the limit, still in one transaction.
//!
//! Once a stream of the connector holds the pipeline's lock, a write-back commits only
//! while that connection still holds it (or nobody does): its last statement before
//! `COMMIT` fails when another connection holds the lock, so an outboxd whose lock
//! connection died, and which another one took over from, cannot write statuses or move
//! the checkpoint the new reader now owns.
//!
//! `claims.rs` holds the claims, the claimed write-back, the reaper, the retry schedule
//! and the blocked keys; `operator.rs` the operator's actions. Rows become events through
//! the connector kit's row conversion, as on the log path.

mod claims;
pub mod inbox;
mod operator;
mod table;

use std::fmt::Write as _;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use outboxd_connector::{
    last_error_text, ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, Delivered,
    DeliveryFailure, ErrorReason, OutboxStore, ParkedEvent, Position, ReapPolicy, ReapReport,
    RetrySchedule, RowId, WriteBack,
};
use outboxd_connector_kit::status;
use outboxd_connector_kit::store as kit_store;
use outboxd_connector_kit::tables;
use tokio::sync::Mutex;

use crate::client::{classify, execute, int, query_first, text};
use crate::log::identity::{ServerIdentity, StoredCheckpoint};
use crate::log::position::BinlogPosition;
use crate::log::server;
use crate::schema::{hex_literal, qualified, sql_string};
use crate::MysqlConnector;
pub(crate) use table::OutboxTable;

/// Rows per statement at most: keeps each `CASE` short enough to evaluate quickly.
const ROWS_PER_STATEMENT: usize = 5000;
/// "Subquery returns more than 1 row": the write-back's lock fence failed.
const FENCE_ERROR: u16 = 1242;
/// Bytes of a query text kept free below `max_allowed_packet` (the packet's command byte,
/// and the estimates' slack).
const PACKET_MARGIN: usize = 1024;
/// The smallest `max_allowed_packet` the server accepts; assumed when it cannot be read.
const MIN_PACKET: usize = 1024;
/// Upper bound of a statement's text besides its rows (keywords, the table name twice).
const STATEMENT_OVERHEAD: usize = 600;

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

    /// `max_allowed_packet` of `conn`: read once per connection.
    async fn max_packet(&self, conn: &mut Conn) -> Result<usize, ConnectorError> {
        let id = conn.id();
        let cached = *self
            .max_packet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, value)) = cached {
            if at == id {
                return Ok(value);
            }
        }
        let row = query_first(
            conn,
            "SELECT @@max_allowed_packet",
            &self.context("reading max_allowed_packet"),
        )
        .await?;
        let value = row
            .map(|r| int(&r, 0))
            .transpose()?
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(MIN_PACKET);
        *self
            .max_packet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((id, value));
        Ok(value)
    }

    /// Runs `texts` in order on one connection (they make up one transaction); drops the
    /// connection when one fails, so the server rolls back what the others began.
    async fn run_write_back(
        &self,
        batch: &WriteBack<'_>,
        context: &str,
    ) -> Result<(), ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = async {
            let limit = self.max_packet(conn).await?.saturating_sub(PACKET_MARGIN);
            let lock_name = self.connector.lock_name();
            let fence = match self.connector.lock_conn.load(Ordering::SeqCst) {
                0 => None,
                id => Some((lock_name.as_str(), id)),
            };
            let texts = write_back_texts(
                batch,
                &self.outboxes,
                &self.checkpoint,
                &self.connector.pipeline,
                &self.server,
                fence,
                limit,
            )?;
            if texts.len() > 1 {
                tracing::debug!(
                    texts = texts.len(),
                    limit,
                    "write-back larger than max_allowed_packet: sent in several texts"
                );
            }
            for text in &texts {
                if let Err(e) = conn.query_drop(text.as_str()).await {
                    return Err(match (&e, fence) {
                        (mysql_async::Error::Server(server), Some((_, id)))
                            if server.code == FENCE_ERROR =>
                        {
                            self.lock_lost(id)
                        }
                        _ => classify(&e, context),
                    });
                }
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            *slot = None;
        }
        result
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

    /// The write-back's fence failed: another connection holds the pipeline's lock.
    fn lock_lost(&self, id: u32) -> ConnectorError {
        ConnectorError::transient(format!(
            "pipeline `{}` is held by another outboxd now: this one's lock connection (id \
             {id}) was lost and another reader took over, so its status write-back and \
             checkpoint are refused (rolled back); this outboxd stops reading and waits to \
             take the lock again",
            self.connector.pipeline
        ))
        .with_reason(ErrorReason::SlotInUse)
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

/// Reads the checkpoint row of the connector's pipeline: the position and, unless an
/// older outboxd wrote it, the server it was read from.
pub(crate) async fn load_checkpoint(
    conn: &mut Conn,
    connector: &MysqlConnector,
) -> Result<Option<StoredCheckpoint>, ConnectorError> {
    let table = &connector.layout.checkpoint_table;
    let sql = format!(
        "SELECT position FROM {} WHERE pipeline = {}",
        qualified(table),
        sql_string(&connector.pipeline)
    );
    let context = format!("reading the checkpoint from {table}");
    let Some(row) = query_first(conn, &sql, &context).await? else {
        return Ok(None);
    };
    let text = text(&row, 0)?.unwrap_or_default();
    match StoredCheckpoint::parse(&text) {
        Ok(checkpoint) => Ok(Some(checkpoint)),
        Err(_) => Err(ConnectorError::definite(format!(
            "the checkpoint of pipeline `{}` in {table} is `{text}`, not a binlog position; \
             delete the row, run `outboxd init --config <file>` to record the current position \
             and `outboxd recover --config <file>` to rescan INIT rows",
            connector.pipeline
        ))),
    }
}

/// The write-back of `batch` as one transaction: `START TRANSACTION`, the statements, the
/// checkpoint upsert, `COMMIT`, in as few query texts as fit `limit` bytes each (one,
/// unless the batch is large). A definite error when a single row's statement exceeds
/// `limit` (a `max_allowed_packet` below any useful size). The checkpoint names `server`.
///
/// With `fence` = `(lock name, connection id)`, the last statement before `COMMIT` fails
/// with [`FENCE_ERROR`] when another connection holds that lock.
fn write_back_texts(
    batch: &WriteBack<'_>,
    outboxes: &[OutboxTable],
    checkpoint: &str,
    pipeline: &str,
    server: &ServerIdentity,
    fence: Option<(&str, u32)>,
    limit: usize,
) -> Result<Vec<String>, ConnectorError> {
    let mut statements = Vec::new();
    // Each table's rows, in this one transaction.
    for part in tables::split_write_back(batch) {
        let outbox = outboxes
            .get(usize::from(part.table))
            .ok_or_else(|| tables::unknown_table(part.table, outboxes.len()))?;
        row_statements(&mut statements, &part.rows(), outbox, limit);
    }
    if let Some(position) = batch.checkpoint {
        let position = BinlogPosition::from_position(position)?;
        let mut sql = checkpoint_sql(checkpoint, pipeline, &position, server);
        sql.push_str(";\n");
        statements.push(sql);
    }
    if let Some((lock, id)) = fence {
        // A scalar subquery of two rows is an error on MySQL and MariaDB alike (SIGNAL
        // outside a stored program is MariaDB's only); no other statement here has one.
        statements.push(format!(
            "SELECT (SELECT 1 UNION ALL SELECT 2 FROM DUAL \
             WHERE COALESCE(IS_USED_LOCK({}), {id}) <> {id}) AS outboxd_lock_fence;\n",
            sql_string(lock)
        ));
    }

    const BEGIN: &str = "START TRANSACTION;\n";
    const COMMIT: &str = "COMMIT";
    let mut texts = Vec::new();
    let mut text = String::from(BEGIN);
    for statement in statements {
        if statement.len() + BEGIN.len() + COMMIT.len() > limit {
            return Err(ConnectorError::definite(format!(
                "a write-back statement of {} bytes does not fit the server's \
                 max_allowed_packet ({} bytes with outboxd's margin): raise max_allowed_packet \
                 (SET GLOBAL max_allowed_packet and in the server's configuration)",
                statement.len(),
                limit
            )));
        }
        if text.len() + statement.len() + COMMIT.len() > limit {
            texts.push(std::mem::take(&mut text));
        }
        text.push_str(&statement);
    }
    text.push_str(COMMIT);
    texts.push(text);
    Ok(texts)
}

/// The status statements of `batch`, whose rows are all in `outbox`, each under `limit`
/// bytes where a row allows.
fn row_statements(
    statements: &mut Vec<String>,
    batch: &WriteBack<'_>,
    outbox: &OutboxTable,
    limit: usize,
) {
    // Every row's share of its statement is bounded from above, so a chunk whose bounds
    // fit the room fits itself.
    let room = limit.saturating_sub(STATEMENT_OVERHEAD + 2 * outbox.quoted.len());
    for chunk in size_chunks(batch.delivered, room, |_| 80) {
        let mut sql = String::new();
        success_sql(&mut sql, outbox, chunk, batch.replace_positions);
        statements.push(sql);
    }
    for chunk in size_chunks(batch.failed, room, |f| {
        2 * last_error_text(&f.error).len() + 160
    }) {
        let mut sql = String::new();
        failed_sql(&mut sql, outbox, chunk, batch.replace_positions);
        statements.push(sql);
    }
    // Parked rows become FAILED, rejected ones MANUAL_REQUIRED: due now, with the reason.
    for (rows, status) in [
        (batch.parked, status::FAILED),
        (batch.rejected, status::MANUAL_REQUIRED),
    ] {
        for chunk in size_chunks(rows, room, |p| 2 * last_error_text(&p.reason).len() + 100) {
            let mut sql = String::new();
            noted_sql(&mut sql, outbox, chunk, status, batch.replace_positions);
            statements.push(sql);
        }
    }
}

/// `rows` in order, in chunks of at most [`ROWS_PER_STATEMENT`] rows whose `cost` adds up
/// to at most `room` (a row costing more than `room` goes alone).
fn size_chunks<T>(rows: &[T], room: usize, cost: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let c = cost(row);
        if i > start && (used + c > room || i - start == ROWS_PER_STATEMENT) {
            chunks.push(&rows[start..i]);
            (start, used) = (i, 0);
        }
        used += c;
    }
    if start < rows.len() {
        chunks.push(&rows[start..]);
    }
    chunks
}

/// The SUCCESS update of `rows`: one multi-table UPDATE joined to a derived table. With
/// `replace_positions` ([`WriteBack::replace_positions`]) SUCCESS rows take the new
/// position too.
fn success_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[Delivered],
    replace_positions: bool,
) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(sql, "UPDATE {outbox} AS o JOIN (");
    for (i, d) in rows.iter().enumerate() {
        if i == 0 {
            let _ = write!(
                sql,
                "SELECT {} AS id, {} AS kp, {} AS ko",
                d.id, d.partition, d.offset
            );
        } else {
            let _ = write!(
                sql,
                " UNION ALL SELECT {}, {}, {}",
                d.id, d.partition, d.offset
            );
        }
    }
    // No column of this SET reads another, so the multi-table UPDATE's unspecified
    // assignment order does not matter.
    let _ = write!(
        sql,
        ") AS d ON o.{} = d.id SET o.status = 'SUCCESS', o.sent_at = NOW(6), \
         o.updated_at = NOW(6), o.kafka_partition = d.kp, o.kafka_offset = d.ko, \
         o.last_error = NULL, o.next_retry_time = NULL \
         WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED'",
        outbox.names.id
    );
    sql.push_str(if replace_positions {
        ", 'SUCCESS');\n"
    } else {
        ");\n"
    });
}

/// The statuses a FAILED, parked or rejected row is written from: INIT, and with
/// `replace_positions` ([`WriteBack::replace_positions`], exactly-once) SUCCESS too: such
/// a row of a window read again was written SUCCESS before a Kafka commit that never
/// happened. What such a row keeps of its SUCCESS goes ([`UNSENT`]): its position names
/// an aborted record.
fn failable(replace_positions: bool) -> &'static str {
    if replace_positions {
        "status IN ('INIT', 'SUCCESS')"
    } else {
        "status = 'INIT'"
    }
}

/// The assignments that undo a SUCCESS (a no-op on an INIT row): see [`failable`].
const UNSENT: &str = "sent_at = NULL, kafka_partition = NULL, kafka_offset = NULL";

/// The FAILED update of `rows`: a single-table UPDATE, whose assignments MySQL evaluates
/// left to right, so `status` is computed from the `retry_count` before its increment
/// (MariaDB's SIMULTANEOUS_ASSIGNMENT mode gives the same result).
fn failed_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[DeliveryFailure],
    replace_positions: bool,
) {
    if rows.is_empty() {
        return;
    }
    let (mut errors, mut delays) = failure_cases(&outbox.names.id, rows.iter());
    let mut ids = String::new();
    for (i, f) in rows.iter().enumerate() {
        if i > 0 {
            ids.push_str(", ");
        }
        let _ = write!(ids, "{}", f.id);
    }
    errors.push_str(" END");
    delays.push_str(" END");
    let _ = writeln!(
        sql,
        "UPDATE {outbox} SET \
         status = CASE WHEN retry_count + 1 >= max_retry_count THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END, \
         retry_count = retry_count + 1, \
         last_error = {errors}, \
         next_retry_time = LEAST(NOW(6) + INTERVAL ({delays}) * 1000 MICROSECOND, \
         TIMESTAMP'2038-01-19 03:14:07'), \
         updated_at = NOW(6), {UNSENT} \
         WHERE {} IN ({ids}) AND {};",
        outbox.names.id,
        failable(replace_positions)
    );
}

/// `CASE <id> WHEN … THEN …` (without `END`) of each failure's `last_error` text and of its
/// retry delay in milliseconds; `id` is the quoted row id column.
pub(crate) fn failure_cases<'a>(
    id: &str,
    failures: impl Iterator<Item = &'a DeliveryFailure>,
) -> (String, String) {
    let mut errors = format!("CASE {id}");
    let mut delays = format!("CASE {id}");
    for f in failures {
        let _ = write!(
            errors,
            " WHEN {} THEN {}",
            f.id,
            sql_string(&last_error_text(&f.error))
        );
        let _ = write!(delays, " WHEN {} THEN {}", f.id, delay_ms(f.retry_delay));
    }
    (errors, delays)
}

/// Rows parked behind an earlier event of their key (FAILED) or rejected
/// (MANUAL_REQUIRED): due now, `retry_count` kept, with the reason; from the statuses of
/// [`failable`].
fn noted_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[ParkedEvent],
    status: &str,
    replace_positions: bool,
) {
    if rows.is_empty() {
        return;
    }
    let reasons = reason_case(&outbox.names.id, rows.iter());
    let ids = rows
        .iter()
        .map(|p| p.id.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        sql,
        "UPDATE {outbox} SET status = '{status}', next_retry_time = NOW(6), \
         last_error = {reasons}, updated_at = NOW(6), {UNSENT} \
         WHERE {} IN ({ids}) AND {};",
        outbox.names.id,
        failable(replace_positions)
    );
}

/// `CASE <id> WHEN 1 THEN '<reason>' … END`: each row's reason for `last_error`; `id` is
/// the quoted row id column.
pub(crate) fn reason_case<'a>(id: &str, rows: impl Iterator<Item = &'a ParkedEvent>) -> String {
    let mut reasons = format!("CASE {id}");
    for p in rows {
        let reason = sql_string(&last_error_text(&p.reason));
        let _ = write!(reasons, " WHEN {} THEN {reason}", p.id);
    }
    reasons.push_str(" END");
    reasons
}

/// The checkpoint upsert: inserts the row, or moves it forward — never backward — by
/// (file, offset). `updated_at` is assigned first, while `position` is still the old one.
/// The row names `server`, the server the position was read from.
pub(crate) fn checkpoint_sql(
    table: &str,
    pipeline: &str,
    position: &BinlogPosition,
    server: &ServerIdentity,
) -> String {
    let text = StoredCheckpoint::text(position, server);
    let (file, offset) = (position.file.as_str(), position.offset);
    // The stored coordinate is before any `;server…` suffix.
    let stored = "SUBSTRING_INDEX(position, ';', 1)";
    let newer = format!(
        "(position NOT LIKE 'binlog:%' OR ({file}, {offset}) >= \
         (SUBSTRING_INDEX(SUBSTRING_INDEX({stored}, ':', 2), ':', -1), \
         CAST(SUBSTRING_INDEX(SUBSTRING_INDEX({stored}, ':', 3), ':', -1) AS UNSIGNED)))",
        file = hex_literal(file.as_bytes()),
    );
    let value = sql_string(&text);
    format!(
        "INSERT INTO {table} (pipeline, position, updated_at) VALUES ({pipeline}, {value}, NOW(6)) \
         ON DUPLICATE KEY UPDATE updated_at = IF({newer}, NOW(6), updated_at), \
         position = IF({newer}, {value}, position)",
        pipeline = sql_string(pipeline),
    )
}

pub(crate) use outboxd_connector_kit::retry::delay_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// outboxd's own table `name`.
    fn table(name: &str) -> OutboxTable {
        OutboxTable::new(name, &outboxd_connector::OutboxLayout::default())
    }

    #[test]
    fn success_is_one_statement_for_the_batch() {
        let mut sql = String::new();
        let rows: Vec<Delivered> = (1..=3)
            .map(|id| Delivered {
                table: 0,
                id,
                partition: 0,
                offset: id * 10,
            })
            .collect();
        success_sql(&mut sql, &table("outbox"), &rows, false);
        assert_eq!(sql.matches("UPDATE").count(), 1, "{sql}");
        assert!(sql.contains("SELECT 1 AS id, 0 AS kp, 10 AS ko UNION ALL SELECT 2, 0, 20"));
        assert!(sql.contains("WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED');"));
        // Exactly-once's resent rows: SUCCESS ones take the new position too.
        let mut again = String::new();
        success_sql(&mut again, &table("outbox"), &rows, true);
        assert!(
            again.contains("WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED', 'SUCCESS');")
        );
    }

    #[test]
    fn failures_carry_their_errors_as_hex() {
        let mut sql = String::new();
        let rows = [DeliveryFailure {
            table: 0,
            id: 7,
            error: "it's broken; DROP TABLE x".into(),
            retry_delay: Duration::from_millis(1500),
        }];
        failed_sql(&mut sql, &table("outbox"), &rows, false);
        assert!(!sql.contains("it's"), "{sql}");
        assert!(sql.contains("WHEN 7 THEN 1500"), "{sql}");
        assert!(sql.contains("WHERE `id` IN (7) AND status = 'INIT'"));
        // status before retry_count: evaluated left to right.
        assert!(
            sql.find("status = CASE").unwrap() < sql.find("retry_count = retry_count + 1").unwrap()
        );
    }

    fn parked(n: i64, key: &str) -> Vec<ParkedEvent> {
        (1..=n)
            .map(|id| ParkedEvent {
                table: 0,
                id,
                reason: format!("parked: an earlier event of biz_key `{key}` is not delivered yet"),
            })
            .collect()
    }

    #[test]
    fn a_small_write_back_is_one_text() {
        let rows = parked(3, "k");
        let position = checkpoint_position();
        let batch = WriteBack {
            parked: &rows,
            checkpoint: Some(&position),
            ..WriteBack::default()
        };
        let texts = write_back_texts(
            &batch,
            &[table("outbox")],
            "`cp`",
            "p",
            &SERVER,
            Some(("outboxd:p", 42)),
            1 << 20,
        )
        .unwrap();
        assert_eq!(texts.len(), 1);
        assert!(texts[0].starts_with("START TRANSACTION;\n"));
        assert!(texts[0].ends_with("COMMIT"));
        assert!(texts[0].contains("WHERE `id` IN (1, 2, 3) AND status = 'INIT'"));
        // The lock fence is the last statement before COMMIT.
        let fence = texts[0].find("IS_USED_LOCK(").unwrap();
        assert!(fence > texts[0].find("INSERT INTO `cp`").unwrap());
        assert!(texts[0][fence..].contains(", 42) <> 42) AS outboxd_lock_fence;\nCOMMIT"));
    }

    /// The checkpoint of the write-back texts below.
    fn checkpoint_position() -> Position {
        BinlogPosition {
            file: "mariadb-bin.000002".into(),
            offset: 99,
            gtid_set: None,
        }
        .position()
    }

    /// Several outbox tables: each row's statement names its own table (ids repeat across
    /// tables), all in one transaction before the checkpoint.
    #[test]
    fn each_tables_rows_are_written_to_that_table() {
        let delivered = [
            Delivered {
                table: 1,
                id: 7,
                partition: 0,
                offset: 70,
            },
            Delivered {
                table: 0,
                id: 7,
                partition: 0,
                offset: 71,
            },
        ];
        let position = checkpoint_position();
        let batch = WriteBack {
            delivered: &delivered,
            checkpoint: Some(&position),
            ..WriteBack::default()
        };
        let tables = [table("a.outbox"), table("b.outbox")];
        let texts = write_back_texts(&batch, &tables, "`cp`", "p", &SERVER, None, 1 << 20).unwrap();
        assert_eq!(texts.len(), 1);
        let text = &texts[0];
        let a = text.find("UPDATE `a`.`outbox` AS o JOIN (SELECT 7 AS id, 0 AS kp, 71 AS ko)");
        let b = text.find("UPDATE `b`.`outbox` AS o JOIN (SELECT 7 AS id, 0 AS kp, 70 AS ko)");
        let checkpoint = text.find("INSERT INTO `cp`");
        assert!(a.is_some() && b.is_some(), "{text}");
        assert!(a < b && b < checkpoint, "{text}");
        // A row of a table the pipeline does not have is refused, never written elsewhere.
        let stray = [Delivered {
            table: 2,
            ..delivered[0].clone()
        }];
        let batch = WriteBack {
            delivered: &stray,
            ..WriteBack::default()
        };
        let err = write_back_texts(&batch, &tables, "`cp`", "p", &SERVER, None, 1 << 20);
        assert!(err.is_err());
    }

    #[test]
    fn a_write_back_over_the_packet_limit_is_cut_into_texts_under_it() {
        let limit = 64 * 1024;
        let rows = parked(20_000, "order-7");
        let failed: Vec<DeliveryFailure> = (30_001..30_050)
            .map(|id| DeliveryFailure {
                table: 0,
                id,
                error: "x".repeat(3000),
                retry_delay: Duration::from_secs(1),
            })
            .collect();
        let delivered: Vec<Delivered> = (40_001..52_000)
            .map(|id| Delivered {
                table: 0,
                id,
                partition: 1,
                offset: id,
            })
            .collect();
        let position = checkpoint_position();
        let batch = WriteBack {
            delivered: &delivered,
            failed: &failed,
            parked: &rows,
            rejected: &[],
            checkpoint: Some(&position),
            replace_positions: false,
        };
        let texts = write_back_texts(
            &batch,
            &[table("outbox")],
            "`cp`",
            "p",
            &SERVER,
            None,
            limit,
        )
        .unwrap();
        assert!(texts.len() > 10, "{} texts", texts.len());
        for text in &texts {
            assert!(text.len() <= limit, "{} > {limit}", text.len());
        }
        let all = texts.concat();
        assert!(all.starts_with("START TRANSACTION;\n"));
        assert_eq!(all.matches("START TRANSACTION").count(), 1);
        assert_eq!(all.matches("COMMIT").count(), 1);
        assert!(all.ends_with("COMMIT"));
        // Every row in exactly one statement, and the checkpoint last before COMMIT.
        let ids = |kind: &str| -> usize {
            all.split(";\n")
                .filter(|s| s.contains(kind))
                .map(|s| s.matches(" THEN CONVERT(").count())
                .sum()
        };
        assert_eq!(
            ids("status = 'FAILED', next_retry_time = NOW(6)"),
            rows.len()
        );
        assert_eq!(ids("'MANUAL_REQUIRED'"), failed.len());
        assert_eq!(
            all.matches("UNION ALL SELECT").count() + all.matches(" AS kp, ").count(),
            delivered.len()
        );
        let checkpoint = all.find("INSERT INTO `cp`").unwrap();
        assert!(
            all[checkpoint..].find(";\n").unwrap() + checkpoint + 2 == all.len() - "COMMIT".len()
        );

        // A single row's statement over the limit cannot be cut: definite, names the fix.
        let err = write_back_texts(&batch, &[table("outbox")], "`cp`", "p", &SERVER, None, 4096)
            .unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message().contains("raise max_allowed_packet"), "{err}");
    }

    const SERVER: ServerIdentity = ServerIdentity::MariaDb {
        server_id: 1,
        domain: 0,
    };

    #[test]
    fn checkpoint_upsert_compares_file_and_offset() {
        let position: BinlogPosition = "binlog:mariadb-bin.000002:1234:0-1-9".parse().unwrap();
        let server = ServerIdentity::MariaDb {
            server_id: 1,
            domain: 0,
        };
        let sql = checkpoint_sql("`outboxd_checkpoint`", "orders", &position, &server);
        assert!(sql.contains(&hex_literal(b"mariadb-bin.000002")), "{sql}");
        let text = "binlog:mariadb-bin.000002:1234:0-1-9;server_id=1;domain=0";
        assert!(sql.contains(&sql_string(text)), "{sql}");
        assert!(sql.contains("SUBSTRING_INDEX(position, ';', 1)"), "{sql}");
        assert!(sql.contains(", 1234) >= ("), "{sql}");
        assert!(sql.find("updated_at = IF").unwrap() < sql.find("position = IF").unwrap());
    }
}
