//! The PostgreSQL [`OutboxStore`]: status write-back, the checkpoint row, and the claims,
//! write-backs and reaper of the retry worker and of poll mode.
//!
//! Every write-back is one transaction whose statements each cover the whole batch
//! through `unnest` of arrays, pipelined on one connection. The SUCCESS update changes no
//! indexed column of the shipped schema (`next_retry_time` stays NULL for a row that never
//! failed), so PostgreSQL can do it as a HOT update.
//!
//! Invariant kept by every statement here and in [`operator`]: a row in FAILED,
//! PROCESSING or MANUAL_REQUIRED has `next_retry_time` set, so the partial indexes
//! `WHERE next_retry_time IS NOT NULL` hold exactly the rows "in trouble" and serve the
//! retry schedule, the reaper, strict ordering and `blocked_keys`, however many SUCCESS
//! rows the table holds. (A MANUAL_REQUIRED row keeps the `next_retry_time` of its last
//! failure; it is never claimed, its status says so.)
//!
//! `write_back.rs` holds the write-back and its visibility wait; `claims.rs` the claims,
//! the claimed write-back, the reaper, the retry schedule, the blocked keys and
//! `recover`'s scan of INIT rows; `sql.rs`
//! the statement texts and how their rows are read; `checkpoint.rs` the checkpoint row's
//! parsing. The operator's actions live in [`operator`]. Claimed rows become events through
//! the connector kit's row conversion, as on the log path.

mod browse;
mod checkpoint;
mod claims;
pub mod inbox;
mod inbox_operator;
mod inbox_verify;
pub mod operator;
mod own_rows;
mod sql;
mod write_back;

use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;

use outboxd_connector::{
    ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, NewOutboxRow, OutboxEvent,
    OutboxStore, OwnRowState, OwnRowsToDelete, Position, ReapPolicy, ReapReport, RetrySchedule,
    RowId, TransactionEnd, WriteBack,
};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row, Statement};

use crate::client::classify_pg_error;
use crate::schema::{qualified, quote_ident};
use outboxd_connector_kit::columns::RowNames;
use outboxd_connector_kit::row;
use outboxd_connector_kit::store as kit_store;
use outboxd_connector_kit::tables;

use crate::log::identity::SystemIdentity;
use crate::PostgresConnector;
pub(crate) use checkpoint::{parse_checkpoint, parse_stored_checkpoint};
pub(crate) use sql::RowColumns;
use sql::{Sql, SqlRow};

/// The SQL side of one PostgreSQL pipeline.
///
/// Holds one connection; when it breaks, the failing call returns a transient error and
/// the next call reconnects (and prepares the statements again).
#[derive(Debug)]
pub struct PgOutboxStore {
    pub(crate) connector: PostgresConnector,
    conn: Mutex<Option<Conn>>,
    /// The outbox table the next claim starts from (several tables take turns).
    next_claim_table: AtomicUsize,
}

/// The live connection and its prepared statements.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// The cluster connected to, stored with every checkpoint.
    pub(crate) system: SystemIdentity,
    checkpoint: Statement,
    load_checkpoint: Statement,
    /// One per outbox table, in the layout's order: an event's `table` indexes it.
    outboxes: Vec<OutboxConn>,
    /// Set while a write-back's transaction is open. A write-back whose future is dropped
    /// half-way (or whose `ROLLBACK` failed) leaves it set, and [`PgOutboxStore::lock`]
    /// then replaces the connection instead of running the next operation inside that
    /// transaction.
    pub(crate) transaction_open: bool,
}

impl Conn {
    /// Whether the (first) outbox table's payload column is `bytea`.
    pub(crate) fn payload_bytea(&self) -> bool {
        self.outboxes.first().is_some_and(|o| o.shape.payload_bytea)
    }
}

