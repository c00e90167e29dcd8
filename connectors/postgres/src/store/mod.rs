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
//! The operator's actions live in [`operator`]. Claimed rows become events through the
//! connector kit's row conversion, as on the log path.

pub mod inbox;
mod inbox_operator;
pub mod operator;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use outboxd_connector::{
    last_error_text, ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack,
    ConnectorError, OutboxEvent, OutboxLayout, OutboxStore, ParkedEvent, Position, ReapPolicy,
    ReapReport, RetrySchedule, RowId, WriteBack,
};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row, Statement};

use crate::client::classify_pg_error;
use crate::schema::{qualified, quote_ident};
use outboxd_connector_kit::columns::RowNames;
use outboxd_connector_kit::store as kit_store;
use outboxd_connector_kit::tables;
use outboxd_connector_kit::{columns, row, status, ColumnMap, Field, RowSource, Value};

use crate::log::decode::iso8601;
use crate::log::identity::{StoredCheckpoint, SystemIdentity};
use crate::PostgresConnector;

/// In strict poll mode, the window of INIT rows looked at per claim, as a multiple of
/// the claim's limit: rows locked by a concurrent claimer are skipped, and the window
/// leaves room for the next ones.
const POLL_WINDOW_FACTOR: i64 = 4;

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
    transaction_open: bool,
}

/// The statements of one outbox table.
#[derive(Debug)]
pub(crate) struct OutboxConn {
    /// The table as configured, for messages.
    name: String,
    /// How the event columns are read (bytea or text key and payload).
    pub(crate) shape: RowShape,
    /// The statement texts (for the operator's scans and for EXPLAIN).
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
    /// `SELECT <event columns> FROM <table> o` (no WHERE), for the operator's scans.
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

