//! Claims, claimed write-back, reaper, retry schedule, blocked keys and `recover`'s scan
//! of INIT rows on a MySQL/MariaDB outbox, as the PostgreSQL connector does them (see
//! `connectors/postgres/src/store/`).
//!
//! MySQL has no `UPDATE … RETURNING`, so a claim is one short READ COMMITTED transaction:
//! `SELECT id … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+),
//! `UPDATE` of those ids to PROCESSING with a fresh `UUID()` each, and a `SELECT` of the
//! claimed rows. READ COMMITTED takes no gap locks, so claims never hold up the
//! application's inserts.
//!
//! Invariant kept by every statement (as on PostgreSQL): a row in FAILED, PROCESSING or
//! MANUAL_REQUIRED has `next_retry_time` set, so the `(next_retry_time, id)` and
//! `(biz_key, next_retry_time, id)` indexes find the rows "in trouble" without reading
//! SUCCESS rows.

use std::collections::HashSet;
use std::fmt::Write as _;

use bytes::Bytes;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use outboxd_connector::{
    ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack, ConnectorError,
    OutboxEvent, ReapPolicy, ReapReport, RetrySchedule,
};
use outboxd_connector_kit::row::{self, RowSource, Value as Cell};
use outboxd_connector_kit::{status, tables, ColumnMap, Field};

use crate::client::{classify, int, query, text, text_or_empty};
use crate::schema::sql_string;
use crate::store::{delay_ms, failure_cases, reason_case, MysqlOutboxStore, OutboxTable};
use crate::time::{sql_time_iso, system_time};

/// Keys per `IN (…)` list.
const KEYS_PER_STATEMENT: usize = 1000;

/// One row of [`OutboxTable::select`] as the stream would build it under the same
/// layout (without a commit time); `table` names the table in messages.
pub(super) fn event_from_row(
    row: &Row,
    outbox: &OutboxTable,
    table: &str,
) -> Result<OutboxEvent, ConnectorError> {
    row::event_from_select(&SqlRow(row, &outbox.map), &outbox.map, table)
}

/// An SQL result row of [`OutboxTable::select`] as the kit's row conversion reads it.
struct SqlRow<'a>(&'a Row, &'a ColumnMap);

impl RowSource for SqlRow<'_> {
    fn value(&self, field: Field) -> Result<Cell, ConnectorError> {
        let Some(at) = self.1.get(field) else {
            return Ok(Cell::Null);
        };
        Ok(match self.0.as_ref(at) {
            None | Some(mysql_async::Value::NULL) => Cell::Null,
            Some(mysql_async::Value::Bytes(b)) if field == Field::CreatedAt => {
                let text = String::from_utf8_lossy(b);
                Cell::Bytes(Bytes::from(sql_time_iso(&text)))
            }
            Some(mysql_async::Value::Bytes(b)) => Cell::Bytes(Bytes::copy_from_slice(b)),
            Some(mysql_async::Value::Int(i)) => Cell::Int(*i),
            Some(_) => match text(self.0, at)? {
                Some(t) if field == Field::CreatedAt => Cell::Bytes(Bytes::from(sql_time_iso(&t))),
                Some(t) => Cell::Bytes(Bytes::from(t)),
                None => Cell::Null,
            },
        })
    }
}

pub(super) fn id_list(ids: impl IntoIterator<Item = i64>) -> String {
    let mut out = String::new();
    for (i, id) in ids.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{id}");
    }
    out
}

/// `status` first (from the old `retry_count`), then the increment: single-table UPDATEs
/// assign left to right.
pub(super) const FAILED_STATUS: &str =
    "status = CASE WHEN retry_count + 1 >= max_retry_count THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";

pub(super) fn next_retry(delay_ms_sql: &str) -> String {
    format!(
        "LEAST(NOW(6) + INTERVAL ({delay_ms_sql}) * 1000 MICROSECOND, TIMESTAMP'2038-01-19 03:14:07')"
    )
}

impl MysqlOutboxStore {
    /// Runs `f` on the connection inside `START TRANSACTION … COMMIT` at READ COMMITTED;
    /// drops the connection when anything fails (the server rolls back).
    pub(super) async fn in_transaction<T, F>(&self, what: &str, f: F) -> Result<T, ConnectorError>
    where
        F: for<'c> FnOnce(
            &'c mut Conn,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, mysql_async::Error>> + Send + 'c>,
        >,
    {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = async {
            conn.query_drop("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
                .await?;
            let value = f(conn).await?;
            conn.query_drop("COMMIT").await?;
            Ok(value)
        }
        .await;
        match result {
            Ok(value) => Ok(value),
            Err(e) => {
                *slot = None;
                Err(classify(&e, &self.context(what)))
            }
        }
    }

    /// Runs one statement outside an explicit transaction; returns the rows it changed.
    pub(super) async fn update(&self, sql: &str, what: &str) -> Result<u64, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        match conn.query_drop(sql).await {
            Ok(()) => Ok(conn.affected_rows()),
            Err(e) => {
                *slot = None;
                Err(classify(&e, &self.context(what)))
            }
        }
    }