/// The statements of one outbox table.
#[derive(Debug)]
pub(crate) struct OutboxConn {
    /// The table as configured, for messages.
    name: String,
    /// How the event columns are read (bytea or text key and payload).
    pub(crate) shape: RowShape,
    /// The statement texts (for `recover`'s scan and for EXPLAIN).
    sql: Sql,
    /// The statements on the outbox's rows; `None` with `outbox.rows = "deleted"`, whose
    /// table has no status columns (and no rows to address).
    rows: Option<RowStatements>,
}

/// The prepared statements that read and write outbox rows.
#[derive(Debug)]
struct RowStatements {
    success: Statement,
    /// [`Sql::success_and_checkpoint`].
    success_and_checkpoint: Statement,
    failed: Statement,
    parked: Statement,
    exists: Statement,
    /// Indexed by `[poll as usize][strict as usize]`.
    claim: [[Statement; 2]; 2],
    complete_success: Statement,
    complete_failed: Statement,
    complete_released: Statement,
    reap: Statement,
    schedule: Statement,
    blocked_all: Statement,
    blocked_some: Statement,
}

impl Conn {
    /// The first outbox table: the operator's, whose commands act on one table
    /// (`OutboxLayout::for_table`).
    pub(crate) fn first(&self) -> Result<&OutboxConn, ConnectorError> {
        self.outbox(0)
    }

    /// The outbox table of index `table`.
    pub(crate) fn outbox(&self, table: u16) -> Result<&OutboxConn, ConnectorError> {
        self.outboxes
            .get(usize::from(table))
            .ok_or_else(|| tables::unknown_table(table, self.outboxes.len()))
    }

    /// A definite error unless the rows carry their status (`outbox.rows = "kept"`).
    fn carry_status(&self) -> Result<(), ConnectorError> {
        for outbox in &self.outboxes {
            outbox.rows()?;
        }
        Ok(())
    }

    /// Each outbox table's row statements, or the definite error of a store whose rows
    /// carry no status.
    fn all_rows(&self) -> Result<impl Iterator<Item = (u16, &RowStatements)>, ConnectorError> {
        self.carry_status()?;
        Ok((0u16..)
            .zip(&self.outboxes)
            .filter_map(|(i, o)| Some((i, o.rows.as_ref()?))))
    }
}

impl OutboxConn {
    /// `SELECT <event columns> FROM <table> o` (no WHERE), for `recover`'s scan.
    pub(crate) fn event_select(&self) -> &str {
        &self.sql.event_select
    }

    /// The columns the statements name (mapped by `outbox.columns`).
    pub(crate) fn names(&self) -> &RowColumns {
        &self.sql.names
    }

    /// One row of [`OutboxConn::event_select`] (or a claim's) as an event, exactly as the
    /// replication stream builds it (without a commit time).
    pub(crate) fn event(&self, row: &Row) -> Result<OutboxEvent, ConnectorError> {
        let map = &self.sql.names.map;
        let source = SqlRow {
            row,
            shape: self.shape,
            map,
        };
        row::event_from_select(&source, map, &self.name)
    }

    /// The row statements, or the definite error of a store whose rows carry no status.
    fn rows(&self) -> Result<&RowStatements, ConnectorError> {
        self.rows
            .as_ref()
            .ok_or_else(kit_store::rows_carry_no_status)
    }
}

/// Whether the key and payload columns are `bytea` (read as raw bytes) or text-like
/// (read as their text output, as the replication stream does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RowShape {
    key_bytea: bool,
    payload_bytea: bool,
}

/// The connection, locked for one operation (see [`PgOutboxStore::lock`]).
pub(crate) struct Locked<'a>(MutexGuard<'a, Option<Conn>>);

impl Locked<'_> {
    /// The connection; always present once [`PgOutboxStore::lock`] returned.
    pub(crate) fn conn(&mut self) -> Result<&mut Conn, ConnectorError> {
        self.0
            .as_mut()
            .ok_or_else(|| ConnectorError::transient("no PostgreSQL connection"))
    }
}