    /// One write-back transaction: the rows' statuses (when the batch has any) and the
    /// checkpoint row.
    ///
    /// `BEGIN`, every table's status updates and the checkpoint upsert go to the server
    /// together, in one round trip: tokio-postgres sends a request when its future is first
    /// polled, and `try_join` polls `BEGIN` before the rest. Then, only when some row was not
    /// updated, the visibility wait; then `COMMIT`. Writing the checkpoint before that wait
    /// is safe: nothing of the transaction is visible before `COMMIT`, and the wait ends
    /// (rows found, or taken as deleted) before it. Two round trips instead of four: the
    /// write-back runs every `writeback_interval`, so each one costs CPU and latency.
    async fn write_back_on(
        conn: &mut Conn,
        batch: &WriteBack<'_>,
        parts: &[tables::TableWriteBack<'_>],
        pipeline: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let position = batch
            .checkpoint
            .map(|p| StoredCheckpoint::text(p, &conn.system));
        // Each table's rows (the caller checked the tables).
        let tables: Vec<(&RowStatements, WriteBackRows)> = parts
            .iter()
            .filter_map(|part| {
                let statements = conn.outboxes.get(usize::from(part.table))?.rows.as_ref()?;
                Some((statements, WriteBackRows::new(&part.rows())))
            })
            .collect();
        if Self::write_back_at_once(conn, &tables, position.as_deref(), pipeline).await? {
            return Ok(());
        }
        conn.transaction_open = true;
        let client = &conn.client;
        let written = async {
            let updates = futures_util::future::try_join_all(
                tables
                    .iter()
                    .map(|(statements, rows)| rows.apply(client, statements.updates())),
            );
            let checkpoint = async {
                match &position {
                    Some(position) => client
                        .execute(&conn.checkpoint, &[&pipeline, position])
                        .await
                        .map(drop),
                    None => Ok(()),
                }
            };
            let ((), (updated, ())) = futures_util::try_join!(
                client.batch_execute("BEGIN"),
                futures_util::future::try_join(updates, checkpoint),
            )?;
            for ((statements, rows), updated) in tables.iter().zip(updated) {
                Self::await_visibility(client, statements, rows, &updated).await?;
            }
            client.batch_execute("COMMIT").await
        };
        match written.await {
            Ok(()) => {
                conn.transaction_open = false;
                Ok(())
            }
            Err(e) => {
                // A failed statement aborted the transaction; end it here so the
                // connection stays usable (when this fails too, `lock` replaces it).
                if conn.client.batch_execute("ROLLBACK").await.is_ok() {
                    conn.transaction_open = false;
                }
                Err(e)
            }
        }
    }

    /// The common write-backs in one statement that commits on its own, one round trip
    /// instead of two: only a checkpoint, or one table's SUCCESS rows with the checkpoint
    /// (written only when every row was updated). Returns whether it wrote the whole
    /// batch; when not (other kinds of rows, several tables, or a row the statement did
    /// not update), [`Self::write_back_on`]'s transaction writes it, the rows already
    /// SUCCESS matching no status predicate there. At a steady rate the write-back runs
    /// every `writeback_interval` and is mostly this case, so the round trip saved is a
    /// round of wake-ups of the relay and of the server each time.
    async fn write_back_at_once(
        conn: &Conn,
        tables: &[(&RowStatements, WriteBackRows)],
        position: Option<&str>,
        pipeline: &str,
    ) -> Result<bool, tokio_postgres::Error> {
        let Some(position) = position else {
            return Ok(false);
        };
        match tables {
            [] => {
                conn.client
                    .execute(&conn.checkpoint, &[&pipeline, &position])
                    .await?;
                Ok(true)
            }
            [(statements, rows)] if rows.only_delivered() => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                    &rows.d_ids,
                    &rows.d_parts,
                    &rows.d_offsets,
                    &rows.replace_positions,
                    &pipeline,
                    &position,
                ];
                let row = conn
                    .client
                    .query_one(&statements.success_and_checkpoint, &params)
                    .await?;
                row.try_get(0)
            }
            _ => Ok(false),
        }
    }

    /// Waits, in the open write-back transaction, until the rows of `rows` that were not
    /// `updated` are visible, and writes their statuses.
    async fn await_visibility(
        client: &Client,
        statements: &RowStatements,
        rows: &WriteBackRows,
        updated: &HashSet<i64>,
    ) -> Result<(), tokio_postgres::Error> {
        // A row not updated is either past the status this batch writes (a replay after a
        // crash: fine) or not visible yet: PostgreSQL flushes a commit record, which the
        // walsender may decode and send at once, a moment before the committing session
        // makes the transaction visible to others. The checkpoint must not pass a row
        // whose status was not written, so wait (briefly) until every row is visible.
        // With a synchronous standby that moment lasts until the standby confirms the
        // commit (or the committing session gives up waiting): while any session waits
        // for that (`wait_event = 'SyncRep'`), a missing row may be one of its rows, so
        // the wait goes on for as long as that lasts; only then is a missing row taken
        // as deleted.
        let mut missing: Vec<i64> = rows
            .ids()
            .filter(|id| !updated.contains(id))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let started = Instant::now();
        let mut deadline = started + VISIBILITY_WAIT;
        let mut pause = Duration::from_millis(2);
        let mut told = started;
        while !missing.is_empty() {
            let found = client.query(&statements.exists, &[&missing]).await?;
            let found: HashSet<i64> = found
                .iter()
                .map(|row| row.try_get::<_, i64>(0))
                .collect::<Result<_, _>>()?;
            if !found.is_empty() {
                // Replayed rows match no status predicate: a no-op for them.
                rows.only(&found)
                    .apply(client, statements.updates())
                    .await?;
                missing.retain(|id| !found.contains(id));
            }
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                if !commit_waits_for_a_standby(client).await? {
                    break;
                }
                deadline = Instant::now() + VISIBILITY_WAIT;
                if told.elapsed() >= Duration::from_secs(10) || told == started {
                    told = Instant::now();
                    tracing::warn!(
                        rows = missing.len(),
                        waiting = ?started.elapsed(),
                        "write-back: outbox rows not visible yet while a commit waits for a \
                         synchronous standby; the log position is held until they are"
                    );
                }
            }
            tracing::debug!(
                rows = missing.len(),
                "write-back: outbox rows not visible yet (their commit was decoded first); waiting"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        if !missing.is_empty() {
            tracing::warn!(
                ids = ?missing,
                "write-back: outbox rows published but not found in the table (deleted?); \
                 their status is not written"
            );
        }
        Ok(())
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

    async fn claim_on(
        client: &mut Client,
        statements: &RowStatements,
        request: ClaimRequest,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let poll = request.scope == ClaimScope::NewAndDueFailed;
        let statement = &statements.claim[usize::from(poll)][usize::from(request.strict_order)];
        let tx = client.transaction().await?;
        let rows = if poll && request.strict_order {
            let window = limit.saturating_mul(POLL_WINDOW_FACTOR);
            tx.query(statement, &[&limit, &window]).await?
        } else {
            tx.query(statement, &[&limit]).await?
        };
        tx.commit().await?;
        Ok(rows)
    }

    /// The claimed write-back of one table's rows, in transaction `tx`.
    async fn complete_on(
        tx: &tokio_postgres::Transaction<'_>,
        statements: &RowStatements,
        batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        let d = batch.delivered;
        let d_ids: Vec<i64> = d.iter().map(|(x, _)| x.id).collect();
        let d_parts: Vec<i32> = d.iter().map(|(x, _)| x.partition).collect();
        let d_offsets: Vec<i64> = d.iter().map(|(x, _)| x.offset).collect();
        let d_tokens: Vec<&str> = d.iter().map(|(_, t)| t.0.as_str()).collect();
        let f = batch.failed;
        let f_ids: Vec<i64> = f.iter().map(|(x, _)| x.id).collect();
        let f_errors: Vec<String> = f.iter().map(|(x, _)| last_error_text(&x.error)).collect();
        let f_delays: Vec<i64> = f.iter().map(|(x, _)| delay_ms(x.retry_delay)).collect();
        let f_tokens: Vec<&str> = f.iter().map(|(_, t)| t.0.as_str()).collect();
        let r: Vec<(&ParkedEvent, &ClaimToken, &str)> = (batch.released.iter())
            .map(|(x, t)| (x, t, status::FAILED))
            .chain((batch.rejected.iter()).map(|(x, t)| (x, t, status::MANUAL_REQUIRED)))
            .collect();
        let r_ids: Vec<i64> = r.iter().map(|(x, _, _)| x.id).collect();
        let r_reasons: Vec<String> = r
            .iter()
            .map(|(x, _, _)| last_error_text(&x.reason))
            .collect();
        let r_tokens: Vec<&str> = r.iter().map(|(_, t, _)| t.0.as_str()).collect();
        let r_statuses: Vec<&str> = r.iter().map(|(_, _, s)| *s).collect();

        let success = async {
            if d_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_success,
                &[&d_ids, &d_parts, &d_offsets, &d_tokens],
            )
            .await
        };
        let fail = async {
            if f_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_failed,
                &[&f_ids, &f_errors, &f_delays, &f_tokens],
            )
            .await
        };
        let release = async {
            if r_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_released,
                &[&r_ids, &r_reasons, &r_tokens, &r_statuses],
            )
            .await
        };
        let (s, f, r) = futures_util::try_join!(success, fail, release)?;
        Ok(s + f + r)
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
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.carry_status()?;
        // Each table in turn, from the one after the last claim's first, while the claim
        // has room: with several tables, a backlog in one does not starve the others.
        let count = conn.outboxes.len();
        let start = self.next_claim_table.fetch_add(1, AtomicOrdering::Relaxed) % count;
        let mut claimed = Vec::new();
        for index in (start..count).chain(0..start) {
            let room = request.limit.saturating_sub(claimed.len());
            if room == 0 {
                break;
            }
            let Conn {
                client, outboxes, ..
            } = &mut *conn;
            let outbox = &outboxes[index];
            let Some(statements) = outbox.rows.as_ref() else {
                continue;
            };
            let request = ClaimRequest {
                limit: room,
                ..request
            };
            let rows = Self::claim_on(client, statements, request)
                .await
                .map_err(|e| self.error(&e, &format!("claiming rows of {}", outbox.name)))?;
            let mut part = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut event = outbox.event(row)?;
                event.table = u16::try_from(index).unwrap_or(u16::MAX);
                let token: String = get(row, outbox.sql.names.map.field_count())?;
                part.push(ClaimedEvent {
                    event,
                    claim_token: ClaimToken(token),
                });
            }
            // UPDATE … RETURNING has no order; callers publish a table's rows in id order.
            part.sort_by_key(|c| c.event.id);
            claimed.append(&mut part);
        }
        Ok(claimed)
    }

    async fn complete_claimed(&self, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.carry_status()?;
        let parts = tables::split_claimed(&batch);
        for part in &parts {
            conn.outbox(part.table)?;
        }
        let written = async {
            let tx = conn.client.transaction().await?;
            let mut updated = 0;
            for part in &parts {
                if let Some(statements) = conn.outboxes[usize::from(part.table)].rows.as_ref() {
                    updated += Self::complete_on(&tx, statements, part.rows()).await?;
                }
            }
            tx.commit().await?;
            Ok(updated)
        };
        written
            .await
            .map_err(|e| self.error(&e, &format!("writing back {}", batch.describe())))
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let reason = policy.reaped_reason();
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let timeout = delay_ms(policy.claim_timeout);
        let delay = delay_ms(policy.retry_delay);
        let mut report = ReapReport::default();
        for (_, statements) in conn.all_rows()? {
            let rows = conn
                .client
                .query(&statements.reap, &[&timeout, &delay, &reason])
                .await
                .map_err(|e| self.error(&e, "returning expired claims to FAILED"))?;
            for row in &rows {
                let status: String = get(row, 0)?;
                if status == "MANUAL_REQUIRED" {
                    report.manual_required += 1;
                } else {
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    async fn retry_schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // The earliest of every table's.
        let earliest = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut schedule = RetrySchedule::default();
        for (_, statements) in conn.all_rows()? {
            let row = conn
                .client
                .query_one(&statements.schedule, &[])
                .await
                .map_err(|e| self.error(&e, "reading the retry schedule"))?;
            schedule.next_due = earliest(schedule.next_due, get(&row, 0)?);
            schedule.oldest_claim = earliest(schedule.oldest_claim, get(&row, 1)?);
        }
        Ok(schedule)
    }

    async fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        if keys.is_some_and(<[String]>::is_empty) || !self.connector.layout.tracks_status() {
            return Ok(HashSet::new());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // A key in trouble in any table is held back: the record key is the same key
        // whatever the table.
        let mut blocked = HashSet::new();
        for (_, statements) in conn.all_rows()? {
            let rows = match keys {
                Some(keys) => conn.client.query(&statements.blocked_some, &[&keys]).await,
                None => conn.client.query(&statements.blocked_all, &[]).await,
            }
            .map_err(|e| self.error(&e, "reading the keys held back by failed rows"))?;
            for row in &rows {
                blocked.insert(get::<String>(row, 0)?);
            }
        }
        Ok(blocked)
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

/// How long a write-back waits for the rows of a just-decoded commit to become visible
/// (longer while a commit waits for a synchronous standby).
const VISIBILITY_WAIT: Duration = Duration::from_secs(2);

/// Whether a session's commit is waiting for a synchronous standby to confirm it: its
/// rows are in the log but not yet visible. Only commits issued before this write-back
/// began count (`now()` is the transaction's start): a commit decoded already was issued
/// before, and later ones on a busy cluster must not keep the wait going. Needs
/// `pg_monitor` (or superuser) to see other roles' sessions; without it, none is seen and
/// a missing row is taken as deleted after [`VISIBILITY_WAIT`], as before.
async fn commit_waits_for_a_standby(client: &Client) -> Result<bool, tokio_postgres::Error> {
    // Inside a transaction pg_stat_activity is read once and kept: read it afresh.
    client
        .execute("SELECT pg_stat_clear_snapshot()", &[])
        .await?;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE wait_event = 'SyncRep' AND query_start <= now())",
            &[],
        )
        .await?;
    row.try_get(0)
}

/// One write-back's rows as the statements' arrays.
#[derive(Clone, Default)]
struct WriteBackRows {
    d_ids: Vec<i64>,
    /// [`WriteBack::replace_positions`].
    replace_positions: bool,
    d_parts: Vec<i32>,
    d_offsets: Vec<i64>,
    f_ids: Vec<i64>,
    f_errors: Vec<String>,
    f_delays: Vec<i64>,
    p_ids: Vec<i64>,
    p_reasons: Vec<String>,
    p_statuses: Vec<&'static str>,
}

impl RowStatements {
    /// The SUCCESS, FAILED and parked updates, in the order [`WriteBackRows::apply`] runs them.
    fn updates(&self) -> [&Statement; 3] {
        [&self.success, &self.failed, &self.parked]
    }
}

impl WriteBackRows {
    fn new(batch: &WriteBack<'_>) -> Self {
        let (d, f, p) = (batch.delivered, batch.failed, batch.parked);
        Self {
            replace_positions: batch.replace_positions,
            d_ids: d.iter().map(|x| x.id).collect(),
            d_parts: d.iter().map(|x| x.partition).collect(),
            d_offsets: d.iter().map(|x| x.offset).collect(),
            f_ids: f.iter().map(|x| x.id).collect(),
            f_errors: f.iter().map(|x| last_error_text(&x.error)).collect(),
            f_delays: f.iter().map(|x| delay_ms(x.retry_delay)).collect(),
            p_ids: p.iter().chain(batch.rejected).map(|x| x.id).collect(),
            p_reasons: (p.iter().chain(batch.rejected))
                .map(|x| last_error_text(&x.reason))
                .collect(),
            p_statuses: (p.iter().map(|_| status::FAILED))
                .chain(batch.rejected.iter().map(|_| status::MANUAL_REQUIRED))
                .collect(),
        }
    }

    /// Whether every row was delivered (none failed, parked or rejected).
    fn only_delivered(&self) -> bool {
        self.f_ids.is_empty() && self.p_ids.is_empty()
    }

    fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.d_ids
            .iter()
            .chain(&self.f_ids)
            .chain(&self.p_ids)
            .copied()
    }

    /// The rows whose id is in `keep`.
    fn only(&self, keep: &HashSet<i64>) -> Self {
        let mut out = Self {
            replace_positions: self.replace_positions,
            ..Self::default()
        };
        for (i, id) in self.d_ids.iter().enumerate() {
            if keep.contains(id) {
                out.d_ids.push(*id);
                out.d_parts.push(self.d_parts[i]);
                out.d_offsets.push(self.d_offsets[i]);
            }
        }
        for (i, id) in self.f_ids.iter().enumerate() {
            if keep.contains(id) {
                out.f_ids.push(*id);
                out.f_errors.push(self.f_errors[i].clone());
                out.f_delays.push(self.f_delays[i]);
            }
        }
        for (i, id) in self.p_ids.iter().enumerate() {
            if keep.contains(id) {
                out.p_ids.push(*id);
                out.p_reasons.push(self.p_reasons[i].clone());
                out.p_statuses.push(self.p_statuses[i]);
            }
        }
        out
    }

    /// Runs the SUCCESS, FAILED and parked updates, pipelined in this order (so a row
    /// both delivered and failed in one batch ends SUCCESS); returns the ids updated.
    async fn apply(
        &self,
        client: &Client,
        [success, failed, parked]: [&Statement; 3],
    ) -> Result<HashSet<i64>, tokio_postgres::Error> {
        let s = async {
            if self.d_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    success,
                    &[&self.d_ids, &self.d_parts, &self.d_offsets, replace],
                )
                .await
        };
        let f = async {
            if self.f_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    failed,
                    &[&self.f_ids, &self.f_errors, &self.f_delays, replace],
                )
                .await
        };
        let p = async {
            if self.p_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    parked,
                    &[&self.p_ids, &self.p_reasons, &self.p_statuses, replace],
                )
                .await
        };
        let (s, f, p) = futures_util::try_join!(s, f, p)?;
        s.iter()
            .chain(&f)
            .chain(&p)
            .map(|row| row.try_get::<_, i64>(0))
            .collect()
    }
}

