//! The MySQL/MariaDB [`InboxStore`] and its [`TableAdmin`](outboxd_connector::TableAdmin):
//! the semantics of the PostgreSQL store (`connectors/postgres/src/store/inbox.rs`) in
//! MySQL's dialect.
//!
//! **Insert** is one transaction of multi-row statements that say exactly which message
//! was stored (`inbox_insert.rs`). The operator's actions are in `inbox_operator.rs`.
//!
//! **Claim** (MySQL has no `UPDATE … RETURNING`): one READ COMMITTED transaction of a
//! `SELECT … FOR UPDATE SKIP LOCKED` per status, an `UPDATE` to PROCESSING with a `UUID()`
//! token each, and a `SELECT` of the claimed rows, in two round trips.
//!
//! **Indexes**: MySQL has no partial index, and the table keeps its DONE rows until the
//! janitor removes them. So `status` leads the due index `(status, next_retry_time, id)`,
//! which gives each claim, the reaper, the schedule and the janitor their rows in order
//! without reading DONE rows; and the key index `(biz_key, status, id)` answers "is an
//! earlier row of this key open?" with one probe per open status (four `NOT EXISTS`, each
//! an index range), however many DONE rows the key has. One `status IN (…)` subquery would
//! read the key's whole history for every candidate row.
//!
//! Every value is a number or a hex literal ([`sql_string`], [`hex_literal`]), as in the
//! outbox store, so no `sql_mode` or character set changes what a statement means; the SQL
//! handler's statement gets the message's fields as bound text parameters.
//!
//! Errors: a broken connection, a deadlock or a lock wait is transient (the connection is
//! dropped, so the server rolls back, and the next call reconnects); a missing table or
//! column is definite and names `outboxd init`; a handler statement the server refuses is
//! the message's failed attempt ([`Completed::StatementFailed`]), not the store's.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use outboxd_connector::{
    last_error_text, ClaimToken, ClaimedMessage, Completed, ConnectorError, InboxMessage,
    InboxOutcome, InboxStore, Ingested, OwnMessageState, ReapPolicy, ReapReport, RetrySchedule,
};
use outboxd_connector_kit::inbox as kit;
use tokio::sync::Mutex;

use crate::client::{classify, int, query, query_first, text, text_or_empty};
use crate::log::server;
use crate::schema::{qualified, quote_ident, sql_string, table_ident};
use crate::store::claims::{id_list, next_retry, FAILED_STATUS};
use crate::store::delay_ms;
use crate::time::system_time;
use crate::MysqlConnector;

/// The smallest `max_allowed_packet` the server accepts; assumed when it cannot be read.
const MIN_PACKET: usize = 1024;

/// Opens an insert's, claim's or reap's transaction. READ COMMITTED takes no gap locks, so
/// claims and ingestion do not block each other.
pub(super) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
/// Statements [`BEGIN`] adds in front of a multi-statement text's answers.
pub(super) const BEGIN_STATEMENTS: usize = 2;

/// MySQL error codes that mean the table or a column is not there (`outboxd init`).
const NO_SUCH_TABLE: u16 = 1146;
const NO_SUCH_COLUMN: u16 = 1054;

/// The columns a claim reads, in [`claimed_from_row`]'s order.
const CLAIM_COLUMNS: &str = "id, source, message_id, message_type, biz_key, payload, headers, \
     retry_count, max_retry_count, created_at, claim_token";

/// How the payload column stores a message's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Payload {
    /// `JSON` (MySQL), or MariaDB's JSON alias (`LONGTEXT` with a `json_valid` check).
    Json,
    /// A BLOB or (VAR)BINARY column: the bytes as received.
    Bytes,
    /// Any other text column: the body as text (lossy for non-UTF-8).
    Text,
}

/// The inbox table of one MySQL/MariaDB database.
///
/// Holds one connection, reconnecting on the next call after it broke; ingress and the
/// workers each open their own store, so a slow handler statement does not hold up
/// ingestion.
#[derive(Debug)]
pub struct MysqlInboxStore {
    pub(super) connector: MysqlConnector,
    /// The table, quoted for SQL.
    pub(super) table: String,
    pub(super) payload: Payload,
    conn: Mutex<Option<InboxConn>>,
}