impl PgOutboxStore {
    /// Connects and prepares the statements; fails definitely when a table or column is
    /// missing (run `outboxd init`).
    pub(crate) async fn open(connector: &PostgresConnector) -> Result<Self, ConnectorError> {
        let store = Self {
            connector: connector.clone(),
            conn: Mutex::new(None),
            next_claim_table: AtomicUsize::new(0),
        };
        let conn = store.connect().await?;
        *store.conn.lock().await = Some(conn);
        Ok(store)
    }

    /// The connection for one operation, reconnecting when the previous one broke.
    pub(crate) async fn lock(&self) -> Result<Locked<'_>, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot
            .as_ref()
            .is_some_and(|c| c.client.is_closed() || c.transaction_open)
        {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        Ok(Locked(slot))
    }

    /// The columns the operator's statements name (mapped by `outbox.columns`).
    pub(crate) fn columns(&self) -> RowNames {
        RowNames::quoted(&self.connector.layout, quote_ident)
    }

    /// The outbox table as configured, for messages.
    pub(crate) fn table(&self) -> &str {
        self.connector.layout.outbox_table()
    }

    /// Maps a database error to a [`ConnectorError`] naming the table and server.
    pub(crate) fn error(&self, e: &tokio_postgres::Error, what: &str) -> ConnectorError {
        let context = format!(
            "{what} ({} on {})",
            self.connector.layout.outbox_table(),
            self.connector.endpoint()
        );
        classify_pg_error(e, &context)
    }

    async fn connect(&self) -> Result<Conn, ConnectorError> {
        let client = self.connector.sql_client().await?;
        // The checkpoint (and, after it, the slot's confirmed position) may only move once
        // the statuses are durable: with synchronous_commit = off a crash could lose a
        // committed write-back. Stronger settings (remote_apply, …) are kept.
        // DateStyle and TimeZone as on the replication connection, so a claimed row's
        // `created_at` reads exactly as the stream renders it.
        // Custom plans: a generic plan cached while the outbox table is still small (a
        // fresh table, before autovacuum's first ANALYZE) joins the write-back's `unnest`
        // to a sequential scan, and is kept as the table grows: measured, PostgreSQL's CPU
        // per event rose 2.5-fold for the whole run. Planning each statement for its
        // arrays costs far less.
        let session = format!(
            "{DURABLE_COMMITS}; SET DateStyle = ISO; SET TimeZone = 'UTC'; \
             SET plan_cache_mode = force_custom_plan"
        );
        client
            .batch_execute(&session)
            .await
            .map_err(|e| classify_pg_error(&e, "setting synchronous_commit for the write-back"))?;
        let row = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| classify_pg_error(&e, "reading the server version"))?;
        let version: i32 = get(&row, 0)?;
        let system = SystemIdentity::of(&client).await?;