/// The statement texts for one outbox table.
#[derive(Debug)]
struct Sql {
    /// The columns the statements name.
    names: RowColumns,
    event_select: String,
    success: String,
    /// `success` and `checkpoint` in one statement: the checkpoint is written only when
    /// every row of the batch was updated (see [`PgOutboxStore::write_back_at_once`]).
    success_and_checkpoint: String,
    failed: String,
    parked: String,
    exists: String,
    checkpoint: String,
    load_checkpoint: String,
    claim: [[String; 2]; 2],
    complete_success: String,
    complete_failed: String,
    complete_released: String,
    reap: String,
    schedule: String,
    blocked_all: String,
    blocked_some: String,
}

/// The outbox columns the statements name, quoted: outboxd's own (`schemas/postgres/
/// outbox.sql`), or where `outbox.columns` puts them on the application's table (kept rows
/// on Debezium's table: `id` is the integer row id `init --add-columns` added,
/// `aggregateid` the key). The status columns always have outboxd's names.
#[derive(Debug)]
pub(crate) struct RowColumns {
    /// The columns the statements name besides the status columns.
    pub(crate) row: RowNames,
    /// The select list of the claim fields for alias `o` ([`RowColumns::select`]).
    pub(crate) select: String,
    /// Where each claim field is in a row of `select`; a claim's token follows them
    /// ([`ColumnMap::field_count`]).
    pub(crate) map: ColumnMap,
}

