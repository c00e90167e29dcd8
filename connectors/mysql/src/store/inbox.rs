//! The MySQL/MariaDB [`InboxStore`] and [`InboxAdmin`], as the PostgreSQL connector does
//! them (see `connectors/postgres/src/store/inbox.rs`), in MySQL's dialect.
//!
//! Insert: one transaction; each message is its own `INSERT … ON DUPLICATE KEY UPDATE id =
//! id` (both unique keys count, also between two messages of one batch), all sent as one
//! multi-statement text per ~1 MiB. Each statement's affected-row count says what happened
//! to its message: 1 stored (its insert id is the row's id), 0 duplicate (the connection
//! does not set `CLIENT_FOUND_ROWS`, so an unchanged row counts 0). A multi-row INSERT
//! could not say which of its rows were duplicates; per-statement counts can, in the same
//! single round trip. `INSERT IGNORE` is not used: it would also turn bad data into
//! warnings.
//!
//! Every value is a number or a hex literal ([`sql_string`], [`hex_literal`]), as in the
//! outbox store, so no `sql_mode` or character set changes what a statement means.
//!
//! MySQL has no `UPDATE … RETURNING`: a claim is one READ COMMITTED transaction of
//! `SELECT … FOR UPDATE SKIP LOCKED`, `UPDATE` to PROCESSING with `UUID()` tokens, and a
//! `SELECT` of the claimed rows.

use std::time::{Duration, SystemTime};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use outboxd_connector::{
    last_error_text, parked_by_operator, resolved_without_handling, ClaimToken, ClaimedMessage,
    Completed, ConnectorError, InboxAdmin, InboxMessage, InboxOutcome, InboxStore, Ingested,
    JanitorAction, ReapPolicy, ReapReport, RetrySchedule, RetrySelector, StatusCount,
    StatusSummary,
};
use outboxd_connector_kit::inbox as kit;
use outboxd_connector_kit::status;
use tokio::sync::Mutex;

use crate::client::{classify, int, query, query_first, text, text_or_empty};
use crate::schema::{hex_literal, qualified, sql_string, table_ident};
use crate::store::claims::{id_list, next_retry, FAILED_STATUS};
use crate::store::delay_ms;
use crate::time::system_time;
use crate::MysqlConnector;

/// Bytes of statement text per round trip of an insert, at most (below every server's
/// default `max_allowed_packet`); one message larger than that goes alone.
const INSERT_TEXT_BYTES: usize = 1024 * 1024;

/// The columns a claim reads, in [`claimed_from_row`]'s order.
const CLAIM_COLUMNS: &str = "id, source, message_id, message_type, biz_key, payload, headers, \
     retry_count, max_retry_count, created_at, claim_token";

/// How the payload column stores a message's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    /// `JSON` (MySQL), or MariaDB's JSON alias (`LONGTEXT` with a `json_valid` check).
    Json,
    /// A BLOB or (VAR)BINARY column: the bytes as received.
    Bytes,
    /// Any other text column: the body as text.
    Text,
}

/// The inbox table of one MySQL/MariaDB database. Holds one connection; when it breaks,
/// the failing call returns a transient error and the next one reconnects.
#[derive(Debug)]
pub struct MysqlInboxStore {
    connector: MysqlConnector,
    table: String,
    payload: Payload,
    conn: Mutex<Option<Conn>>,
}

impl MysqlInboxStore {
    /// Connects and checks the table; a missing table or column is a definite error that
    /// names `outboxd init`.
    pub(crate) async fn open(connector: &MysqlConnector) -> Result<Self, ConnectorError> {
        let mut conn = connector.sql_conn().await?;
        let table = qualified(&connector.layout.inbox_table);
        let context = format!(
            "reading the inbox table {} on {} (run `outboxd check`; `outboxd init` creates it)",
            connector.layout.inbox_table,
            connector.endpoint()
        );
        let probe = format!(
            "SELECT {CLAIM_COLUMNS}, status, next_retry_time, claimed_at, last_error, updated_at, \
             processed_at FROM {table} LIMIT 0"
        );
        query(&mut conn, &probe, &context).await?;
        let (db, name) = table_ident(&connector.layout.inbox_table, &connector.config().database);
        let kind = format!(
            "SELECT c.DATA_TYPE, (SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS k \
               WHERE k.CONSTRAINT_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME \
               AND k.CHECK_CLAUSE LIKE '%json_valid(`payload`)%') \
             FROM information_schema.COLUMNS c WHERE c.TABLE_SCHEMA = {} AND c.TABLE_NAME = {} \
             AND c.COLUMN_NAME = 'payload'",
            sql_string(&db),
            sql_string(&name)
        );
        let row = query_first(&mut conn, &kind, &context).await?;
        let data_type = match &row {
            Some(row) => text(row, 0)?.unwrap_or_default().to_ascii_lowercase(),
            None => String::new(),
        };
        let json_check = match &row {
            Some(row) => int(row, 1)?.unwrap_or(0) > 0,
            None => false,
        };
        let payload = if data_type == "json" || json_check {
            Payload::Json
        } else if data_type.contains("blob") || data_type.contains("binary") {
            Payload::Bytes
        } else {
            Payload::Text
        };
        Ok(Self {
            connector: connector.clone(),
            table,
            payload,
            conn: Mutex::new(Some(conn)),
        })
    }