        let layout = &self.connector.layout;
        let checkpoint = qualified(&layout.checkpoint_table);
        let mut outboxes = Vec::with_capacity(layout.outbox_tables.len());
        for name in &layout.outbox_tables {
            outboxes.push(
                self.prepare_outbox(&client, name, &checkpoint, version)
                    .await?,
            );
        }
        let sql = &outboxes
            .first()
            .ok_or_else(|| ConnectorError::definite("internal: a layout without outbox table"))?
            .sql;
        let (checkpoint, load_checkpoint) = futures_util::try_join!(
            self.prepare(
                &client,
                "checkpoint",
                &sql.checkpoint,
                &[Type::TEXT, Type::TEXT]
            ),
            self.prepare(
                &client,
                "checkpoint read",
                &sql.load_checkpoint,
                &[Type::TEXT]
            ),
        )?;
        Ok(Conn {
            client,
            system,
            checkpoint,
            load_checkpoint,
            outboxes,
            transaction_open: false,
        })
    }

    /// The statements of the outbox table `name` (row statements only when rows carry
    /// their status).
    async fn prepare_outbox(
        &self,
        client: &Client,
        name: &str,
        checkpoint: &str,
        version: i32,
    ) -> Result<OutboxConn, ConnectorError> {
        let layout = &self.connector.layout;
        let outbox = qualified(name);
        let key = quote_ident(&layout.key_column);
        let shape = if layout.tracks_status() {
            let payload = quote_ident(&layout.columns.payload);
            let probe = format!("SELECT o.{key}, o.{payload} FROM {outbox} o WHERE false");
            let probe = self.prepare(client, "outbox columns", &probe, &[]).await?;
            let is_bytea =
                |i: usize| probe.columns().get(i).map(|c| c.type_()) == Some(&Type::BYTEA);
            RowShape {
                key_bytea: is_bytea(0),
                payload_bytea: is_bytea(1),
            }
        } else {
            RowShape::default()
        };
        let sql = Sql::new(&outbox, checkpoint, RowColumns::of(layout, shape), version);
        let rows = match layout.tracks_status() {
            true => Some(self.prepare_rows(client, &sql).await?),
            false => None,
        };
        Ok(OutboxConn {
            name: name.to_owned(),
            shape,
            sql,
            rows,
        })
    }

    /// Prepares the statements on the outbox's rows.
    async fn prepare_rows(
        &self,
        client: &Client,
        sql: &Sql,
    ) -> Result<RowStatements, ConnectorError> {
        let int8s = Type::INT8_ARRAY;
        let texts = Type::TEXT_ARRAY;
        let statements: Vec<(&str, &str, Vec<Type>)> = vec![
            (
                "SUCCESS write-back",
                &sql.success,
                vec![int8s.clone(), Type::INT4_ARRAY, int8s.clone(), Type::BOOL],
            ),
            (
                "SUCCESS write-back with checkpoint",
                &sql.success_and_checkpoint,
                vec![
                    int8s.clone(),
                    Type::INT4_ARRAY,
                    int8s.clone(),
                    Type::BOOL,
                    Type::TEXT,
                    Type::TEXT,
                ],
            ),
            (
                "FAILED write-back",
                &sql.failed,
                vec![int8s.clone(), texts.clone(), int8s.clone(), Type::BOOL],
            ),
            (
                "parked and rejected write-back",
                &sql.parked,
                vec![int8s.clone(), texts.clone(), texts.clone(), Type::BOOL],
            ),
            ("row lookup", &sql.exists, vec![int8s.clone()]),
            ("retry claim", &sql.claim[0][0], vec![Type::INT8]),
            ("strict retry claim", &sql.claim[0][1], vec![Type::INT8]),
            ("poll claim", &sql.claim[1][0], vec![Type::INT8]),
            (
                "strict poll claim",
                &sql.claim[1][1],
                vec![Type::INT8, Type::INT8],
            ),
            (
                "claimed SUCCESS write-back",
                &sql.complete_success,
                vec![
                    int8s.clone(),
                    Type::INT4_ARRAY,
                    int8s.clone(),
                    texts.clone(),
                ],
            ),
            (
                "claimed FAILED write-back",
                &sql.complete_failed,
                vec![int8s.clone(), texts.clone(), int8s.clone(), texts.clone()],
            ),
            (
                "claim release",
                &sql.complete_released,
                vec![int8s.clone(), texts.clone(), texts.clone(), texts.clone()],
            ),
            (
                "reaper",
                &sql.reap,
                vec![Type::INT8, Type::INT8, Type::TEXT],
            ),
            ("retry schedule", &sql.schedule, vec![]),
            ("blocked keys", &sql.blocked_all, vec![]),
            ("blocked keys", &sql.blocked_some, vec![texts]),
        ];
        let prepared: Vec<Statement> = futures_util::future::try_join_all(
            statements
                .iter()
                .map(|(what, text, types)| self.prepare(client, what, text, types)),
        )
        .await?;
        let [success, success_and_checkpoint, failed, parked, exists, claim_due, claim_due_strict, claim_poll, claim_poll_strict, complete_success, complete_failed, complete_released, reap, schedule, blocked_all, blocked_some] =
            <[Statement; 16]>::try_from(prepared)
                .map_err(|_| ConnectorError::definite("internal: statement count mismatch"))?;
        Ok(RowStatements {
            success,
            success_and_checkpoint,
            failed,
            parked,
            exists,
            claim: [
                [claim_due, claim_due_strict],
                [claim_poll, claim_poll_strict],
            ],
            complete_success,
            complete_failed,
            complete_released,
            reap,
            schedule,
            blocked_all,
            blocked_some,
        })
    }

    async fn prepare(
        &self,
        client: &Client,
        what: &str,
        sql: &str,
        types: &[Type],
    ) -> Result<Statement, ConnectorError> {
        client.prepare_typed(sql, types).await.map_err(|e| {
            let context = format!(
                "preparing the {what} statement for {} / {} on {} (run `outboxd check`; \
                 `outboxd init` creates missing tables)",
                self.connector.layout.outbox_table(),
                self.connector.layout.checkpoint_table,
                self.connector.endpoint()
            );
            classify_pg_error(&e, &context)
        })
    }

    /// The plans PostgreSQL picks for the statements that must stay cheap however many
    /// SUCCESS rows the table holds (retry schedule, retry claims, blocked keys, reaper,
    /// strict poll claim), as `(name, EXPLAIN text)`. For tests and for operators who
    /// wonder; runs nothing but EXPLAIN.
    #[doc(hidden)]
    pub async fn explain_hot_statements(&self) -> Result<Vec<(String, String)>, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let keys = vec!["k".to_owned()];
        let (limit, window, ms) = (100_i64, 400_i64, 60_000_i64);
        let reason = "reaped";
        let sql = &conn.first()?.sql;
        let params: [(&str, &str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>); 6] = [
            ("retry schedule", &sql.schedule, vec![]),
            ("retry claim", &sql.claim[0][0], vec![&limit]),
            ("strict retry claim", &sql.claim[0][1], vec![&limit]),
            ("blocked keys", &sql.blocked_some, vec![&keys]),
            ("reaper", &sql.reap, vec![&ms, &ms, &reason]),
            ("strict poll claim", &sql.claim[1][1], vec![&limit, &window]),
        ];
        let mut plans = Vec::new();
        for (name, text, values) in params {
            let rows = conn
                .client
                .query(&format!("EXPLAIN {text}"), &values)
                .await
                .map_err(|e| self.error(&e, &format!("explaining the {name} statement")))?;
            let lines: Result<Vec<String>, _> = rows.iter().map(|r| get::<String>(r, 0)).collect();
            plans.push((name.to_owned(), lines?.join("\n")));
        }
        Ok(plans)
    }
}

