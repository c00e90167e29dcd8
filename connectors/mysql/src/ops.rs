//! Claims, reaper and operator actions on a MySQL/MariaDB outbox, as the PostgreSQL
//! connector does them (see `connectors/postgres/src/store.rs` and `operator.rs`).
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
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use outboxd_connector::{
    headers_from_json, last_error_text, parked_by_operator, resolved_by_operator, ClaimRequest,
    ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack, ConnectorError, JanitorAction,
    OutboxAdmin, OutboxEvent, Position, ReapPolicy, ReapReport, RetrySchedule, RetrySelector,
    StatusCount, StatusSummary,
};

use crate::connect::{classify, int, query, text, text_or_empty};
use crate::decoder::iso8601_utc;
use crate::schema::{qualified, quote_ident, sql_string};
use crate::server;
use crate::store::{delay_ms, MysqlOutboxStore};

/// The statuses that hold back later events of a key under strict ordering.
const BLOCKING: &str = "('FAILED', 'PROCESSING', 'MANUAL_REQUIRED')";

/// Keys per `IN (…)` list.
const KEYS_PER_STATEMENT: usize = 1000;

/// `(id, …)` of the claimed or scanned rows, in the order [`event_from_row`] reads them.
fn event_columns(key_column: &str) -> String {
    format!(
        "o.id, o.message_id, o.message_type, o.biz_key, o.{key}, o.topic, o.payload, o.headers, \
         o.created_at, o.retry_count, o.max_retry_count",
        key = quote_ident(key_column)
    )
}

const EVENT_COLUMNS: usize = 11;

/// One row of [`event_columns`] as the stream would build it (without a commit time).
fn event_from_row(row: &Row, table: &str) -> Result<OutboxEvent, ConnectorError> {
    let required = |at: usize, name: &str| {
        text(row, at)?.ok_or_else(|| {
            ConnectorError::definite(format!("outbox `{table}`: column `{name}` is NULL"))
        })
    };
    let bytes = |at: usize| -> Result<Bytes, ConnectorError> {
        Ok(match row.as_ref(at) {
            Some(mysql_async::Value::Bytes(b)) => Bytes::copy_from_slice(b),
            _ => text(row, at)?.map(Bytes::from).unwrap_or_default(),
        })
    };
    let number = |at: usize, name: &str| -> Result<i64, ConnectorError> {
        int(row, at)?.ok_or_else(|| {
            ConnectorError::definite(format!("outbox `{table}`: column `{name}` is NULL"))
        })
    };
    let int32 = |at: usize, name: &str| -> Result<i32, ConnectorError> {
        i32::try_from(number(at, name)?).map_err(|_| {
            ConnectorError::definite(format!("outbox `{table}`: column `{name}` is out of range"))
        })
    };
    let headers = match text(row, 7)? {
        Some(json) => headers_from_json(&json).unwrap_or_default(),
        None => Vec::new(),
    };
    Ok(OutboxEvent {
        id: number(0, "id")?,
        message_id: required(1, "message_id")?,
        message_type: required(2, "message_type")?,
        biz_key: required(3, "biz_key")?,
        key: bytes(4)?,
        topic: text(row, 5)?,
        payload: bytes(6)?,
        headers,
        created_at: sql_time_iso(&required(8, "created_at")?),
        retry_count: int32(9, "retry_count")?,
        max_retry_count: int32(10, "max_retry_count")?,
        commit_time: None,
    })
}