    fn context(&self, what: &str) -> String {
        format!(
            "{what} ({} on {})",
            self.connector.layout.inbox_table,
            self.connector.endpoint()
        )
    }

    /// Runs `work` on the connection (reconnecting first when the last one broke); drops
    /// the connection when it fails, so the server rolls back an open transaction.
    async fn with_conn<T>(
        &self,
        what: &str,
        work: impl AsyncFnOnce(&mut Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        match work(conn).await {
            Ok(value) => Ok(value),
            Err(e) => {
                *slot = None;
                Err(classify(&e, &self.context(what)))
            }
        }
    }

    /// The payload as an SQL expression for this table's column.
    fn payload_sql(&self, message: &InboxMessage) -> String {
        match self.payload {
            Payload::Json => sql_string(&kit::json_payload(message)),
            Payload::Text => sql_string(&String::from_utf8_lossy(&message.payload)),
            Payload::Bytes => hex_literal(&message.payload),
        }
    }

    /// One message's `INSERT … ON DUPLICATE KEY UPDATE id = id`.
    fn insert_sql(&self, message: &InboxMessage) -> String {
        let (status, reason, due) = match &message.rejected {
            Some(reason) => (
                sql_string(kit::MANUAL_REQUIRED),
                sql_string(&last_error_text(reason)),
                "NOW(6)",
            ),
            None => (sql_string(kit::PENDING), "NULL".to_owned(), "NULL"),
        };
        format!(
            "INSERT INTO {} (source, message_id, message_type, biz_key, payload, headers, status, \
             last_error, next_retry_time) VALUES ({}, {}, {}, {}, {}, {}, {status}, {reason}, {due}) \
             ON DUPLICATE KEY UPDATE id = id",
            self.table,
            sql_string(&message.source),
            sql_string(&message.message_id),
            sql_string(&message.message_type),
            sql_string(&message.biz_key),
            self.payload_sql(message),
            sql_string(&kit::headers_json(message)),
        )
    }

    /// A claimed row's UPDATE condition: only while this claim holds.
    fn held(&self, message: &ClaimedMessage) -> String {
        format!(
            "id = {} AND claim_token = {} AND status = 'PROCESSING'",
            message.id,
            sql_string(&message.claim_token.0)
        )
    }

    /// Due rows not held back by an earlier open row of their key (`alias` is the row).
    fn due_and_free(&self) -> String {
        let open = status::sql_list(&kit::OPEN);
        format!(
            "i.status IN ('PENDING', 'FAILED') AND COALESCE(i.next_retry_time, i.created_at) <= NOW(6) \
             AND NOT EXISTS (SELECT 1 FROM {} e WHERE e.biz_key = i.biz_key AND e.id < i.id \
             AND e.status IN {open})",
            self.table
        )
    }
}

/// Runs `sql` (several statements) and returns each statement's affected rows and insert
/// id, in order.
async fn per_statement(
    conn: &mut Conn,
    sql: &str,
) -> Result<Vec<(u64, Option<u64>)>, mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let mut out = Vec::new();
    // The counts are the current statement's; `collect` moves to the next one, and the
    // result is empty once the last statement's answer has been read.
    loop {
        out.push((result.affected_rows(), result.last_insert_id()));
        if result.is_empty() {
            break;
        }
        result.collect::<Row>().await?;
    }
    Ok(out)
}

impl InboxStore for MysqlInboxStore {
    fn payload_is_json(&self) -> bool {
        self.payload == Payload::Json
    }