/// The held connection and what was read about it once.
#[derive(Debug)]
pub(super) struct InboxConn {
    pub(super) conn: Conn,
    /// `max_allowed_packet`: the server refuses (and would refuse on every retry) a longer
    /// query text.
    pub(super) max_packet: usize,
}

/// One statement's answer in a multi-statement text.
pub(super) struct Answer {
    pub(super) rows: Vec<Row>,
    pub(super) affected: u64,
    pub(super) insert_id: Option<u64>,
}

/// A multi-statement text failed at statement `at` (0-based); the statements before it ran.
pub(super) struct Failure {
    pub(super) at: usize,
    pub(super) error: mysql_async::Error,
}

impl MysqlInboxStore {
    /// Connects and checks the table; a missing table or column is a definite error that
    /// names `outboxd init`.
    pub(crate) async fn open(connector: &MysqlConnector) -> Result<Self, ConnectorError> {
        let table = qualified(&connector.layout.inbox_table);
        let mut store = Self {
            connector: connector.clone(),
            table,
            payload: Payload::Text,
            conn: Mutex::new(None),
        };
        let mut held = store.connect().await?;
        let conn = &mut held.conn;
        let context = store.context("reading the inbox table", NO_SUCH_TABLE);
        let probe = format!(
            "SELECT {CLAIM_COLUMNS}, status, next_retry_time, claimed_at, last_error, updated_at, \
             processed_at FROM {} LIMIT 0",
            store.table
        );
        query(conn, &probe, &context).await?;
        store.payload = payload_kind(conn, connector, &context).await?;
        *store.conn.get_mut() = Some(held);
        Ok(store)
    }

    async fn connect(&self) -> Result<InboxConn, ConnectorError> {
        let mut conn = self.connector.sql_conn().await?;
        let row = query_first(
            &mut conn,
            "SELECT @@max_allowed_packet",
            &self.context("reading max_allowed_packet", 0),
        )
        .await?;
        let max_packet = row
            .map(|r| int(&r, 0))
            .transpose()?
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(MIN_PACKET);
        Ok(InboxConn { conn, max_packet })
    }

    /// `what` with the table and server; with the fix when `code` says the table or a
    /// column is missing.
    pub(super) fn context(&self, what: &str, code: u16) -> String {
        let hint = match code {
            NO_SUCH_TABLE | NO_SUCH_COLUMN => {
                "; run `outboxd check` (`outboxd init` creates the inbox table)"
            }
            _ => "",
        };
        format!(
            "{what} (inbox table {} on {}{hint})",
            self.connector.layout.inbox_table,
            self.connector.endpoint()
        )
    }

    /// `e` classified, in the context of `what`.
    pub(super) fn fail(&self, what: &str, e: &mysql_async::Error) -> ConnectorError {
        let code = match e {
            mysql_async::Error::Server(server) => server.code,
            _ => 0,
        };
        classify(e, &self.context(what, code))
    }

    /// Runs `work` on the connection (reconnecting first when the last one broke); drops
    /// the connection when `work` fails, so the server rolls back an open transaction.
    pub(super) async fn with_conn<T>(
        &self,
        work: impl AsyncFnOnce(&mut InboxConn) -> Result<T, ConnectorError>,
    ) -> Result<T, ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        let Some(held) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = work(held).await;
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// Runs one statement (outside an explicit transaction, so atomic by itself); returns
    /// the rows it changed.
    pub(super) async fn change(&self, sql: &str, what: &str) -> Result<u64, ConnectorError> {
        self.with_conn(async |s| {
            s.conn
                .query_drop(sql)
                .await
                .map_err(|e| self.fail(what, &e))?;
            Ok(s.conn.affected_rows())
        })
        .await
    }