/// `2026-05-09 07:30:00.123456` (a TIMESTAMP read in a `+00:00` session) as the stream
/// renders it: `2026-05-09T07:30:00.123456+00:00`, no fraction when it is zero.
fn sql_time_iso(text: &str) -> String {
    match parse_sql_time(text) {
        Some((secs, micros)) => iso8601_utc(secs, micros),
        None => text.to_owned(),
    }
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` (UTC) → (seconds since the epoch, microseconds).
fn parse_sql_time(text: &str) -> Option<(i64, u32)> {
    let (date, time) = text.trim().split_once(' ')?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':');
    let (h, mi, s): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    let mut micros: u32 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    if frac.is_empty() {
        micros = 0;
    }
    Some((
        days_from_civil(y, m, day) * 86_400 + h * 3600 + mi * 60 + s,
        micros,
    ))
}

/// (year, month, day) → days since 1970-01-01 (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn system_time(text: Option<String>) -> Option<SystemTime> {
    let (secs, micros) = parse_sql_time(&text?)?;
    let secs = u64::try_from(secs).ok()?;
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs) + Duration::from_micros(u64::from(micros)))
}

fn id_list(ids: impl IntoIterator<Item = i64>) -> String {
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
const FAILED_STATUS: &str =
    "status = CASE WHEN retry_count + 1 >= max_retry_count THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";

fn next_retry(delay_ms_sql: &str) -> String {
    format!(
        "LEAST(NOW(6) + INTERVAL ({delay_ms_sql}) * 1000 MICROSECOND, TIMESTAMP'2038-01-19 03:14:07')"
    )
}

impl MysqlOutboxStore {
    /// Runs `f` on the connection inside `START TRANSACTION … COMMIT` at READ COMMITTED;
    /// drops the connection when anything fails (the server rolls back).
    async fn in_transaction<T, F>(&self, what: &str, f: F) -> Result<T, ConnectorError>
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
    async fn update(&self, sql: &str, what: &str) -> Result<u64, ConnectorError> {
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

    async fn rows(&self, sql: &str, what: &str) -> Result<Vec<Row>, ConnectorError> {
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

    pub(crate) async fn claim_rows(
        &self,
        request: ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let outbox = self.outbox.clone();
        let columns = event_columns(&self.connector.layout.key_column);
        let limit = request.limit;
        let not_blocked = |also_init: bool| {
            if !request.strict_order {
                return String::new();
            }
            let statuses = if also_init {
                "('INIT', 'FAILED', 'PROCESSING', 'MANUAL_REQUIRED')"
            } else {
                BLOCKING
            };
            let trouble = if also_init {
                String::new()
            } else {
                "AND e.next_retry_time IS NOT NULL ".to_owned()
            };
            format!(
                "AND NOT EXISTS (SELECT 1 FROM {outbox} e WHERE e.biz_key = o.biz_key \
                 AND e.id < o.id {trouble}AND e.status IN {statuses})"
            )
        };
        let due = "o.status = 'FAILED' AND o.next_retry_time <= NOW(6)";
        let lock = format!("ORDER BY o.id LIMIT {limit} FOR UPDATE SKIP LOCKED");
        let mut selects = vec![format!(
            "SELECT o.id FROM {outbox} o WHERE {due} {} {lock}",
            not_blocked(request.scope == ClaimScope::NewAndDueFailed)
        )];
        if request.scope == ClaimScope::NewAndDueFailed {
            selects.push(format!(
                "SELECT o.id FROM {outbox} o WHERE o.status = 'INIT' {} {lock}",
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
                         next_retry_time = COALESCE(next_retry_time, NOW(6)) WHERE id IN ({ids})"
                    ))
                    .await?;
                    conn.query::<Row, _>(format!(
                        "SELECT {columns}, o.claim_token FROM {outbox} o WHERE o.id IN ({ids}) \
                         ORDER BY o.id"
                    ))
                    .await
                })
            })
            .await?;
        let table = &self.connector.layout.outbox_table;
        rows.iter()
            .map(|row| {
                Ok(ClaimedEvent {
                    event: event_from_row(row, table)?,
                    claim_token: ClaimToken(text_or_empty(row, EVENT_COLUMNS)?),
                })
            })
            .collect()
    }

    pub(crate) async fn complete_claimed_rows(
        &self,
        batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, ConnectorError> {
        if batch.delivered.is_empty() && batch.failed.is_empty() {
            return Ok(0);
        }
        let outbox = &self.outbox;
        let mut statements = Vec::new();
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
                "UPDATE {outbox} AS o JOIN ({derived}) AS d ON o.id = d.id AND o.claim_token = d.tok \
                 SET o.status = 'SUCCESS', o.sent_at = NOW(6), o.updated_at = NOW(6), \
                 o.kafka_partition = d.kp, o.kafka_offset = d.ko, o.last_error = NULL, \
                 o.next_retry_time = NULL, o.claimed_at = NULL, o.claim_token = NULL \
                 WHERE o.status = 'PROCESSING'"
            ));
        }
        if !batch.failed.is_empty() {
            let mut errors = String::from("CASE id");
            let mut delays = String::from("CASE id");
            let mut pairs = String::new();
            for (i, (f, token)) in batch.failed.iter().enumerate() {
                let _ = write!(
                    errors,
                    " WHEN {} THEN {}",
                    f.id,
                    sql_string(&last_error_text(&f.error))
                );
                let _ = write!(delays, " WHEN {} THEN {}", f.id, delay_ms(f.retry_delay));
                if i > 0 {
                    pairs.push_str(" OR ");
                }
                let _ = write!(
                    pairs,
                    "(id = {} AND claim_token = {})",
                    f.id,
                    sql_string(&token.0)
                );
            }
            statements.push(format!(
                "UPDATE {outbox} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
                 last_error = {errors} END, next_retry_time = {}, updated_at = NOW(6), \
                 claimed_at = NULL, claim_token = NULL \
                 WHERE ({pairs}) AND status = 'PROCESSING'",
                next_retry(&format!("{delays} END"))
            ));
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

    pub(crate) async fn reap_rows(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let outbox = self.outbox.clone();
        let reason = sql_string(&policy.reaped_reason());
        let timeout = delay_ms(policy.claim_timeout);
        let delay = delay_ms(policy.retry_delay);
        self.in_transaction("returning expired claims to FAILED", move |conn| {
            Box::pin(async move {
                // SKIP LOCKED: a row being written back by its worker right now is not stale.
                let ids: Vec<i64> = conn
                    .query(format!(
                        "SELECT id FROM {outbox} WHERE next_retry_time IS NOT NULL \
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
                     claimed_at = NULL, claim_token = NULL WHERE id IN ({ids})",
                    next_retry(&delay.to_string())
                ))
                .await?;
                let counts: Vec<(String, u64)> = conn
                    .query(format!(
                        "SELECT status, COUNT(*) FROM {outbox} WHERE id IN ({ids}) GROUP BY status"
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

    pub(crate) async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let outbox = &self.outbox;
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

    pub(crate) async fn blocked(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        let outbox = &self.outbox;
        let base = format!(
            "SELECT DISTINCT biz_key FROM {outbox} WHERE next_retry_time IS NOT NULL \
             AND status IN {BLOCKING}"
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
                    let sql = format!("{base} AND biz_key IN ({})", list.join(", "));
                    for row in self.rows(&sql, what).await? {
                        blocked.insert(text_or_empty(&row, 0)?);
                    }
                }
            }
        }
        Ok(blocked)
    }
}

impl OutboxAdmin for MysqlOutboxStore {
    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let outbox = &self.outbox;
        let rows = self
            .rows(
                &format!(
                    "SELECT status, message_type, COUNT(*), MIN(created_at) FROM {outbox} \
                     GROUP BY status, message_type ORDER BY status, message_type"
                ),
                "counting outbox rows",
            )
            .await?;
        let mut summary = StatusSummary::default();
        for row in &rows {
            let status = text_or_empty(row, 0)?;
            let oldest = system_time(text(row, 3)?);
            if status == "INIT" || status == "FAILED" {
                summary.oldest_unsent = match (summary.oldest_unsent, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            summary.counts.push(StatusCount {
                status,
                message_type: text_or_empty(row, 1)?,
                rows: int(row, 2)?.unwrap_or(0),
            });
        }
        let sql = format!(
            "SELECT position, updated_at FROM {} WHERE pipeline = {}",
            self.checkpoint,
            sql_string(&self.connector.pipeline)
        );
        if let Some(row) = self.rows(&sql, "reading the checkpoint").await?.first() {
            let text_position = text_or_empty(row, 0)?;
            if let (Ok(position), Some(at)) = (
                text_position.parse::<Position>(),
                system_time(text(row, 1)?),
            ) {
                summary.source_lag_bytes = self.binlog_lag(&position).await.ok().flatten();
                summary.checkpoint = Some((position, at));
            }
        }
        Ok(summary)
    }

    async fn retry_rows(&self, selector: &RetrySelector) -> Result<u64, ConnectorError> {
        selector.check()?;
        let outbox = &self.outbox;
        let set = "SET status = 'FAILED', next_retry_time = NOW(6), retry_count = 0, \
                   claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)";
        match selector {
            RetrySelector::Id(id) => {
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE id = {id} AND status IN ('FAILED', 'MANUAL_REQUIRED')"
                );
                self.update(&sql, &format!("making row {id} due again"))
                    .await
            }
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let of_type = message_type
                    .as_deref()
                    .map(|t| format!(" AND message_type = {}", sql_string(t)))
                    .unwrap_or_default();
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE next_retry_time IS NOT NULL AND status = {}{of_type}",
                    sql_string(status)
                );
                self.update(&sql, &format!("making {status} rows due again"))
                    .await
            }
        }
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let note = sql_string(&parked_by_operator(reason));
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', \
             next_retry_time = COALESCE(next_retry_time, NOW(6)), last_error = {note}, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status IN ('INIT', 'FAILED')",
            self.outbox
        );
        Ok(self.update(&sql, &format!("parking row {id}")).await? > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let note = sql_string(&resolved_by_operator(reason));
        let sql = format!(
            "UPDATE {} SET status = 'SUCCESS', sent_at = NULL, next_retry_time = NULL, \
             last_error = {note}, claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status <> 'SUCCESS'",
            self.outbox
        );
        Ok(self.update(&sql, &format!("resolving row {id}")).await? > 0)
    }

    async fn janitor_batch(
        &self,
        retention: Duration,
        action: &JanitorAction,
        batch: usize,
    ) -> Result<u64, ConnectorError> {
        if batch == 0 {
            return Ok(0);
        }
        let outbox = self.outbox.clone();
        let retention_ms = delay_ms(retention);
        // Rows resolved by an operator were never sent: they age from their update.
        let old = format!(
            "status = 'SUCCESS' AND COALESCE(sent_at, updated_at) < \
             NOW(6) - INTERVAL {retention_ms} * 1000 MICROSECOND"
        );
        match action {
            JanitorAction::Delete => {
                let sql = format!("DELETE FROM {outbox} WHERE {old} ORDER BY id LIMIT {batch}");
                self.update(&sql, "deleting old SUCCESS rows").await
            }
            JanitorAction::Archive(table) => {
                let archive = qualified(table);
                self.update(
                    &format!("CREATE TABLE IF NOT EXISTS {archive} LIKE {outbox}"),
                    &format!("creating the archive table {table}"),
                )
                .await?;
                let what = format!(
                    "moving old SUCCESS rows to {table} (its columns must match the outbox's)"
                );
                self.in_transaction(&what, move |conn| {
                    Box::pin(async move {
                        let ids: Vec<i64> = conn
                            .query(format!(
                                "SELECT id FROM {outbox} WHERE {old} ORDER BY id LIMIT {batch} \
                                 FOR UPDATE SKIP LOCKED"
                            ))
                            .await?;
                        if ids.is_empty() {
                            return Ok(0);
                        }
                        let ids = id_list(ids);
                        conn.query_drop(format!(
                            "INSERT INTO {archive} SELECT * FROM {outbox} WHERE id IN ({ids})"
                        ))
                        .await?;
                        conn.query_drop(format!("DELETE FROM {outbox} WHERE id IN ({ids})"))
                            .await?;
                        Ok(conn.affected_rows())
                    })
                })
                .await
            }
        }
    }

    async fn scan_init(
        &self,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        let sql = format!(
            "SELECT {} FROM {} o WHERE o.status = 'INIT' AND o.id > {after_id} ORDER BY o.id \
             LIMIT {limit}",
            event_columns(&self.connector.layout.key_column),
            self.outbox
        );
        let table = &self.connector.layout.outbox_table;
        self.rows(&sql, "scanning INIT rows")
            .await?
            .iter()
            .map(|row| event_from_row(row, table))
            .collect()
    }
}

impl MysqlOutboxStore {
    /// Binlog bytes written after `position`: the rest of its file and every later file.
    async fn binlog_lag(&self, position: &Position) -> Result<Option<u64>, ConnectorError> {
        let Position::Binlog(b) = position else {
            return Ok(None);
        };
        let mut conn = self.connector.sql_conn().await?;
        let logs = server::binary_logs(&mut conn).await?;
        let Some(at) = logs.iter().position(|(name, _)| *name == b.file) else {
            return Ok(None);
        };
        let rest = logs[at].1.saturating_sub(b.offset);
        Ok(Some(
            rest + logs[at + 1..].iter().map(|(_, size)| size).sum::<u64>(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_times_read_as_the_stream_renders_them() {
        assert_eq!(
            sql_time_iso("2026-05-09 07:30:00.123456"),
            "2026-05-09T07:30:00.123456+00:00"
        );
        assert_eq!(
            sql_time_iso("2026-05-09 07:30:00.000000"),
            "2026-05-09T07:30:00+00:00"
        );
        assert_eq!(parse_sql_time("1970-01-01 00:00:01"), Some((1, 0)));
        assert_eq!(
            parse_sql_time("2000-03-01 00:00:00.5"),
            Some((951_868_800, 500_000))
        );
        assert_eq!(sql_time_iso("garbage"), "garbage");
        assert!(system_time(Some("2026-05-09 07:30:00".into())).is_some());
    }
}
