//! The MySQL/MariaDB [`InboxStore`] and [`InboxAdmin`]: the semantics of the PostgreSQL
//! store (`connectors/postgres/src/store/inbox.rs`) in MySQL's dialect.
//!
//! **Insert** is one transaction. A batch is sent as multi-row `INSERT … ON DUPLICATE KEY
//! UPDATE id = id` statements (at most 500 rows and ~1 MiB each, below the connection's
//! `max_allowed_packet`), each followed in the same round trip by a `SELECT` of the rows
//! with one of its `(source, message_id)` pairs and an id from `LAST_INSERT_ID()` (its first
//! stored row) on; `COMMIT` once all are read. Which message was stored is then exact, not
//! guessed: the affected-row count is the number of rows the statement stored (a duplicate
//! by either unique key counts 0: the connection does not set `CLIENT_FOUND_ROWS`), and each
//! stored row is the one of the first message with all four of its key values. One
//! ambiguity is left: another transaction committing one of the batch's own messages
//! while the statement ran, with an id in its range; the count shows it, and the batch is
//! rolled back and stored again as one `INSERT` per message, whose OK packets say exactly
//! what each did (one message alone is always stored that way; a refused batch is retried
//! that way too, so that the error names the message). Multi-row statements because they
//! are ~1.6 times as fast as one statement per row (the ingest target is 20k rows/s).
//! `INSERT IGNORE` is not used: it would also turn bad data into warnings.
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

use std::collections::HashMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use outboxd_connector::{
    last_error_text, parked_by_operator, resolved_without_handling, ClaimToken, ClaimedMessage,
    Completed, ConnectorError, InboxAdmin, InboxMessage, InboxOutcome, InboxStore, Ingested,
    JanitorAction, ReapPolicy, ReapReport, RetrySchedule, RetrySelector, StatusCount,
    StatusSummary,
};
use outboxd_connector_kit::inbox as kit;
use tokio::sync::Mutex;

use crate::client::{classify, int, query, query_first, text, text_or_empty};
use crate::log::server;
use crate::schema::{hex_literal, qualified, quote_ident, sql_string, table_ident};
use crate::store::claims::{id_list, next_retry, FAILED_STATUS};
use crate::store::delay_ms;
use crate::time::system_time;
use crate::MysqlConnector;

/// Bytes of statement text per round trip of an insert, at most: big enough for a batch
/// of ordinary messages, small enough to keep one text's parse and send time short.
const INSERT_TEXT_BYTES: usize = 1024 * 1024;
/// Rows per multi-row INSERT at most: keeps the mapping query's `IN` list a plain range of
/// the unique index (MariaDB turns a list of 1000 or more values into a subquery).
const ROWS_PER_INSERT: usize = 500;
/// Bytes of a query text kept free below `max_allowed_packet` (the packet's command byte,
/// the transaction statements around the inserts).
const PACKET_MARGIN: usize = 1024;
/// The smallest `max_allowed_packet` the server accepts; assumed when it cannot be read.
const MIN_PACKET: usize = 1024;

/// Opens an insert's, claim's or reap's transaction. READ COMMITTED takes no gap locks, so
/// claims and ingestion do not block each other.
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
/// Statements [`BEGIN`] adds in front of a multi-statement text's answers.
const BEGIN_STATEMENTS: usize = 2;

/// MySQL error codes that mean the table or a column is not there (`outboxd init`).
const NO_SUCH_TABLE: u16 = 1146;
const NO_SUCH_COLUMN: u16 = 1054;

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
    connector: MysqlConnector,
    /// The table, quoted for SQL.
    table: String,
    payload: Payload,
    session: Mutex<Option<Session>>,
}

/// The held connection and what was read about it once.
#[derive(Debug)]
struct Session {
    conn: Conn,
    /// `max_allowed_packet`: the server refuses (and would refuse on every retry) a longer
    /// query text.
    max_packet: usize,
}