    pub(super) async fn rows(&self, sql: &str, what: &str) -> Result<Vec<Row>, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = query(conn, sql, &self.context(what)).await;
        if result.as_ref().is_err_and(ConnectorError::is_transient) {
            *slot = None;
        }
        result
    }

    /// Claims rows of the outbox table of index `table`.
    pub(crate) async fn claim_rows(
        &self,
        table: u16,
        request: ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let outbox = self.outbox_at(table)?.clone();
        let (id, biz_key) = (outbox.names.id.clone(), outbox.names.biz_key.clone());
        let columns = outbox.select.clone();
        let limit = request.limit;
        let not_blocked = |also_init: bool| {
            if !request.strict_order {
                return String::new();
            }
            let statuses = if also_init {
                status::sql_list(&[
                    status::INIT,
                    status::FAILED,
                    status::PROCESSING,
                    status::MANUAL_REQUIRED,
                ])
            } else {
                status::blocking_sql_list()
            };
            let trouble = if also_init {
                String::new()
            } else {
                "AND e.next_retry_time IS NOT NULL ".to_owned()
            };
            format!(
                "AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.{biz_key} = o.{biz_key} \
                 AND e.{id} < o.{id} {trouble}AND e.status IN {statuses})"
            )
        };
        let due = "o.status = 'FAILED' AND o.next_retry_time <= NOW(6)";
        let lock = format!("ORDER BY o.{id} LIMIT {limit} FOR UPDATE SKIP LOCKED");
        let mut selects = vec![format!(
            "SELECT o.{id} FROM {outbox} o WHERE {due} {} {lock}",
            not_blocked(request.scope == ClaimScope::NewAndDueFailed)
        )];
        if request.scope == ClaimScope::NewAndDueFailed {
            selects.push(format!(
                "SELECT o.{id} FROM {outbox} o WHERE o.status = 'INIT' {} {lock}",
                not_blocked(true)
            ));
        }
        let rows = self
            .in_transaction("claiming outbox rows", move |conn| {
                Box::pin(async move {
                    let mut ids: Vec<i64> = Vec::new();
                    for select in &selects {
                        ids.extend(conn.query::<i64, _>(select.as_str()).await?);
                    }
                    ids.sort_unstable();
                    ids.truncate(limit);
                    if ids.is_empty() {
                        return Ok(Vec::new());
                    }
                    let ids = id_list(ids);
                    conn.query_drop(format!(
                        "UPDATE {outbox} SET status = 'PROCESSING', claimed_at = NOW(6), \
                         claim_token = UUID(), updated_at = NOW(6), \
                         next_retry_time = COALESCE(next_retry_time, NOW(6)) WHERE {id} IN ({ids})"
                    ))
                    .await?;
                    conn.query::<Row, _>(format!(
                        "SELECT {columns}, o.claim_token FROM {outbox} o WHERE o.{id} IN ({ids}) \
                         ORDER BY o.{id}"
                    ))
                    .await
                })
            })
            .await?;
        let name = self.table_name(table);
        let outbox = self.outbox_at(table)?;
        rows.iter()
            .map(|row| {
                let mut event = event_from_row(row, outbox, name)?;
                event.table = table;
                Ok(ClaimedEvent {
                    event,
                    claim_token: ClaimToken(text_or_empty(row, outbox.map.field_count())?),
                })
            })
            .collect()
    }

    pub(crate) async fn complete_claimed_rows(
        &self,
        batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, ConnectorError> {
        if batch.is_empty() {
            return Ok(0);
        }
        // Each table's statements, all in one transaction.
        let mut statements = Vec::new();
        for part in tables::split_claimed(&batch) {
            let outbox = self.outbox_at(part.table)?;
            claimed_statements(&mut statements, outbox, part.rows());
        }
        self.in_transaction("writing back claimed rows", move |conn| {
            Box::pin(async move {
                let mut changed = 0;
                for statement in &statements {
                    conn.query_drop(statement.as_str()).await?;
                    changed += conn.affected_rows();
                }
                Ok(changed)
            })
        })
        .await
    }

    /// Reaps the expired claims of the outbox table `outbox`.
    pub(crate) async fn reap_rows(
        &self,
        outbox: &OutboxTable,
        policy: ReapPolicy,
    ) -> Result<ReapReport, ConnectorError> {
        let outbox = outbox.clone();
        let id = outbox.names.id.clone();
        let reason = sql_string(&policy.reaped_reason());
        let timeout = delay_ms(policy.claim_timeout);
        let delay = delay_ms(policy.retry_delay);
        self.in_transaction("returning expired claims to FAILED", move |conn| {
            Box::pin(async move {
                // SKIP LOCKED: a row being written back by its worker right now is not stale.
                let ids: Vec<i64> = conn
                    .query(format!(
                        "SELECT {id} FROM {outbox} WHERE next_retry_time IS NOT NULL \
                         AND status = 'PROCESSING' \
                         AND claimed_at < NOW(6) - INTERVAL {timeout} * 1000 MICROSECOND \
                         FOR UPDATE SKIP LOCKED"
                    ))
                    .await?;
                if ids.is_empty() {
                    return Ok(ReapReport::default());
                }
                let ids = id_list(ids);
                conn.query_drop(format!(
                    "UPDATE {outbox} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
                     next_retry_time = {}, last_error = {reason}, updated_at = NOW(6), \
                     claimed_at = NULL, claim_token = NULL WHERE {id} IN ({ids})",
                    next_retry(&delay.to_string())
                ))
                .await?;
                let counts: Vec<(String, u64)> = conn
                    .query(format!(
                        "SELECT status, COUNT(*) FROM {outbox} WHERE {id} IN ({ids}) GROUP BY status"
                    ))
                    .await?;
                let mut report = ReapReport::default();
                for (status, n) in counts {
                    if status == "MANUAL_REQUIRED" {
                        report.manual_required += n;
                    } else {
                        report.failed += n;
                    }
                }
                Ok(report)
            })
        })
        .await
    }

    /// The retry schedule of the outbox table `outbox`.
    pub(crate) async fn schedule(
        &self,
        outbox: &OutboxTable,
    ) -> Result<RetrySchedule, ConnectorError> {
        let sql = format!(
            "SELECT (SELECT MIN(next_retry_time) FROM {outbox} \
                     WHERE next_retry_time IS NOT NULL AND status = 'FAILED'), \
                    (SELECT MIN(claimed_at) FROM {outbox} \
                     WHERE next_retry_time IS NOT NULL AND status = 'PROCESSING')"
        );
        let rows = self.rows(&sql, "reading the retry schedule").await?;
        let Some(row) = rows.first() else {
            return Ok(RetrySchedule::default());
        };
        Ok(RetrySchedule {
            next_due: system_time(text(row, 0)?),
            oldest_claim: system_time(text(row, 1)?),
        })
    }

    /// The keys held back by rows of the outbox table `outbox`.
    pub(crate) async fn blocked(
        &self,
        outbox: &OutboxTable,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        let blocking = status::blocking_sql_list();
        let biz_key = &outbox.names.biz_key;
        let base = format!(
            "SELECT DISTINCT {biz_key} FROM {outbox} WHERE next_retry_time IS NOT NULL \
             AND status IN {blocking}"
        );
        let what = "reading the keys held back by failed rows";
        let mut blocked = HashSet::new();
        match keys {
            None => {
                for row in self.rows(&base, what).await? {
                    blocked.insert(text_or_empty(&row, 0)?);
                }
            }
            Some(keys) => {
                for chunk in keys.chunks(KEYS_PER_STATEMENT) {
                    let list: Vec<String> = chunk.iter().map(|k| sql_string(k)).collect();
                    let sql = format!("{base} AND {biz_key} IN ({})", list.join(", "));
                    for row in self.rows(&sql, what).await? {
                        blocked.insert(text_or_empty(&row, 0)?);
                    }
                }
            }
        }
        Ok(blocked)
    }

    /// The highest SUCCESS id of the outbox table `outbox`.
    pub(crate) async fn highest_success_id(
        &self,
        outbox: &OutboxTable,
    ) -> Result<Option<i64>, ConnectorError> {
        // The primary key read backward: the newest rows are SUCCESS (or a backlog of INIT
        // ones, scanned once per session).
        let id = &outbox.names.id;
        let sql = format!(
            "SELECT {id} FROM {outbox} WHERE status = 'SUCCESS' ORDER BY {id} DESC LIMIT 1"
        );
        let rows = self
            .rows(&sql, "reading the highest delivered row id")
            .await?;
        match rows.first() {
            Some(row) => int(row, 0),
            None => Ok(None),
        }
    }

    /// Of `ids` in the outbox table `outbox`, the SUCCESS ones.
    pub(crate) async fn success_among(
        &self,
        outbox: &OutboxTable,
        ids: &[i64],
    ) -> Result<HashSet<i64>, ConnectorError> {
        let id = &outbox.names.id;
        let mut delivered = HashSet::new();
        for chunk in ids.chunks(KEYS_PER_STATEMENT) {
            let list: Vec<String> = chunk.iter().map(ToString::to_string).collect();
            let sql = format!(
                "SELECT {id} FROM {outbox} WHERE {id} IN ({}) AND status = 'SUCCESS'",
                list.join(", ")
            );
            for row in self
                .rows(&sql, "reading which rows are delivered already")
                .await?
            {
                if let Some(id) = int(&row, 0)? {
                    delivered.insert(id);
                }
            }
        }
        Ok(delivered)
    }

    /// [`OutboxStore::scan_init`](outboxd_connector::OutboxStore::scan_init): the INIT rows
    /// `outboxd recover` publishes.
    pub(crate) async fn init_rows(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        let outbox = self.outbox_at(table)?;
        let id = &outbox.names.id;
        let sql = format!(
            "SELECT {} FROM {outbox} o WHERE o.status = 'INIT' AND o.{id} > {after_id} \
             ORDER BY o.{id} LIMIT {limit}",
            outbox.select
        );
        let name = self.table_name(table);
        self.rows(&sql, "scanning INIT rows")
            .await?
            .iter()
            .map(|row| {
                let mut event = event_from_row(row, outbox, name)?;
                event.table = table;
                Ok(event)
            })
            .collect()
    }
}