impl RowColumns {
    /// The columns under `layout`, the key and payload read as `shape` says: text-like
    /// ones as their text output (what the replication stream sees), `bytea` as raw bytes.
    pub(crate) fn of(layout: &OutboxLayout, shape: RowShape) -> Self {
        let fields = columns::claim_fields(layout);
        let select = fields
            .iter()
            .map(|(field, name)| {
                let column = format!("o.{}", quote_ident(name));
                match field {
                    Field::Key if shape.key_bytea => column,
                    Field::Payload if shape.payload_bytea => column,
                    // Any integer type: read as bigint.
                    Field::Id => format!("{column}::bigint"),
                    Field::RetryCount | Field::MaxRetryCount => format!("{column}::int"),
                    _ => format!("{column}::text"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            row: RowNames::quoted(layout, quote_ident),
            map: ColumnMap::in_select_order(&fields, layout),
            select,
        }
    }
}

/// An SQL result row of [`RowColumns::select`] as the kit's row conversion reads it.
struct SqlRow<'a> {
    row: &'a Row,
    shape: RowShape,
    map: &'a ColumnMap,
}

impl RowSource for SqlRow<'_> {
    fn value(&self, field: Field) -> Result<Value, ConnectorError> {
        let Some(at) = self.map.get(field) else {
            return Ok(Value::Null);
        };
        let bytea = match field {
            Field::Key => self.shape.key_bytea,
            Field::Payload => self.shape.payload_bytea,
            _ => false,
        };
        Ok(match field {
            Field::Id => get::<Option<i64>>(self.row, at)?.map_or(Value::Null, Value::Int),
            Field::RetryCount | Field::MaxRetryCount => {
                get::<Option<i32>>(self.row, at)?.map_or(Value::Null, |i| Value::Int(i64::from(i)))
            }
            _ if bytea => get::<Option<Vec<u8>>>(self.row, at)?
                .map_or(Value::Null, |b| Value::Bytes(Bytes::from(b))),
            Field::CreatedAt => get::<Option<String>>(self.row, at)?
                .map_or(Value::Null, |t| Value::Bytes(Bytes::from(iso8601(&t)))),
            _ => get::<Option<String>>(self.row, at)?
                .map_or(Value::Null, |t| Value::Bytes(Bytes::from(t))),
        })
    }
}

impl Sql {
    /// `version` is `server_version_num`: `gen_random_uuid()` is built in from 13 on.
    fn new(outbox: &str, checkpoint: &str, names: RowColumns, version: i32) -> Self {
        let blocking = status::blocking_sql_list();
        let RowColumns {
            row: RowNames { id, biz_key, .. },
            select: columns,
            ..
        } = &names;
        let token = if version >= 130_000 {
            "gen_random_uuid()".to_owned()
        } else {
            format!("md5(random()::text || clock_timestamp()::text || o.{id}::text)::uuid")
        };
        let next_retry = |delay: &str| format!("now() + {delay} * interval '1 millisecond'");
        // The statuses FAILED, parked and rejected rows are written from (see `failed`),
        // and what they leave of a SUCCESS (NULL already on an INIT row).
        let failable = "(o.status = 'INIT' OR ($4 AND o.status = 'SUCCESS'))";
        let unsent = "sent_at = NULL, kafka_partition = NULL, kafka_offset = NULL";
        let failed_status = "CASE WHEN o.retry_count + 1 >= o.max_retry_count \
                             THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";
        let claim = |poll: bool, strict: bool| claim_sql(outbox, &names, &token, poll, strict);
        // Leaves next_retry_time alone unless it is set (a FAILED row retried): for a
        // fresh row NULL → NULL is no change, which keeps the update HOT.
        let success = format!(
            "UPDATE {outbox} AS o SET status = 'SUCCESS', sent_at = now(), updated_at = now(), \
             kafka_partition = d.partition, kafka_offset = d.kafka_offset, \
             last_error = NULL, next_retry_time = NULL \
             FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, partition, kafka_offset) \
             WHERE o.{id} = d.id AND (o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED') \
             OR ($4 AND o.status = 'SUCCESS')) RETURNING o.{id}::bigint"
        );
        // Never backward: LSNs compare as pg_lsn (text order is wrong for 9/… vs 10/…),
        // the LSN being what precedes the cluster's `;system=…`; other forms are replaced
        // as they come. `rows` is what is upserted: `VALUES (…)` or a `SELECT`.
        let checkpoint_upsert = |rows: &str| {
            format!(
                "INSERT INTO {checkpoint} AS t (pipeline, position, updated_at) {rows} \
                 ON CONFLICT (pipeline) DO UPDATE SET position = EXCLUDED.position, updated_at = now() \
                 WHERE CASE WHEN left(t.position, 4) = 'lsn:' AND left(EXCLUDED.position, 4) = 'lsn:' \
                       THEN pg_lsn(split_part(substr(t.position, 5), ';', 1)) \
                            <= pg_lsn(split_part(substr(EXCLUDED.position, 5), ';', 1)) \
                       ELSE true END"
            )
        };
        Self {
            event_select: format!("SELECT {columns} FROM {outbox} o"),
            // The checkpoint is upserted only when every row was updated: a row missing
            // from the statement's snapshot (not visible yet, or deleted) or past SUCCESS's
            // predicate (a replay) leaves it to the transaction of `write_back_on`.
            success_and_checkpoint: format!(
                "WITH s AS ({success}), \
                 n AS (SELECT (SELECT count(*) FROM s) = \
                       (SELECT count(DISTINCT i) FROM unnest($1::bigint[]) AS i) AS all_updated), \
                 c AS ({}) \
                 SELECT all_updated FROM n",
                checkpoint_upsert("SELECT $5, $6, now() FROM n WHERE n.all_updated")
            ),
            success,
            // From INIT, and under exactly-once ($4, `replace_positions`) from SUCCESS too:
            // such a row of a window read again was written SUCCESS before a Kafka commit
            // that never happened, and its position names an aborted record, so it goes.
            failed: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = f.error, updated_at = now(), \
                 status = {failed_status}, {unsent} \
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms) \
                 WHERE o.{id} = f.id AND {failable} RETURNING o.{id}::bigint",
                next_retry("f.delay_ms")
            ),
            // Parked rows (FAILED) and rejected ones (MANUAL_REQUIRED): due now, with the
            // reason, no attempt counted; from INIT, or SUCCESS as above.
            parked: format!(
                "UPDATE {outbox} AS o SET status = p.status, next_retry_time = now(), \
                 last_error = p.reason, updated_at = now(), {unsent} \
                 FROM unnest($1::bigint[], $2::text[], $3::text[]) AS p(id, reason, status) \
                 WHERE o.{id} = p.id AND {failable} RETURNING o.{id}::bigint"
            ),
            exists: format!("SELECT {id}::bigint FROM {outbox} WHERE {id} = ANY($1::bigint[])"),
            checkpoint: checkpoint_upsert("VALUES ($1, $2, now())"),
            load_checkpoint: format!("SELECT position FROM {checkpoint} WHERE pipeline = $1"),
            claim: [
                [claim(false, false), claim(false, true)],
                [claim(true, false), claim(true, true)],
            ],
            complete_success: format!(
                "UPDATE {outbox} AS o SET status = 'SUCCESS', sent_at = now(), updated_at = now(), \
                 kafka_partition = d.partition, kafka_offset = d.kafka_offset, \
                 last_error = NULL, next_retry_time = NULL, claimed_at = NULL, claim_token = NULL \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::text[]) \
                 AS d(id, partition, kafka_offset, token) \
                 WHERE o.{id} = d.id AND o.claim_token = d.token::uuid AND o.status = 'PROCESSING'"
            ),
            complete_failed: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = f.error, updated_at = now(), \
                 claimed_at = NULL, claim_token = NULL, status = {failed_status} \
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[]) \
                 AS f(id, error, delay_ms, token) \
                 WHERE o.{id} = f.id AND o.claim_token = f.token::uuid AND o.status = 'PROCESSING'",
                next_retry("f.delay_ms")
            ),
            // Released claims (FAILED) and rejected rows (MANUAL_REQUIRED): no attempt
            // counted, the reason in last_error.
            complete_released: format!(
                "UPDATE {outbox} AS o SET next_retry_time = now(), last_error = r.reason, \
                 updated_at = now(), claimed_at = NULL, claim_token = NULL, status = r.status \
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) \
                 AS r(id, reason, token, status) \
                 WHERE o.{id} = r.id AND o.claim_token = r.token::uuid AND o.status = 'PROCESSING'"
            ),
            // SKIP LOCKED: a row being written back by its worker right now is not stale.
            reap: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = {}, last_error = $3, updated_at = now(), \
                 claimed_at = NULL, claim_token = NULL, status = {failed_status} \
                 WHERE o.{id} IN (SELECT e.{id} FROM {outbox} e WHERE e.next_retry_time IS NOT NULL \
                 AND e.status = 'PROCESSING' AND e.claimed_at < now() - $1::bigint * interval '1 millisecond' \
                 FOR UPDATE OF e SKIP LOCKED) \
                 RETURNING o.status",
                next_retry("$2::bigint")
            ),
            schedule: format!(
                "SELECT (SELECT min(next_retry_time) FROM {outbox} \
                         WHERE next_retry_time IS NOT NULL AND status = 'FAILED'), \
                        (SELECT min(claimed_at) FROM {outbox} \
                         WHERE next_retry_time IS NOT NULL AND status = 'PROCESSING')"
            ),
            blocked_all: format!(
                "SELECT DISTINCT {biz_key}::text FROM {outbox} \
                 WHERE next_retry_time IS NOT NULL AND status IN {blocking}"
            ),
            blocked_some: format!(
                "SELECT DISTINCT {biz_key}::text FROM {outbox} \
                 WHERE next_retry_time IS NOT NULL AND status IN {blocking} \
                 AND {biz_key} = ANY($1::text[])"
            ),
            names,
        }
    }
}