    async fn insert(&self, messages: &[InboxMessage]) -> Result<Vec<Ingested>, ConnectorError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        // Statements grouped into texts of at most INSERT_TEXT_BYTES.
        let mut texts: Vec<String> = vec![String::new()];
        for message in messages {
            let statement = self.insert_sql(message);
            let current = texts
                .last_mut()
                .filter(|t| t.is_empty() || t.len() + statement.len() + 2 <= INSERT_TEXT_BYTES);
            match current {
                Some(text) => {
                    if !text.is_empty() {
                        text.push_str(";\n");
                    }
                    text.push_str(&statement);
                }
                None => texts.push(statement),
            }
        }
        let counts = self
            .with_conn("storing inbox messages", async |conn| {
                conn.query_drop(
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION",
                )
                .await?;
                let mut counts = Vec::with_capacity(messages.len());
                for text in &texts {
                    counts.extend(per_statement(conn, text).await?);
                }
                conn.query_drop("COMMIT").await?;
                Ok(counts)
            })
            .await?;
        if counts.len() != messages.len() {
            return Err(ConnectorError::definite(format!(
                "unexpected answer from MySQL: {} results for {} inbox inserts",
                counts.len(),
                messages.len()
            )));
        }
        Ok(counts
            .into_iter()
            .map(|(affected, id)| match (affected, id) {
                (1, Some(id)) => Ingested::Stored(i64::try_from(id).unwrap_or(i64::MAX)),
                _ => Ingested::Duplicate,
            })
            .collect())
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedMessage>, ConnectorError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let table = &self.table;
        let select = format!(
            "SELECT i.id FROM {table} i WHERE {} \
             ORDER BY COALESCE(i.next_retry_time, i.created_at), i.id LIMIT {limit} \
             FOR UPDATE SKIP LOCKED",
            self.due_and_free()
        );
        let rows = self
            .with_conn("claiming inbox messages", async |conn| {
                conn.query_drop(
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION",
                )
                .await?;
                let ids: Vec<i64> = conn.query(select.as_str()).await?;
                if ids.is_empty() {
                    conn.query_drop("COMMIT").await?;
                    return Ok(Vec::new());
                }
                let ids = id_list(ids);
                conn.query_drop(format!(
                    "UPDATE {table} SET status = 'PROCESSING', claimed_at = NOW(6), \
                     claim_token = UUID(), updated_at = NOW(6) WHERE id IN ({ids})"
                ))
                .await?;
                let rows: Vec<Row> = conn
                    .query(format!(
                        "SELECT {CLAIM_COLUMNS} FROM {table} WHERE id IN ({ids}) ORDER BY id"
                    ))
                    .await?;
                conn.query_drop("COMMIT").await?;
                Ok(rows)
            })
            .await?;
        rows.iter().map(claimed_from_row).collect()
    }

    async fn complete(
        &self,
        message: &ClaimedMessage,
        outcome: InboxOutcome<'_>,
    ) -> Result<Completed, ConnectorError> {
        let table = &self.table;
        let held = self.held(message);
        let release = "claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)";
        let update = match outcome {
            InboxOutcome::Done { .. } => format!(
                "UPDATE {table} SET status = 'DONE', processed_at = NOW(6), last_error = NULL, \
                 next_retry_time = NULL, {release} WHERE {held}"
            ),
            InboxOutcome::Failed { error, retry_delay } => format!(
                "UPDATE {table} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
                 next_retry_time = {}, last_error = {}, {release} WHERE {held}",
                next_retry(&delay_ms(retry_delay).to_string()),
                sql_string(&last_error_text(error))
            ),
            InboxOutcome::ManualRequired { reason } => format!(
                "UPDATE {table} SET status = 'MANUAL_REQUIRED', next_retry_time = NOW(6), \
                 last_error = {}, {release} WHERE {held}",
                sql_string(&last_error_text(reason))
            ),
            InboxOutcome::Released { reason } => format!(
                "UPDATE {table} SET status = 'PENDING', next_retry_time = NULL, last_error = {}, \
                 {release} WHERE {held}",
                sql_string(&last_error_text(reason))
            ),
        };
        // The handler's statement with its fields bound as text parameters.
        let statement = match outcome {
            InboxOutcome::Done {
                statement: Some(statement),
            } => {
                let (sql, fields) = kit::bind_named(statement, |_| "?".into())?;
                let values: Vec<mysql_async::Value> = (fields.iter())
                    .map(|f| mysql_async::Value::from(f.text(message)))
                    .collect();
                Some((sql, values))
            }
            _ => None,
        };
        self.with_conn("writing back an inbox message", async |conn| {
            conn.query_drop("START TRANSACTION").await?;
            conn.query_drop(update.as_str()).await?;
            if conn.affected_rows() == 0 {
                conn.query_drop("ROLLBACK").await?;
                return Ok(Completed::ClaimLost);
            }
            if let Some((sql, values)) = &statement {
                match conn.exec_drop(sql.as_str(), values.clone()).await {
                    Ok(()) => {}
                    Err(mysql_async::Error::Server(e)) => {
                        conn.query_drop("ROLLBACK").await?;
                        return Ok(Completed::StatementFailed(format!(
                            "SQL handler: {} (error {}, SQLSTATE {})",
                            e.message, e.code, e.state
                        )));
                    }
                    Err(e) => return Err(e),
                }
            }
            conn.query_drop("COMMIT").await?;
            Ok(Completed::Written)
        })
        .await
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let table = &self.table;
        let timeout = delay_ms(policy.claim_timeout);
        let reason = sql_string(&policy.reaped_reason());
        let select = format!(
            "SELECT id FROM {table} WHERE status = 'PROCESSING' \
             AND claimed_at < NOW(6) - INTERVAL {timeout} * 1000 MICROSECOND \
             ORDER BY id FOR UPDATE SKIP LOCKED"
        );
        let delay = next_retry(&delay_ms(policy.retry_delay).to_string());
        let statuses: Vec<String> = self
            .with_conn("returning expired inbox claims to FAILED", async |conn| {
                conn.query_drop(
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION",
                )
                .await?;
                let ids: Vec<i64> = conn.query(select.as_str()).await?;
                if ids.is_empty() {
                    conn.query_drop("COMMIT").await?;
                    return Ok(Vec::new());
                }
                let ids = id_list(ids);
                conn.query_drop(format!(
                    "UPDATE {table} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
                     next_retry_time = {delay}, last_error = {reason}, claimed_at = NULL, \
                     claim_token = NULL, updated_at = NOW(6) WHERE id IN ({ids})"
                ))
                .await?;
                let statuses = conn
                    .query(format!("SELECT status FROM {table} WHERE id IN ({ids})"))
                    .await?;
                conn.query_drop("COMMIT").await?;
                Ok(statuses)
            })
            .await?;
        let mut report = ReapReport::default();
        for status in &statuses {
            if status == kit::MANUAL_REQUIRED {
                report.manual_required += 1;
            } else {
                report.failed += 1;
            }
        }
        Ok(report)
    }

    async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let sql = format!(
            "SELECT (SELECT MIN(COALESCE(i.next_retry_time, i.created_at)) FROM {table} i WHERE {}), \
                    (SELECT MIN(claimed_at) FROM {table} WHERE status = 'PROCESSING')",
            self.due_and_free().replace(
                "AND COALESCE(i.next_retry_time, i.created_at) <= NOW(6) ",
                ""
            ),
            table = self.table
        );
        let row: Option<Row> = self
            .with_conn("reading the inbox schedule", async |conn| {
                conn.query_first(sql.as_str()).await
            })
            .await?;
        let Some(row) = row else {
            return Ok(RetrySchedule::default());
        };
        Ok(RetrySchedule {
            next_due: system_time(text(&row, 0)?),
            oldest_claim: system_time(text(&row, 1)?),
        })
    }
}