/// The claimed write-back statements of `batch`, whose rows are all in `outbox`.
fn claimed_statements(
    statements: &mut Vec<String>,
    outbox: &OutboxTable,
    batch: ClaimedWriteBack<'_>,
) {
    let id = &outbox.names.id;
    if !batch.delivered.is_empty() {
        let mut derived = String::new();
        for (i, (d, token)) in batch.delivered.iter().enumerate() {
            if i == 0 {
                let _ = write!(
                    derived,
                    "SELECT {} AS id, {} AS kp, {} AS ko, {} AS tok",
                    d.id,
                    d.partition,
                    d.offset,
                    sql_string(&token.0)
                );
            } else {
                let _ = write!(
                    derived,
                    " UNION ALL SELECT {}, {}, {}, {}",
                    d.id,
                    d.partition,
                    d.offset,
                    sql_string(&token.0)
                );
            }
        }
        statements.push(format!(
            "UPDATE {outbox} AS o JOIN ({derived}) AS d ON o.{id} = d.id AND o.claim_token = d.tok \
             SET o.status = 'SUCCESS', o.sent_at = NOW(6), o.updated_at = NOW(6), \
             o.kafka_partition = d.kp, o.kafka_offset = d.ko, o.last_error = NULL, \
             o.next_retry_time = NULL, o.claimed_at = NULL, o.claim_token = NULL \
             WHERE o.status = 'PROCESSING'"
        ));
    }
    if !batch.failed.is_empty() {
        let (errors, delays) = failure_cases(id, batch.failed.iter().map(|(f, _)| f));
        let pairs = held_claims(id, batch.failed.iter().map(|(f, token)| (f.id, token)));
        statements.push(format!(
            "UPDATE {outbox} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
             last_error = {errors} END, next_retry_time = {}, updated_at = NOW(6), \
             claimed_at = NULL, claim_token = NULL \
             WHERE ({pairs}) AND status = 'PROCESSING'",
            next_retry(&format!("{delays} END"))
        ));
    }
    // Released claims become FAILED, rejected rows MANUAL_REQUIRED: no attempt
    // counted, the reason in last_error.
    for (rows, status) in [
        (batch.released, status::FAILED),
        (batch.rejected, status::MANUAL_REQUIRED),
    ] {
        if rows.is_empty() {
            continue;
        }
        let reasons = reason_case(id, rows.iter().map(|(r, _)| r));
        let pairs = held_claims(id, rows.iter().map(|(r, token)| (r.id, token)));
        statements.push(format!(
            "UPDATE {outbox} SET status = '{status}', next_retry_time = NOW(6), \
             last_error = {reasons}, updated_at = NOW(6), \
             claimed_at = NULL, claim_token = NULL \
             WHERE ({pairs}) AND status = 'PROCESSING'"
        ));
    }
}

/// `(id = 1 AND claim_token = …) OR …`: the rows whose claim this worker still holds.
fn held_claims<'a>(column: &str, rows: impl Iterator<Item = (i64, &'a ClaimToken)>) -> String {
    rows.map(|(id, token)| {
        format!(
            "({column} = {id} AND claim_token = {})",
            sql_string(&token.0)
        )
    })
    .collect::<Vec<_>>()
    .join(" OR ")
}