/// The claim statement. `$1` is the limit; strict poll mode also takes `$2`, the window.
///
/// - Due FAILED rows: `status = 'FAILED' AND next_retry_time <= now()`, served by the
///   retry index.
/// - Poll mode adds INIT rows (served by the optional poll index). The two kinds are
///   selected and locked separately, each `ORDER BY id LIMIT $1`, so each uses its index,
///   then the lowest `$1` ids of both are claimed (the other locked rows are released at
///   commit, milliseconds later).
/// - Strict: a row is taken only when no lower id of its key is FAILED, PROCESSING or
///   MANUAL_REQUIRED (served by the key index on the same rows) and, in poll mode, none
///   is INIT. For INIT rows that last test looks at a window of the lowest INIT ids
///   without locking them: the first row of each key in the window has no earlier INIT
///   row, also when another claimer holds that earlier row's lock.
///
/// Claimed rows get `next_retry_time = COALESCE(next_retry_time, now())`, so a PROCESSING
/// row claimed from INIT is in the partial indexes too.
fn claim_sql(outbox: &str, names: &RowColumns, token: &str, poll: bool, strict: bool) -> String {
    let blocking = status::blocking_sql_list();
    let RowColumns {
        row: RowNames { id, biz_key, .. },
        select: columns,
        ..
    } = names;
    let not_blocked = if strict {
        format!(
            "AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.{biz_key} = o.{biz_key} \
             AND e.{id} < o.{id} AND e.next_retry_time IS NOT NULL AND e.status IN {blocking})"
        )
    } else {
        String::new()
    };
    let due_failed = "o.status = 'FAILED' AND o.next_retry_time <= now()";
    let lock = format!("ORDER BY o.{id} LIMIT $1 FOR UPDATE OF o SKIP LOCKED");
    let ctes = match (poll, strict) {
        (false, _) => {
            format!(
                "c AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {not_blocked} {lock})"
            )
        }
        (true, false) => format!(
            "i AS (SELECT o.{id} AS id FROM {outbox} o WHERE o.status = 'INIT' {lock}), \
             f AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {lock}), \
             c AS (SELECT id FROM i UNION ALL SELECT id FROM f ORDER BY id LIMIT $1)"
        ),
        (true, true) => format!(
            "w AS MATERIALIZED (SELECT o.{id} AS id, o.{biz_key} AS biz_key FROM {outbox} o \
               WHERE o.status = 'INIT' ORDER BY o.{id} LIMIT $2), \
             first AS (SELECT id FROM (SELECT id, row_number() OVER \
               (PARTITION BY biz_key ORDER BY id) AS n FROM w) r WHERE n = 1), \
             i AS (SELECT o.{id} AS id FROM {outbox} o WHERE o.{id} IN (SELECT id FROM first) \
               AND o.status = 'INIT' {not_blocked} {lock}), \
             f AS (SELECT o.{id} AS id FROM {outbox} o WHERE {due_failed} {not_blocked} \
               AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.{biz_key} = o.{biz_key} \
               AND e.{id} < o.{id} AND e.status = 'INIT') {lock}), \
             c AS (SELECT id FROM i UNION ALL SELECT id FROM f ORDER BY id LIMIT $1)"
        ),
    };
    format!(
        "WITH {ctes} \
         UPDATE {outbox} AS o SET status = 'PROCESSING', claimed_at = now(), \
         claim_token = {token}, updated_at = now(), \
         next_retry_time = COALESCE(o.next_retry_time, now()) \
         FROM c WHERE o.{id} = c.id \
         RETURNING {columns}, o.claim_token::text"
    )
}