    /// `AND`ed conditions: no row of `i`'s key with a lower id is open. One `NOT EXISTS` per
    /// open status, so each is a range of the key index that skips the key's DONE rows.
    fn free(&self) -> String {
        (kit::OPEN.iter())
            .map(|status| {
                format!(
                    "NOT EXISTS (SELECT 1 FROM {} e WHERE e.biz_key = i.biz_key \
                     AND e.status = '{status}' AND e.id < i.id)",
                    self.table
                )
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// The rows of `status` (PENDING or FAILED) that are due and free, in the due index's
    /// order: `(id, due time)`, at most `limit`, locked. A row's due time is
    /// `COALESCE(next_retry_time, created_at)`; written through this store, a PENDING row
    /// has no `next_retry_time` and a FAILED one has.
    fn due_rows(&self, status: &str, limit: usize) -> String {
        format!(
            "SELECT i.id, COALESCE(i.next_retry_time, i.created_at) FROM {} i \
             WHERE i.status = '{status}' AND (i.next_retry_time IS NULL OR i.next_retry_time <= NOW(6)) \
             AND COALESCE(i.next_retry_time, i.created_at) <= NOW(6) AND {} \
             ORDER BY i.next_retry_time, i.id LIMIT {limit} FOR UPDATE SKIP LOCKED",
            self.table,
            self.free()
        )
    }

    /// The earliest due time of a free row of `status`: the first in the due index's order.
    fn next_due(&self, status: &str) -> String {
        format!(
            "(SELECT COALESCE(i.next_retry_time, i.created_at) FROM {} i \
             WHERE i.status = '{status}' AND {} ORDER BY i.next_retry_time, i.id LIMIT 1)",
            self.table,
            self.free()
        )
    }

    /// A claimed row's condition: only while this claim holds.
    fn held(message: &ClaimedMessage) -> String {
        format!(
            "id = {} AND claim_token = {} AND status = 'PROCESSING'",
            message.id,
            sql_string(&message.claim_token.0)
        )
    }

    /// The `UPDATE` that writes `outcome` while the claim holds.
    fn outcome_sql(&self, message: &ClaimedMessage, outcome: InboxOutcome<'_>) -> String {
        let release = "claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)";
        let set = match outcome {
            InboxOutcome::Done { .. } => "status = 'DONE', processed_at = NOW(6), \
                 last_error = NULL, next_retry_time = NULL"
                .to_owned(),
            // FAILED_STATUS first: it reads retry_count before the increment.
            InboxOutcome::Failed { error, retry_delay } => format!(
                "{FAILED_STATUS}, retry_count = retry_count + 1, next_retry_time = {}, \
                 last_error = {}",
                next_retry(&delay_ms(retry_delay).to_string()),
                sql_string(&last_error_text(error))
            ),
            InboxOutcome::ManualRequired { reason } => format!(
                "status = 'MANUAL_REQUIRED', next_retry_time = NOW(6), last_error = {}",
                sql_string(&last_error_text(reason))
            ),
            InboxOutcome::Released { reason } => format!(
                "status = 'PENDING', next_retry_time = NULL, last_error = {}",
                sql_string(&last_error_text(reason))
            ),
        };
        format!(
            "UPDATE {} SET {set}, {release} WHERE {}",
            self.table,
            Self::held(message)
        )
    }
}

/// How the payload column of the configured table stores a body. MariaDB reports its JSON
/// alias as `longtext` and keeps the `json_valid` check in `CHECK_CONSTRAINTS` (which has no
/// `TABLE_NAME` column on MySQL, whose JSON type is reported as `json`).
async fn payload_kind(
    conn: &mut Conn,
    connector: &MysqlConnector,
    context: &str,
) -> Result<Payload, ConnectorError> {
    let (db, name) = table_ident(&connector.layout.inbox_table, &connector.config().database);
    let sql = format!(
        "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} \
         AND TABLE_NAME = {} AND COLUMN_NAME = 'payload'",
        sql_string(&db),
        sql_string(&name)
    );
    let data_type = match query_first(conn, &sql, context).await? {
        Some(row) => text_or_empty(&row, 0)?.to_ascii_lowercase(),
        None => String::new(),
    };
    if data_type == "json" {
        return Ok(Payload::Json);
    }
    if data_type.contains("blob") || data_type.contains("binary") {
        return Ok(Payload::Bytes);
    }
    if data_type == "longtext" && server::info(conn).await?.mariadb {
        let sql = format!(
            "SELECT 1 FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = {} \
             AND TABLE_NAME = {} AND REPLACE(CHECK_CLAUSE, ' ', '') LIKE '%json\\_valid(`payload`)%'",
            sql_string(&db),
            sql_string(&name)
        );
        if query_first(conn, &sql, context).await?.is_some() {
            return Ok(Payload::Json);
        }
        // MariaDB (10.11) shows CHECK_CONSTRAINTS nothing of a table the user holds only
        // table-level grants on (the runtime user of README's "Privileges"); SHOW CREATE
        // TABLE, which those grants allow, has the same check.
        let sql = format!(
            "SHOW CREATE TABLE {}.{}",
            quote_ident(&db),
            quote_ident(&name)
        );
        if let Some(row) = query_first(conn, &sql, context).await? {
            if text_or_empty(&row, 1)?
                .replace(' ', "")
                .contains("json_valid(`payload`)")
            {
                return Ok(Payload::Json);
            }
        }
    }
    Ok(Payload::Text)
}

/// Runs `sql` (one or more statements) and returns each statement's answer, in order.
pub(super) async fn answers(conn: &mut Conn, sql: &str) -> Result<Vec<Answer>, Failure> {
    let mut out = Vec::new();
    let mut result = conn
        .query_iter(sql)
        .await
        .map_err(|error| Failure { at: 0, error })?;
    // A statement's answer is pending while `columns()` is `Some` (no columns: an OK).
    // `is_empty()` alone is no end: it is true while the last statement's OK is pending,
    // and false while a failed statement's error is (which `collect` then returns).
    while result.columns().is_some() || !result.is_empty() {
        let affected = result.affected_rows();
        let insert_id = result.last_insert_id();
        // The pending error, or this set's rows failing mid-way: this statement's.
        let rows = result.collect::<Row>().await.map_err(|error| Failure {
            at: out.len(),
            error,
        })?;
        out.push(Answer {
            rows,
            affected,
            insert_id,
        });
    }
    Ok(out)
}

/// The answers of `sql`, a failure classified in the context of `what`.
pub(super) async fn answers_of(
    store: &MysqlInboxStore,
    conn: &mut Conn,
    sql: &str,
    what: &str,
) -> Result<Vec<Answer>, ConnectorError> {
    answers(conn, sql)
        .await
        .map_err(|f| store.fail(what, &f.error))
}

/// `answers[at]`, or an error saying the server answered fewer statements than were sent.
pub(super) fn answer(answers: &mut [Answer], at: usize) -> Result<&mut Answer, ConnectorError> {
    let count = answers.len();
    answers.get_mut(at).ok_or_else(|| {
        ConnectorError::definite(format!(
            "unexpected answer from MySQL: {count} results, expected at least {}",
            at + 1
        ))
    })
}

impl InboxStore for MysqlInboxStore {
    fn payload_is_json(&self) -> bool {
        self.payload == Payload::Json
    }

    async fn insert(&self, messages: &[InboxMessage]) -> Result<Vec<Ingested>, ConnectorError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<String> = messages.iter().map(|m| self.row_sql(m)).collect();
        if messages.len() > 1 {
            match self.insert_rows(messages, &rows).await {
                Ok(Some(outcomes)) => return Ok(outcomes),
                Ok(None) => tracing::debug!(
                    messages = messages.len(),
                    "a concurrent insert of the same message made the batch's outcome \
                     ambiguous; storing it again one statement per message"
                ),
                Err(e) if e.is_transient() => return Err(e),
                // Again one statement per message: the error then names the message.
                Err(e) => tracing::debug!(error = %e, "a multi-row inbox insert was refused"),
            }
        }
        self.insert_each(messages, &rows).await
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedMessage>, ConnectorError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let what = "claiming inbox messages";
        let select = format!(
            "{BEGIN}; {}; {}",
            self.due_rows(kit::PENDING, limit),
            self.due_rows(kit::FAILED, limit)
        );
        let table = &self.table;
        let rows = self
            .with_conn(async |s| {
                let mut answers = answers_of(self, &mut s.conn, &select, what).await?;
                let mut due = Vec::new();
                for at in [BEGIN_STATEMENTS, BEGIN_STATEMENTS + 1] {
                    for row in &answer(&mut answers, at)?.rows {
                        let id = int(row, 0)?.ok_or_else(|| no_id(table))?;
                        due.push((system_time(text(row, 1)?), id));
                    }
                }
                // Oldest first across both statuses; the rows beyond `limit` stay locked
                // only until the COMMIT below.
                due.sort_unstable();
                due.truncate(limit);
                if due.is_empty() {
                    s.conn
                        .query_drop("COMMIT")
                        .await
                        .map_err(|e| self.fail(what, &e))?;
                    return Ok(Vec::new());
                }
                let ids = id_list(due.iter().map(|(_, id)| *id));
                let claim = format!(
                    "UPDATE {table} SET status = 'PROCESSING', claimed_at = NOW(6), \
                     claim_token = UUID(), updated_at = NOW(6) WHERE id IN ({ids}); \
                     SELECT {CLAIM_COLUMNS} FROM {table} WHERE id IN ({ids}) ORDER BY id; COMMIT"
                );
                let mut answers = answers_of(self, &mut s.conn, &claim, what).await?;
                Ok(std::mem::take(&mut answer(&mut answers, 1)?.rows))
            })
            .await?;
        rows.iter()
            .map(|row| claimed_from_row(row, table))
            .collect()
    }

    async fn complete(
        &self,
        message: &ClaimedMessage,
        outcome: InboxOutcome<'_>,
    ) -> Result<Completed, ConnectorError> {
        let update = self.outcome_sql(message, outcome);
        let what = format!("writing back inbox message {}", message.id);
        let InboxOutcome::Done {
            statement: Some(statement),
        } = outcome
        else {
            // One statement: atomic without an explicit transaction.
            return Ok(match self.change(&update, &what).await? {
                0 => Completed::ClaimLost,
                _ => Completed::Written,
            });
        };
        let (sql, fields) = kit::bind_named(statement, |_| "?".into())?;
        let params: Vec<Value> = fields
            .iter()
            .map(|f| Value::from(f.text(message)))
            .collect();
        let begin = format!("{BEGIN}; {update}");
        self.with_conn(async |s| {
            let mut answers = answers_of(self, &mut s.conn, &begin, &what).await?;
            if answer(&mut answers, BEGIN_STATEMENTS)?.affected == 0 {
                // Not this worker's row any more: the handler's statement must not run.
                s.conn
                    .query_drop("ROLLBACK")
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
                return Ok(Completed::ClaimLost);
            }
            let handler = "running the inbox SQL handler";
            let refused = |e: &mysql_async::ServerError| {
                format!(
                    "SQL handler: {} (error {}, SQLSTATE {})",
                    e.message, e.code, e.state
                )
            };
            // Prepared first (the connection caches it): a `?` of its own is a fault of the
            // statement, found before executing, since mysql_async closes the connection on
            // a parameter-count mismatch.
            let failed = match s.conn.prep(sql.as_str()).await {
                Err(mysql_async::Error::Server(e)) => Some(refused(&e)),
                Err(e) => return Err(self.fail(handler, &e)),
                Ok(prepared) if usize::from(prepared.num_params()) != params.len() => {
                    Some(format!(
                        "SQL handler: the statement takes {} parameters but names {} fields of \
                         the message; a `?` is not a field, name them as :id, :source, \
                         :message_id, :message_type, :biz_key, :payload, :headers",
                        prepared.num_params(),
                        params.len()
                    ))
                }
                Ok(prepared) => match s.conn.exec_drop(&prepared, params).await {
                    Ok(()) => None,
                    Err(mysql_async::Error::Server(e)) => Some(refused(&e)),
                    Err(e) => return Err(self.fail(handler, &e)),
                },
            };
            if let Some(failed) = failed {
                s.conn
                    .query_drop("ROLLBACK")
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
                return Ok(Completed::StatementFailed(failed));
            }
            s.conn
                .query_drop("COMMIT")
                .await
                .map_err(|e| self.fail(&what, &e))?;
            Ok(Completed::Written)
        })
        .await
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let table = &self.table;
        let what = "returning expired inbox claims to FAILED";
        // SKIP LOCKED: a row being completed by its worker right now is not stale.
        let select = format!(
            "{BEGIN}; SELECT id FROM {table} WHERE status = 'PROCESSING' \
             AND claimed_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND FOR UPDATE SKIP LOCKED",
            delay_ms(policy.claim_timeout)
        );
        let reason = sql_string(&policy.reaped_reason());
        let delay = next_retry(&delay_ms(policy.retry_delay).to_string());
        let statuses = self
            .with_conn(async |s| {
                let mut answers = answers_of(self, &mut s.conn, &select, what).await?;
                let ids = (answer(&mut answers, BEGIN_STATEMENTS)?.rows.iter())
                    .map(|row| int(row, 0)?.ok_or_else(|| no_id(table)))
                    .collect::<Result<Vec<i64>, _>>()?;
                if ids.is_empty() {
                    s.conn
                        .query_drop("COMMIT")
                        .await
                        .map_err(|e| self.fail(what, &e))?;
                    return Ok(Vec::new());
                }
                let ids = id_list(ids);
                let reap = format!(
                    "UPDATE {table} SET {FAILED_STATUS}, retry_count = retry_count + 1, \
                     next_retry_time = {delay}, last_error = {reason}, claimed_at = NULL, \
                     claim_token = NULL, updated_at = NOW(6) WHERE id IN ({ids}); \
                     SELECT status FROM {table} WHERE id IN ({ids}); COMMIT"
                );
                let mut answers = answers_of(self, &mut s.conn, &reap, what).await?;
                Ok(std::mem::take(&mut answer(&mut answers, 1)?.rows))
            })
            .await?;
        let mut report = ReapReport::default();
        for row in &statuses {
            if text_or_empty(row, 0)? == kit::MANUAL_REQUIRED {
                report.manual_required += 1;
            } else {
                report.failed += 1;
            }
        }
        Ok(report)
    }

    async fn own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<Vec<OwnMessageState>, ConnectorError> {
        self.read_own_messages(source, message_ids).await
    }

    async fn delete_own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<u64, ConnectorError> {
        self.delete_own_messages_of(source, message_ids).await
    }

    async fn create_scratch_table(&self, name: &str) -> Result<String, ConnectorError> {
        self.create_scratch(name).await
    }

    async fn scratch_rows(&self, name: &str) -> Result<Vec<(String, String)>, ConnectorError> {
        self.read_scratch(name).await
    }

    async fn drop_scratch_table(&self, name: &str) -> Result<(), ConnectorError> {
        self.drop_scratch(name).await
    }

    async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let sql = format!(
            "SELECT {}, {}, (SELECT MIN(claimed_at) FROM {} WHERE status = 'PROCESSING')",
            self.next_due(kit::PENDING),
            self.next_due(kit::FAILED),
            self.table
        );
        let what = "reading the inbox schedule";
        let row = self
            .with_conn(async |s| {
                (s.conn.query_first::<Row, _>(sql.as_str()).await).map_err(|e| self.fail(what, &e))
            })
            .await?;
        let Some(row) = row else {
            return Ok(RetrySchedule::default());
        };
        let pending = system_time(text(&row, 0)?);
        let failed = system_time(text(&row, 1)?);
        Ok(RetrySchedule {
            next_due: pending.min(failed).or(pending).or(failed),
            oldest_claim: system_time(text(&row, 2)?),
        })
    }
}

pub(super) fn no_id(table: &str) -> ConnectorError {
    ConnectorError::definite(format!(
        "unexpected answer from MySQL: a row of {table} without an id"
    ))
}

fn claimed_from_row(row: &Row, table: &str) -> Result<ClaimedMessage, ConnectorError> {
    let id = int(row, 0)?.ok_or_else(|| no_id(table))?;
    let count = |at: usize| -> Result<i32, ConnectorError> {
        let n = int(row, at)?.unwrap_or(0);
        i32::try_from(n).map_err(|_| {
            ConnectorError::definite(format!(
                "inbox row {id} of {table}: a retry count of {n} is out of range"
            ))
        })
    };
    // A binary column comes as bytes; JSON and text as their UTF-8 text.
    let payload = match row.as_ref(5) {
        Some(Value::Bytes(b)) => b.clone(),
        _ => text(row, 5)?.unwrap_or_default().into_bytes(),
    };
    let created_at = system_time(text(row, 9)?).ok_or_else(|| {
        ConnectorError::definite(format!(
            "inbox row {id} of {table}: created_at is not a date-time"
        ))
    })?;
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
        created_at,
        claim_token: ClaimToken(text_or_empty(row, 10)?),
    })
}