/// One statement's answer in a multi-statement text.
struct Answer {
    rows: Vec<Row>,
    affected: u64,
    insert_id: Option<u64>,
}

/// A multi-statement text failed at statement `at` (0-based); the statements before it ran.
struct Failure {
    at: usize,
    error: mysql_async::Error,
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
            session: Mutex::new(None),
        };
        let mut session = store.connect().await?;
        let conn = &mut session.conn;
        let context = store.context("reading the inbox table", NO_SUCH_TABLE);
        let probe = format!(
            "SELECT {CLAIM_COLUMNS}, status, next_retry_time, claimed_at, last_error, updated_at, \
             processed_at FROM {} LIMIT 0",
            store.table
        );
        query(conn, &probe, &context).await?;
        store.payload = payload_kind(conn, connector, &context).await?;
        *store.session.get_mut() = Some(session);
        Ok(store)
    }

    async fn connect(&self) -> Result<Session, ConnectorError> {
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
        Ok(Session { conn, max_packet })
    }

    /// `what` with the table and server; with the fix when `code` says the table or a
    /// column is missing.
    fn context(&self, what: &str, code: u16) -> String {
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
    fn fail(&self, what: &str, e: &mysql_async::Error) -> ConnectorError {
        let code = match e {
            mysql_async::Error::Server(server) => server.code,
            _ => 0,
        };
        classify(e, &self.context(what, code))
    }

    /// Runs `work` on the connection (reconnecting first when the last one broke); drops
    /// the connection when `work` fails, so the server rolls back an open transaction.
    async fn with_session<T>(
        &self,
        work: impl AsyncFnOnce(&mut Session) -> Result<T, ConnectorError>,
    ) -> Result<T, ConnectorError> {
        let mut slot = self.session.lock().await;
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        let Some(session) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = work(session).await;
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// Runs one statement (outside an explicit transaction, so atomic by itself); returns
    /// the rows it changed.
    async fn change(&self, sql: &str, what: &str) -> Result<u64, ConnectorError> {
        self.with_session(async |s| {
            s.conn
                .query_drop(sql)
                .await
                .map_err(|e| self.fail(what, &e))?;
            Ok(s.conn.affected_rows())
        })
        .await
    }

    /// The payload as an SQL expression for this table's column.
    fn payload_sql(&self, message: &InboxMessage) -> String {
        match self.payload {
            Payload::Json => sql_string(&kit::json_payload(message)),
            Payload::Text => sql_string(&String::from_utf8_lossy(&message.payload)),
            Payload::Bytes => hex_literal(&message.payload),
        }
    }

    /// `INSERT INTO … VALUES`, before the rows of [`Self::row_sql`].
    fn insert_head(&self) -> String {
        format!(
            "INSERT INTO {} (source, message_id, message_type, biz_key, payload, headers, status, \
             last_error, next_retry_time) VALUES ",
            self.table
        )
    }

    /// One message's row of an `INSERT`: a rejected message is stored MANUAL_REQUIRED with
    /// its reason, any other PENDING.
    fn row_sql(&self, message: &InboxMessage) -> String {
        let (status, reason, due) = match &message.rejected {
            Some(reason) => (
                kit::MANUAL_REQUIRED,
                sql_string(&last_error_text(reason)),
                "NOW(6)",
            ),
            None => (kit::PENDING, "NULL".to_owned(), "NULL"),
        };
        format!(
            "({}, {}, {}, {}, {}, {}, '{status}', {reason}, {due})",
            sql_string(&message.source),
            sql_string(&message.message_id),
            sql_string(&message.message_type),
            sql_string(&message.biz_key),
            self.payload_sql(message),
            sql_string(&kit::headers_json(message)),
        )
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
async fn answers(conn: &mut Conn, sql: &str) -> Result<Vec<Answer>, Failure> {
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
async fn answers_of(
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
fn answer(answers: &mut [Answer], at: usize) -> Result<&mut Answer, ConnectorError> {
    let count = answers.len();
    answers.get_mut(at).ok_or_else(|| {
        ConnectorError::definite(format!(
            "unexpected answer from MySQL: {count} results, expected at least {}",
            at + 1
        ))
    })
}

/// The insert statements cut into texts: the first opens the transaction, the last
/// commits, none longer than `limit` bytes unless a single statement is (checked by the
/// caller against the packet size).
fn insert_texts(statements: &[String], limit: usize) -> Vec<String> {
    let mut texts = Vec::new();
    let mut text = format!("{BEGIN};\n");
    for statement in statements {
        if text.len() + statement.len() + ";\nCOMMIT".len() > limit {
            texts.push(std::mem::take(&mut text));
        }
        text.push_str(statement);
        text.push_str(";\n");
    }
    text.push_str("COMMIT");
    texts.push(text);
    texts
}

/// `message` named for an error, with its place in the batch.
fn naming(message: Option<(usize, &InboxMessage)>, batch: usize) -> String {
    match message {
        Some((at, m)) => format!(
            "storing inbox message `{}` from `{}` ({} of a batch of {batch})",
            m.message_id,
            m.source,
            at + 1
        ),
        None => format!("storing a batch of {batch} inbox messages"),
    }
}

impl MysqlInboxStore {
    /// The definite error for a message whose statement exceeds the packet size.
    fn too_large(
        &self,
        at: usize,
        messages: &[InboxMessage],
        bytes: usize,
        max: usize,
    ) -> ConnectorError {
        ConnectorError::definite(format!(
            "{}: its INSERT statement has {bytes} bytes, more than the server's \
             max_allowed_packet ({max} bytes) allows; raise max_allowed_packet (SET GLOBAL \
             max_allowed_packet and in the server's configuration) or refuse such large \
             messages at the sender",
            self.context(
                &naming(messages.get(at).map(|m| (at, m)), messages.len()),
                0
            ),
        ))
    }

    /// The batch as multi-row INSERTs, each followed by the query that says which of its
    /// messages were stored, in one transaction. `None` (rolled back) when that cannot be
    /// told exactly: another transaction stored one of the batch's own messages meanwhile.
    async fn insert_rows(
        &self,
        messages: &[InboxMessage],
        rows: &[String],
    ) -> Result<Option<Vec<Ingested>>, ConnectorError> {
        let head = self.insert_head();
        let tail = " ON DUPLICATE KEY UPDATE id = id;\n";
        let select = format!(
            "SELECT id, source, message_id, message_type, biz_key FROM {} \
             WHERE id >= LAST_INSERT_ID() AND (source, message_id) IN (",
            self.table
        );
        let pairs: Vec<String> = (messages.iter())
            .map(|m| format!("({}, {})", sql_string(&m.source), sql_string(&m.message_id)))
            .collect();
        let what = naming(None, messages.len());
        self.with_session(async |s| {
            let packet = s.max_packet.saturating_sub(PACKET_MARGIN);
            let fixed = BEGIN.len() + head.len() + tail.len() + select.len() + 8;
            if let Some(at) =
                (0..rows.len()).find(|&i| fixed + rows[i].len() + pairs[i].len() > packet)
            {
                return Err(self.too_large(
                    at,
                    messages,
                    fixed + rows[at].len() + pairs[at].len(),
                    s.max_packet,
                ));
            }
            let room = packet.min(INSERT_TEXT_BYTES).saturating_sub(fixed);
            let mut outcomes = Vec::with_capacity(messages.len());
            let mut start = 0;
            while start < rows.len() {
                let mut end = start;
                let mut used = 0;
                while end < rows.len() && end - start < ROWS_PER_INSERT {
                    let cost = rows[end].len() + pairs[end].len() + 4;
                    if end > start && used + cost > room {
                        break;
                    }
                    used += cost;
                    end += 1;
                }
                let begin = if start == 0 {
                    format!("{BEGIN};\n")
                } else {
                    String::new()
                };
                let text = format!(
                    "{begin}{head}{}{tail}{select}{})",
                    rows[start..end].join(", "),
                    pairs[start..end].join(", ")
                );
                let mut answers = answers_of(self, &mut s.conn, &text, &what).await?;
                let last = answers.len().saturating_sub(1);
                let stored = (answer(&mut answers, last)?.rows.iter())
                    .map(StoredRow::read)
                    .collect::<Result<Vec<_>, _>>()?;
                let inserted = answer(&mut answers, last.saturating_sub(1))?.affected;
                let Some(chunk) = stored_of(&messages[start..end], inserted, &stored) else {
                    s.conn
                        .query_drop("ROLLBACK")
                        .await
                        .map_err(|e| self.fail(&what, &e))?;
                    return Ok(None);
                };
                outcomes.extend(chunk);
                start = end;
            }
            s.conn
                .query_drop("COMMIT")
                .await
                .map_err(|e| self.fail(&what, &e))?;
            Ok(Some(outcomes))
        })
        .await
    }

    /// The batch as one `INSERT … ON DUPLICATE KEY UPDATE` per message, in one transaction:
    /// each statement's own OK packet says exactly what it did (1 row: stored with its
    /// insert id, 0: a duplicate), and a failing statement names its message.
    async fn insert_each(
        &self,
        messages: &[InboxMessage],
        rows: &[String],
    ) -> Result<Vec<Ingested>, ConnectorError> {
        let head = self.insert_head();
        let statements: Vec<String> = (rows.iter())
            .map(|row| format!("{head}{row} ON DUPLICATE KEY UPDATE id = id"))
            .collect();
        let what = |at: Option<usize>| {
            naming(
                at.and_then(|i| messages.get(i).map(|m| (i, m))),
                messages.len(),
            )
        };
        let counts = self
            .with_session(async |s| {
                let packet = s.max_packet.saturating_sub(PACKET_MARGIN);
                if let Some(at) =
                    (0..statements.len()).find(|&i| statements[i].len() + BEGIN.len() + 8 > packet)
                {
                    return Err(self.too_large(at, messages, statements[at].len(), s.max_packet));
                }
                let texts = insert_texts(&statements, packet.min(INSERT_TEXT_BYTES));
                let mut counts = Vec::with_capacity(messages.len() + BEGIN_STATEMENTS + 1);
                for text in &texts {
                    let done = counts.len();
                    let answers = answers(&mut s.conn, text).await.map_err(|f| {
                        let at = (done + f.at).checked_sub(BEGIN_STATEMENTS);
                        self.fail(&what(at), &f.error)
                    })?;
                    counts.extend(answers.into_iter().map(|a| (a.affected, a.insert_id)));
                }
                Ok(counts)
            })
            .await?;
        // BEGIN's statements first, COMMIT last, one answer per message in between.
        let inserts = counts
            .get(BEGIN_STATEMENTS..counts.len().saturating_sub(1))
            .filter(|inserts| inserts.len() == messages.len())
            .ok_or_else(|| {
                ConnectorError::definite(format!(
                    "unexpected answer from MySQL: {} results for {} inbox inserts",
                    counts.len(),
                    messages.len()
                ))
            })?;
        inserts
            .iter()
            .map(|&(affected, id)| match (affected, id) {
                (0, _) => Ok(Ingested::Duplicate),
                (1, Some(id)) => i64::try_from(id).map(Ingested::Stored).map_err(|_| {
                    ConnectorError::definite(format!("unexpected inbox row id {id} from MySQL"))
                }),
                _ => Err(ConnectorError::definite(format!(
                    "unexpected answer from MySQL to an inbox insert: {affected} rows affected, \
                     insert id {id:?} (is CLIENT_FOUND_ROWS set on the connection?)"
                ))),
            })
            .collect()
    }
}

/// `(id, [source, message_id, message_type, biz_key])` of a row the mapping query read.
#[derive(Debug)]
struct StoredRow(i64, [String; 4]);

impl StoredRow {
    fn read(row: &Row) -> Result<Self, ConnectorError> {
        let id = int(row, 0)?.ok_or_else(|| no_id("the inbox"))?;
        let values = [
            text_or_empty(row, 1)?,
            text_or_empty(row, 2)?,
            text_or_empty(row, 3)?,
            text_or_empty(row, 4)?,
        ];
        Ok(Self(id, values))
    }
}

/// Which of `messages` one multi-row INSERT stored, from the `inserted` count and the
/// `rows` `(id, source, message_id, message_type, biz_key)` that have a pair of the
/// batch and an id from the INSERT's first one on. A row is the one of the first message
/// with all four of its values (a later equal message was its duplicate); a message
/// without one was a duplicate. `None` when the matches are not as many as the rows
/// inserted: another transaction stored one of these messages meanwhile, with an id in the
/// same range, and which row is whose cannot be told (or the server changed a value it
/// stored).
fn stored_of(
    messages: &[InboxMessage],
    inserted: u64,
    rows: &[StoredRow],
) -> Option<Vec<Ingested>> {
    if inserted == 0 {
        // Nothing new, and LAST_INSERT_ID() was an earlier statement's.
        return Some(vec![Ingested::Duplicate; messages.len()]);
    }
    // The pair is unique in the table, so at most one row per pair.
    let mut by_pair: HashMap<(&str, &str), (i64, &str, &str)> = (rows.iter())
        .map(|StoredRow(id, [source, message_id, type_, key])| {
            (
                (source.as_str(), message_id.as_str()),
                (*id, type_.as_str(), key.as_str()),
            )
        })
        .collect();
    let mut matched: u64 = 0;
    let outcomes = (messages.iter())
        .map(|m| {
            let pair = (m.source.as_str(), m.message_id.as_str());
            match by_pair.get(&pair) {
                Some(&(id, type_, key)) if type_ == m.message_type && key == m.biz_key => {
                    by_pair.remove(&pair);
                    matched += 1;
                    Ingested::Stored(id)
                }
                _ => Ingested::Duplicate,
            }
        })
        .collect();
    // Each stored row matches its message; a row left over has a pair of the batch but
    // other values: another message's, whose duplicate the batch's was. More matches than
    // inserted rows: a concurrent one matched too.
    (matched == inserted).then_some(outcomes)
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
            .with_session(async |s| {
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
        self.with_session(async |s| {
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
            .with_session(async |s| {
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

    async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let sql = format!(
            "SELECT {}, {}, (SELECT MIN(claimed_at) FROM {} WHERE status = 'PROCESSING')",
            self.next_due(kit::PENDING),
            self.next_due(kit::FAILED),
            self.table
        );
        let what = "reading the inbox schedule";
        let row = self
            .with_session(async |s| {
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

fn no_id(table: &str) -> ConnectorError {
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

impl InboxAdmin for MysqlInboxStore {
    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let sql = format!(
            "SELECT status, message_type, COUNT(*), MIN(created_at) FROM {} \
             GROUP BY 1, 2 ORDER BY 1, 2",
            self.table
        );
        let what = "counting inbox rows";
        let rows: Vec<Row> = self
            .with_session(async |s| {
                (s.conn.query(sql.as_str()).await).map_err(|e| self.fail(what, &e))
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
        let (sql, what) = match selector {
            RetrySelector::Id(id) => (
                format!("{set} WHERE id = {id} AND status IN ('FAILED', 'MANUAL_REQUIRED')"),
                format!("making inbox row {id} due again"),
            ),
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let of_type = (message_type.as_deref()).map_or(String::new(), |t| {
                    format!(" AND message_type = {}", sql_string(t))
                });
                (
                    format!("{set} WHERE status = {}{of_type}", sql_string(status)),
                    format!("making {status} inbox rows due again"),
                )
            }
        };
        self.change(&sql, &what).await
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', next_retry_time = NOW(6), last_error = {}, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status IN ('PENDING', 'FAILED')",
            self.table,
            sql_string(&parked_by_operator(reason))
        );
        Ok(self
            .change(&sql, &format!("parking inbox row {id}"))
            .await?
            > 0)
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
            .change(&sql, &format!("resolving inbox row {id}"))
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
        // `next_retry_time IS NULL` (always so for DONE rows) lets the due index give the
        // oldest DONE rows in id order, without sorting every DONE row.
        let select = format!(
            "{BEGIN}; SELECT id FROM {table} WHERE status = 'DONE' AND next_retry_time IS NULL \
             AND processed_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             AND created_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED",
            delay_ms(retention),
            delay_ms(dedupe_retention)
        );
        let archive = match action {
            JanitorAction::Delete => None,
            JanitorAction::Archive(name) => {
                self.create_archive(name).await?;
                Some(qualified(name))
            }
        };
        let what = match action {
            JanitorAction::Delete => "deleting old DONE inbox rows".to_owned(),
            JanitorAction::Archive(name) => format!("moving old DONE inbox rows to {name}"),
        };
        self.with_session(async |s| {
            let mut answers = answers_of(self, &mut s.conn, &select, &what).await?;
            let ids = (answer(&mut answers, BEGIN_STATEMENTS)?.rows.iter())
                .map(|row| int(row, 0)?.ok_or_else(|| no_id(table)))
                .collect::<Result<Vec<i64>, _>>()?;
            if ids.is_empty() {
                s.conn
                    .query_drop("COMMIT")
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
                return Ok(0);
            }
            let list = id_list(ids);
            let copy = archive.as_ref().map_or(String::new(), |archive| {
                format!("INSERT INTO {archive} SELECT * FROM {table} WHERE id IN ({list}); ")
            });
            let delete = format!("{copy}DELETE FROM {table} WHERE id IN ({list}); COMMIT");
            let answers = answers_of(self, &mut s.conn, &delete, &what).await?;
            let deleted = answers.len().saturating_sub(2);
            Ok(answers.get(deleted).map_or(0, |a| a.affected))
        })
        .await
    }
}

impl MysqlInboxStore {
    /// Creates the janitor's archive table like the inbox when it is missing, without the
    /// inbox's unique keys: a message stored again after the deduplication window is
    /// archived a second time.
    async fn create_archive(&self, name: &str) -> Result<(), ConnectorError> {
        let archive = qualified(name);
        let (db, table) = table_ident(name, &self.connector.config().database);
        let what = format!("creating the archive table {name}");
        self.with_session(async |s| {
            let conn = &mut s.conn;
            let exists = format!(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} \
                 AND TABLE_NAME = {}",
                sql_string(&db),
                sql_string(&table)
            );
            if query_first(conn, &exists, &what).await?.is_some() {
                return Ok(());
            }
            let create = format!("CREATE TABLE IF NOT EXISTS {archive} LIKE {}", self.table);
            conn.query_drop(create.as_str())
                .await
                .map_err(|e| self.fail(&what, &e))?;
            let unique = format!(
                "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
                 WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} AND NON_UNIQUE = 0 \
                 AND INDEX_NAME <> 'PRIMARY'",
                sql_string(&db),
                sql_string(&table)
            );
            let drops = (query(conn, &unique, &what).await?.iter())
                .map(|row| {
                    Ok(format!(
                        "DROP INDEX {}",
                        quote_ident(&text_or_empty(row, 0)?)
                    ))
                })
                .collect::<Result<Vec<String>, ConnectorError>>()?;
            if !drops.is_empty() {
                let alter = format!("ALTER TABLE {archive} {}", drops.join(", "));
                conn.query_drop(alter.as_str())
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, type_: &str, key: &str) -> InboxMessage {
        InboxMessage {
            source: "s".into(),
            message_id: id.into(),
            message_type: type_.into(),
            biz_key: key.into(),
            payload: b"{}".to_vec(),
            headers: Vec::new(),
            rejected: None,
        }
    }

    fn row(id: i64, m: &InboxMessage) -> StoredRow {
        StoredRow(
            id,
            [
                m.source.clone(),
                m.message_id.clone(),
                m.message_type.clone(),
                m.biz_key.clone(),
            ],
        )
    }

    use Ingested::{Duplicate, Stored};

    #[test]
    fn each_stored_row_is_the_first_message_with_all_its_values() {
        let batch = [
            message("m1", "t", "k1"),
            message("m1", "other", "other"), // same pair
            message("m9", "t", "k1"),        // same type and key
            message("m2", "t", "k2"),
            message("m2", "t", "k2"), // the same message again
        ];
        let rows = vec![row(11, &batch[3]), row(10, &batch[0])];
        assert_eq!(
            stored_of(&batch, 2, &rows),
            Some(vec![
                Stored(10),
                Duplicate,
                Duplicate,
                Stored(11),
                Duplicate
            ])
        );
    }

    #[test]
    fn a_reused_pair_is_matched_by_all_four_values() {
        // The first is a duplicate of an older row by type and key; the second, with the
        // same pair but another type and key, is stored.
        let batch = [message("m1", "t1", "k1"), message("m1", "t2", "k2")];
        let rows = vec![row(20, &batch[1])];
        assert_eq!(
            stored_of(&batch, 1, &rows),
            Some(vec![Duplicate, Stored(20)])
        );
    }

    #[test]
    fn rows_of_other_messages_with_a_pair_of_the_batch_are_not_its_own() {
        let batch = [message("m1", "t1", "k1"), message("m2", "t1", "k2")];
        // A concurrent m1 of other values: the batch's m1 was its duplicate.
        let rows = vec![row(30, &message("m1", "x", "y")), row(31, &batch[1])];
        assert_eq!(
            stored_of(&batch, 1, &rows),
            Some(vec![Duplicate, Stored(31)])
        );
    }

    #[test]
    fn a_concurrent_copy_of_a_message_makes_the_outcome_unknown() {
        let batch = [message("m1", "t", "k1"), message("m2", "t", "k2")];
        // One row inserted, two rows match: one was stored by another transaction.
        let rows = vec![row(40, &batch[0]), row(41, &batch[1])];
        assert_eq!(stored_of(&batch, 1, &rows), None);
        // A row the server stored with other values (truncated): unknown too.
        assert_eq!(stored_of(&batch, 2, &[row(42, &batch[0])]), None);
    }

    #[test]
    fn nothing_inserted_is_all_duplicates_whatever_last_insert_id_found() {
        let batch = [message("m1", "t", "k1")];
        let stale = vec![row(5, &batch[0])];
        assert_eq!(stored_of(&batch, 0, &stale), Some(vec![Duplicate]));
    }

    #[test]
    fn insert_texts_open_and_commit_one_transaction_under_the_limit() {
        let statements: Vec<String> = (0..100).map(|n| format!("INSERT {n:0>95}")).collect();
        let texts = insert_texts(&statements, 1000);
        assert!(texts.len() > 10, "{} texts", texts.len());
        for text in &texts {
            assert!(text.len() <= 1000, "{}", text.len());
        }
        let all = texts.concat();
        assert!(all.starts_with(&format!("{BEGIN};\n")));
        assert!(all.ends_with(";\nCOMMIT"));
        assert_eq!(all.matches("START TRANSACTION").count(), 1);
        assert_eq!(all.matches("INSERT").count(), 100);
        // One statement per message, in order, each whole in one text.
        let order: Vec<&str> = all
            .split(";\n")
            .filter(|s| s.starts_with("INSERT"))
            .collect();
        assert_eq!(order, statements);

        let one = insert_texts(&statements[..1], 1 << 20);
        assert_eq!(one.len(), 1, "a small batch is one round trip");
        // A statement longer than the limit goes alone (the caller checks the packet).
        let big = vec!["x".repeat(5000)];
        assert_eq!(insert_texts(&big, 1000).len(), 2);
    }
}