fn claimed_from_row(row: &Row) -> Result<ClaimedMessage, ConnectorError> {
    let id = int(row, 0)?.ok_or_else(|| ConnectorError::definite("inbox row without an id"))?;
    let count = |at: usize| -> Result<i32, ConnectorError> {
        Ok(int(row, at)?
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0))
    };
    let payload = match row.as_ref(5) {
        Some(mysql_async::Value::Bytes(b)) => b.clone(),
        _ => text(row, 5)?.unwrap_or_default().into_bytes(),
    };
    Ok(ClaimedMessage {
        id,
        source: text_or_empty(row, 1)?,
        message_id: text_or_empty(row, 2)?,
        message_type: text_or_empty(row, 3)?,
        biz_key: text_or_empty(row, 4)?,
        payload,
        headers: kit::headers_from_column(text(row, 6)?.as_deref()),
        retry_count: count(7)?,
        max_retry_count: count(8)?,
        created_at: system_time(text(row, 9)?).unwrap_or(SystemTime::UNIX_EPOCH),
        claim_token: ClaimToken(text_or_empty(row, 10)?),
    })
}

impl MysqlInboxStore {
    /// Runs one statement outside an explicit transaction; returns the rows it changed.
    async fn change(&self, sql: String, what: &str) -> Result<u64, ConnectorError> {
        self.with_conn(what, async |conn| {
            conn.query_drop(sql.as_str()).await?;
            Ok(conn.affected_rows())
        })
        .await
    }
}