/// Parses a checkpoint row's position.
pub(crate) fn parse_checkpoint(
    text: &str,
    table: &str,
    pipeline: &str,
) -> Result<Position, ConnectorError> {
    parse_stored_checkpoint(text, table, pipeline).map(|c| c.position())
}

/// Parses a checkpoint row: its position and the cluster that wrote it.
pub(crate) fn parse_stored_checkpoint(
    text: &str,
    table: &str,
    pipeline: &str,
) -> Result<StoredCheckpoint, ConnectorError> {
    StoredCheckpoint::parse(text).map_err(|e| {
        ConnectorError::definite(format!(
            "the checkpoint of pipeline `{pipeline}` in {table} is corrupt; delete the row to \
             resume from the replication slot's position"
        ))
        .with_source(e)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_statements_lock_only_the_outbox_rows_they_take() {
        let cols = RowColumns::of(&OutboxLayout::default(), RowShape::default());
        for poll in [false, true] {
            for strict in [false, true] {
                let sql = claim_sql("\"outbox\"", &cols, "gen_random_uuid()", poll, strict);
                assert!(sql.contains("FOR UPDATE OF o SKIP LOCKED"), "{sql}");
                assert!(sql.contains("COALESCE(o.next_retry_time, now())"), "{sql}");
                assert_eq!(sql.contains("'INIT'"), poll, "{sql}");
                assert_eq!(sql.contains("NOT EXISTS"), strict, "{sql}");
                assert_eq!(sql.contains("$2"), poll && strict, "{sql}");
            }
        }
    }

    /// Kept rows on Debezium's table: every statement names the added integer id and
    /// `aggregateid`, never a column of outboxd's own table the layout maps elsewhere.
    #[test]
    fn statements_name_the_mapped_columns() {
        let layout = OutboxLayout {
            key_column: "aggregateid".into(),
            columns: outboxd_connector::ColumnNames {
                id: Some("outboxd_seq".into()),
                ..outboxd_connector::ColumnNames::debezium()
            },
            ..OutboxLayout::default()
        };
        let sql = Sql::new(
            "\"outboxevent\"",
            "\"outboxd_checkpoint\"",
            RowColumns::of(&layout, RowShape::default()),
            150_000,
        );
        let texts = [
            &sql.success,
            &sql.failed,
            &sql.parked,
            &sql.exists,
            &sql.claim[0][1],
            &sql.claim[1][1],
            &sql.complete_success,
            &sql.reap,
        ];
        for text in texts {
            assert!(text.contains("\"outboxd_seq\""), "{text}");
            for outboxd_only in ["o.id ", "o.id,", "e.id ", "biz_key =", "message_id"] {
                assert!(!text.contains(outboxd_only), "{outboxd_only} in {text}");
            }
        }
        assert!(sql.claim[0][1].contains("e.\"aggregateid\" = o.\"aggregateid\""));
        assert!(sql.blocked_some.contains("\"aggregateid\" = ANY"));
        assert!(sql.event_select.contains("o.\"aggregatetype\"::text"));
        assert!(
            sql.event_select.contains("o.\"id\"::text"),
            "the uuid as header `id`"
        );
        assert!(!sql.event_select.contains("o.\"topic\""));
    }
}