impl OutboxStore for PgOutboxStore {
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        if kit_store::is_empty(&batch) {
            return Ok(());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // The rows split by table once, each table checked before the transaction opens.
        let parts = tables::split_write_back(&batch);
        if !parts.is_empty() {
            conn.carry_status()?;
            for part in &parts {
                conn.outbox(part.table)?;
            }
        }
        let result = Self::write_back_on(conn, &batch, &parts, &self.connector.pipeline).await;
        result.map_err(|e| {
            let what = format!(
                "writing back {} delivered, {} failed and {} parked outbox rows",
                batch.delivered.len(),
                batch.failed.len(),
                batch.parked.len(),
            );
            self.error(&e, &what)
        })
    }

    async fn load_checkpoint(&self) -> Result<Option<Position>, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let table = &self.connector.layout.checkpoint_table;
        let row = conn
            .client
            .query_opt(&conn.load_checkpoint, &[&self.connector.pipeline])
            .await
            .map_err(|e| {
                let context = format!("reading the checkpoint from {table}");
                classify_pg_error(&e, &context)
            })?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get(0).map_err(|e| {
            ConnectorError::definite(format!("reading the checkpoint from {table}")).with_source(e)
        })?;
        let checkpoint = parse_stored_checkpoint(&text, table, &self.connector.pipeline)?;
        // The stream refuses it too; this is what a session skips by.
        checkpoint.verify(&conn.system, table, &self.connector.pipeline)?;
        Ok(Some(checkpoint.position()))
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        self.claim_rows(request).await
    }

    async fn complete_claimed(&self, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
        self.complete_claimed_rows(batch).await
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        self.reap_rows(policy).await
    }

    async fn retry_schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        self.schedule().await
    }

    async fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        self.blocked(keys).await
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

    // The two below run when a session opens and while it reads transactions again, not
    // per event: plain (unprepared) statements are enough.
    async fn highest_delivered_id(&self) -> Result<Option<i64>, ConnectorError> {
        if !self.connector.layout.tracks_status() {
            return Ok(None);
        }
        // The primary key read backward: the newest rows are SUCCESS (or a backlog of INIT
        // ones, scanned once per session). The highest over every table.
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let mut highest = None;
        for outbox in &conn.outboxes {
            let id = &outbox.names().row.id;
            let sql = format!(
                "SELECT {id}::bigint FROM {} WHERE status = 'SUCCESS' ORDER BY {id} DESC LIMIT 1",
                qualified(&outbox.name)
            );
            let row = conn
                .client
                .query_opt(&sql, &[])
                .await
                .map_err(|e| self.error(&e, "reading the highest delivered row id"))?;
            highest = highest.max(row.map(|row| get::<i64>(&row, 0)).transpose()?);
        }
        Ok(highest)
    }

    async fn delivered_among(&self, rows: &[RowId]) -> Result<HashSet<RowId>, ConnectorError> {
        if !self.connector.layout.tracks_status() || rows.is_empty() {
            return Ok(HashSet::new());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let mut delivered = HashSet::new();
        for (table, ids) in tables::ids_by_table(rows) {
            let outbox = conn.outbox(table)?;
            let id = &outbox.sql.names.row.id;
            let sql = format!(
                "SELECT {id}::bigint FROM {} WHERE {id} = ANY($1::bigint[]) AND status = 'SUCCESS'",
                qualified(&outbox.name)
            );
            let found = conn
                .client
                .query(&sql, &[&ids])
                .await
                .map_err(|e| self.error(&e, "reading which rows are delivered already"))?;
            let found: Vec<i64> = found
                .iter()
                .map(|row| get::<i64>(row, 0))
                .collect::<Result<_, _>>()?;
            delivered.extend(tables::rows_of(table, found));
        }
        Ok(delivered)
    }
}

/// The session setup of both stores' connections (outbox and inbox): a commit returns
/// only once it is durable. A server, database or role default of
/// `synchronous_commit = off` is raised to `on` for the session; the stronger settings
/// (`local`, `remote_write`, `on`, `remote_apply`) are the administrator's and are kept.
/// A transaction's `SET LOCAL` still overrides it for that transaction alone.
pub(crate) const DURABLE_COMMITS: &str =
    "DO $$ BEGIN IF current_setting('synchronous_commit') = 'off' THEN \
     PERFORM set_config('synchronous_commit', 'on', false); END IF; END $$";

/// A column of a row we selected ourselves; a mismatch is a definite error.
pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    at: usize,
) -> Result<T, ConnectorError> {
    row.try_get(at).map_err(|e| {
        ConnectorError::definite(format!("unexpected answer from PostgreSQL (column {at})"))
            .with_source(e)
    })
}

pub(crate) use outboxd_connector_kit::retry::delay_ms;