impl InboxAdmin for MysqlInboxStore {
    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let sql = format!(
            "SELECT status, message_type, COUNT(*), MIN(created_at) FROM {} GROUP BY 1, 2 ORDER BY 1, 2",
            self.table
        );
        let rows: Vec<Row> = self
            .with_conn("counting inbox rows", async |conn| {
                conn.query(sql.as_str()).await
            })
            .await?;
        let mut summary = StatusSummary::default();
        for row in &rows {
            let count = StatusCount {
                status: text_or_empty(row, 0)?,
                message_type: text_or_empty(row, 1)?,
                rows: int(row, 2)?.unwrap_or(0),
            };
            let oldest = system_time(text(row, 3)?);
            if [kit::PENDING, kit::FAILED, kit::PROCESSING].contains(&count.status.as_str()) {
                summary.oldest_unsent = summary.oldest_unsent.min(oldest).or(oldest);
            }
            summary.counts.push(count);
        }
        Ok(summary)
    }

    async fn retry_rows(&self, selector: &RetrySelector) -> Result<u64, ConnectorError> {
        selector.check()?;
        let set = format!(
            "UPDATE {} SET status = 'FAILED', next_retry_time = NOW(6), retry_count = 0, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)",
            self.table
        );
        let sql = match selector {
            RetrySelector::Id(id) => {
                format!("{set} WHERE id = {id} AND status IN ('FAILED', 'MANUAL_REQUIRED')")
            }
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let of_type = message_type.as_deref().map_or(String::new(), |t| {
                    format!(" AND message_type = {}", sql_string(t))
                });
                format!("{set} WHERE status = {}{of_type}", sql_string(status))
            }
        };
        self.change(sql, "making inbox rows due again").await
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', next_retry_time = NOW(6), last_error = {}, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status IN ('PENDING', 'FAILED')",
            self.table,
            sql_string(&parked_by_operator(reason))
        );
        Ok(self.change(sql, &format!("parking inbox row {id}")).await? > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'DONE', processed_at = NOW(6), next_retry_time = NULL, \
             last_error = {}, claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status <> 'DONE'",
            self.table,
            sql_string(&resolved_without_handling(reason))
        );
        Ok(self
            .change(sql, &format!("resolving inbox row {id}"))
            .await?
            > 0)
    }

    async fn janitor_batch(
        &self,
        retention: Duration,
        dedupe_retention: Duration,
        action: &JanitorAction,
        batch: usize,
    ) -> Result<u64, ConnectorError> {
        if batch == 0 {
            return Ok(0);
        }
        let table = &self.table;
        let select = format!(
            "SELECT id FROM {table} WHERE status = 'DONE' \
             AND processed_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             AND created_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED",
            delay_ms(retention),
            delay_ms(dedupe_retention)
        );
        let archive = match action {
            JanitorAction::Delete => None,
            JanitorAction::Archive(name) => Some(qualified(name)),
        };
        self.with_conn("removing old DONE inbox rows", async |conn| {
            if let Some(archive) = &archive {
                conn.query_drop(format!("CREATE TABLE IF NOT EXISTS {archive} LIKE {table}"))
                    .await?;
            }
            conn.query_drop("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
                .await?;
            let ids: Vec<i64> = conn.query(select.as_str()).await?;
            if ids.is_empty() {
                conn.query_drop("COMMIT").await?;
                return Ok(0);
            }
            let list = id_list(ids);
            if let Some(archive) = &archive {
                conn.query_drop(format!(
                    "INSERT INTO {archive} SELECT * FROM {table} WHERE id IN ({list})"
                ))
                .await?;
            }
            conn.query_drop(format!("DELETE FROM {table} WHERE id IN ({list})"))
                .await?;
            let removed = conn.affected_rows();
            conn.query_drop("COMMIT").await?;
            Ok(removed)
        })
        .await
    }
}
