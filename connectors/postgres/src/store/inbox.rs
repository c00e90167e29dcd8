//! The PostgreSQL [`InboxStore`]: batched insert-or-ignore, claims in arrival order per
//! key, and each outcome (the SQL handler's statement included) in one transaction that
//! holds only while the claim token matches.
//!
//! Deduplication is `INSERT … ON CONFLICT DO NOTHING` without a conflict target, so both
//! unique keys count, also between two messages of the same batch. Which messages were
//! stored is read back from `RETURNING`: the first message of the batch with a returned
//! row's `(source, message_id, message_type, biz_key)` is the stored one.

use std::collections::HashMap;
use std::time::SystemTime;

use outboxd_connector::{
    last_error_text, ClaimToken, ClaimedMessage, Completed, ConnectorError, InboxMessage,
    InboxOutcome, InboxStore, Ingested, OwnMessageState, ReapPolicy, ReapReport, RetrySchedule,
};
use outboxd_connector_kit::inbox as kit;
use outboxd_connector_kit::status;
use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::{delay_ms, get, DURABLE_COMMITS};
use crate::client::classify_pg_error;
use crate::schema::qualified;
use crate::PostgresConnector;

/// How the payload column stores a message's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    /// `jsonb` or `json`: JSON text, cast on insert.
    Json,
    /// `bytea`: the bytes as received.
    Bytes,
    /// `text` and the like: the body as text (lossy for non-UTF-8).
    Text,
}

/// The inbox table of one PostgreSQL database.
///
/// Holds one connection, reconnecting on the next call after it broke; ingress and the
/// workers each open their own store, so a slow handler statement does not hold up
/// ingestion.
#[derive(Debug)]
pub struct PgInboxStore {
    pub(super) connector: PostgresConnector,
    payload: Payload,
    sql: Sql,
    client: Mutex<Option<Client>>,
}

/// The statement texts for the configured table.
#[derive(Debug)]
struct Sql {
    insert: String,
    claim: String,
    done: String,
    failed: String,
    manual: String,
    released: String,
    reap: String,
    schedule: String,
}

impl PgInboxStore {
    /// Connects and checks the table; a missing table or column is a definite error that
    /// names `outboxd init`.
    pub(crate) async fn open(connector: &PostgresConnector) -> Result<Self, ConnectorError> {
        let client = connect(connector).await?;
        let table = qualified(&connector.layout.inbox_table);
        let probe = format!(
            "SELECT id, source, message_id, message_type, biz_key, payload, headers, status, \
             retry_count, max_retry_count, next_retry_time, claimed_at, claim_token, last_error, \
             created_at, updated_at, processed_at FROM {table} WHERE false"
        );
        let probe = client.prepare(&probe).await.map_err(|e| {
            classify_pg_error(
                &e,
                &format!(
                    "reading the inbox table {} on {} (run `outboxd check`; `outboxd init` \
                     creates it)",
                    connector.layout.inbox_table,
                    connector.endpoint()
                ),
            )
        })?;
        let payload = match probe.columns().get(5).map(|c| c.type_()) {
            Some(&Type::JSONB) | Some(&Type::JSON) => Payload::Json,
            Some(&Type::BYTEA) => Payload::Bytes,
            _ => Payload::Text,
        };
        let version: i32 = get(
            &client
                .query_one("SELECT current_setting('server_version_num')::int", &[])
                .await
                .map_err(|e| classify_pg_error(&e, "reading the server version"))?,
            0,
        )?;
        Ok(Self {
            connector: connector.clone(),
            payload,
            sql: Sql::new(&table, payload, version),
            client: Mutex::new(Some(client)),
        })
    }

    /// Whether the payload column is `bytea`.
    pub(super) fn payload_is_bytes(&self) -> bool {
        self.payload == Payload::Bytes
    }

    pub(super) fn error(&self, e: &tokio_postgres::Error, what: &str) -> ConnectorError {
        let context = format!(
            "{what} ({} on {})",
            self.connector.layout.inbox_table,
            self.connector.endpoint()
        );
        classify_pg_error(e, &context)
    }

    /// Runs `work` on the connection, reconnecting first when the last one broke.
    pub(super) async fn with_client<T>(
        &self,
        work: impl AsyncFnOnce(&mut Client) -> Result<T, ConnectorError>,
    ) -> Result<T, ConnectorError> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = None;
            *slot = Some(connect(&self.connector).await?);
        }
        let client = slot
            .as_mut()
            .ok_or_else(|| ConnectorError::transient("no PostgreSQL connection"))?;
        work(client).await
    }
}

/// A connection with the session settings the statements rely on: durable commits and
/// timestamps in UTC.
///
/// Kafka ingress stores a record's offset, and HTTP ingress answers 200, once the insert
/// returns: with a server, database or role default of `synchronous_commit = off`, a
/// crash of PostgreSQL right after could lose a message its sender was told is stored.
/// So the session commits durably ([`DURABLE_COMMITS`], as the outbox store's); only the
/// claim opts out, for its own transaction (see [`InboxStore::claim`]).
async fn connect(connector: &PostgresConnector) -> Result<Client, ConnectorError> {
    let client = connector.sql_client().await?;
    client
        .batch_execute(&format!("{DURABLE_COMMITS}; SET TimeZone = 'UTC'"))
        .await
        .map_err(|e| classify_pg_error(&e, "setting up the inbox connection"))?;
    Ok(client)
}

impl Sql {
    fn new(table: &str, payload: Payload, version: i32) -> Self {
        let token = if version >= 130_000 {
            "gen_random_uuid()"
        } else {
            "md5(random()::text || clock_timestamp()::text || i.id::text)::uuid"
        };
        let (payload_param, payload_read) = match payload {
            Payload::Json => ("$6::text[]", "m.payload::jsonb"),
            Payload::Bytes => ("$6::bytea[]", "m.payload"),
            Payload::Text => ("$6::text[]", "m.payload"),
        };
        let open = status::sql_list(&kit::OPEN);
        let not_blocked = format!(
            "NOT EXISTS (SELECT 1 FROM {table} e WHERE e.biz_key = i.biz_key AND e.id < i.id \
             AND e.status IN {open})"
        );
        let due = "i.status IN ('PENDING', 'FAILED') \
                   AND COALESCE(i.next_retry_time, i.created_at) <= now()";
        let failed_status = "CASE WHEN i.retry_count + 1 >= i.max_retry_count \
                             THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END";
        let held = "i.id = $1 AND i.claim_token = $2::text::uuid AND i.status = 'PROCESSING'";
        let release = "claimed_at = NULL, claim_token = NULL, updated_at = now()";
        Self {
            insert: format!(
                "INSERT INTO {table} (source, message_id, message_type, biz_key, headers, payload, \
                 status, last_error, next_retry_time) \
                 SELECT m.source, m.message_id, m.message_type, m.biz_key, m.headers::jsonb, \
                 {payload_read}, COALESCE(m.status, 'PENDING'), m.reason, \
                 CASE WHEN m.status IS NULL THEN NULL ELSE now() END \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
                 {payload_param}, $7::text[], $8::text[]) WITH ORDINALITY \
                 AS m(source, message_id, message_type, biz_key, headers, payload, status, reason, n) \
                 ORDER BY m.n \
                 ON CONFLICT DO NOTHING RETURNING id, source, message_id, message_type, biz_key"
            ),
            claim: format!(
                "WITH c AS (SELECT i.id FROM {table} i WHERE {due} AND {not_blocked} \
                 ORDER BY COALESCE(i.next_retry_time, i.created_at), i.id LIMIT $1 \
                 FOR UPDATE OF i SKIP LOCKED) \
                 UPDATE {table} AS i SET status = 'PROCESSING', claimed_at = now(), \
                 claim_token = {token}, updated_at = now() FROM c WHERE i.id = c.id \
                 RETURNING i.id, i.source, i.message_id, i.message_type, i.biz_key, \
                 {}, i.headers::text, i.retry_count, i.max_retry_count, i.created_at, \
                 i.claim_token::text",
                payload_select(payload)
            ),
            done: format!(
                "UPDATE {table} AS i SET status = 'DONE', processed_at = now(), last_error = NULL, \
                 next_retry_time = NULL, {release} WHERE {held}"
            ),
            failed: format!(
                "UPDATE {table} AS i SET status = {failed_status}, retry_count = i.retry_count + 1, \
                 next_retry_time = now() + $4::bigint * interval '1 millisecond', \
                 last_error = $3, {release} WHERE {held}"
            ),
            manual: format!(
                "UPDATE {table} AS i SET status = 'MANUAL_REQUIRED', next_retry_time = now(), \
                 last_error = $3, {release} WHERE {held}"
            ),
            released: format!(
                "UPDATE {table} AS i SET status = 'PENDING', next_retry_time = NULL, \
                 last_error = $3, {release} WHERE {held}"
            ),
            // SKIP LOCKED: a row being completed by its worker right now is not stale.
            reap: format!(
                "UPDATE {table} AS i SET status = {failed_status}, retry_count = i.retry_count + 1, \
                 next_retry_time = now() + $2::bigint * interval '1 millisecond', \
                 last_error = $3, {release} \
                 WHERE i.id IN (SELECT e.id FROM {table} e WHERE e.status = 'PROCESSING' \
                 AND e.claimed_at < now() - $1::bigint * interval '1 millisecond' \
                 FOR UPDATE OF e SKIP LOCKED) RETURNING i.status"
            ),
            schedule: format!(
                "SELECT (SELECT min(COALESCE(i.next_retry_time, i.created_at)) FROM {table} i \
                         WHERE i.status IN ('PENDING', 'FAILED') AND {not_blocked}), \
                        (SELECT min(claimed_at) FROM {table} WHERE status = 'PROCESSING')"
            ),
        }
    }
}

/// The claim's select expression of the payload.
fn payload_select(payload: Payload) -> &'static str {
    match payload {
        Payload::Bytes => "i.payload",
        Payload::Json | Payload::Text => "convert_to(i.payload::text, 'UTF8')",
    }
}

impl InboxStore for PgInboxStore {
    fn payload_is_json(&self) -> bool {
        self.payload == Payload::Json
    }

    async fn insert(&self, messages: &[InboxMessage]) -> Result<Vec<Ingested>, ConnectorError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let column =
            |f: fn(&InboxMessage) -> String| -> Vec<String> { messages.iter().map(f).collect() };
        let sources = column(|m| m.source.clone());
        let ids = column(|m| m.message_id.clone());
        let types = column(|m| m.message_type.clone());
        let keys = column(|m| m.biz_key.clone());
        let headers = column(kit::headers_json);
        let statuses: Vec<Option<&str>> = (messages.iter())
            .map(|m| m.rejected.as_ref().map(|_| kit::MANUAL_REQUIRED))
            .collect();
        let reasons: Vec<Option<String>> = (messages.iter())
            .map(|m| m.rejected.as_deref().map(last_error_text))
            .collect();
        let text_payloads: Vec<String>;
        let byte_payloads: Vec<&[u8]>;
        let payload: &(dyn ToSql + Sync) = match self.payload {
            Payload::Json => {
                text_payloads = column(kit::json_payload);
                &text_payloads
            }
            Payload::Text => {
                text_payloads = column(|m| String::from_utf8_lossy(&m.payload).into_owned());
                &text_payloads
            }
            Payload::Bytes => {
                byte_payloads = messages.iter().map(|m| m.payload.as_slice()).collect();
                &byte_payloads
            }
        };
        let params: [&(dyn ToSql + Sync); 8] = [
            &sources, &ids, &types, &keys, &headers, payload, &statuses, &reasons,
        ];
        // One autocommit statement, durable when it returns (the session's
        // synchronous_commit, `connect`): ingress acknowledges the messages after it.
        let rows = self
            .with_client(async |client| {
                client
                    .query(&self.sql.insert, &params)
                    .await
                    .map_err(|e| self.error(&e, "storing inbox messages"))
            })
            .await?;
        // A stored row is the first message with all four of its values: the same message
        // id may come twice in a batch with other types and keys, the first one a
        // duplicate by (message_type, biz_key) and the second one stored.
        let mut stored: HashMap<[String; 4], i64> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let key = [get(row, 1)?, get(row, 2)?, get(row, 3)?, get(row, 4)?];
            stored.insert(key, get(row, 0)?);
        }
        Ok(messages
            .iter()
            .map(|m| {
                let key = [
                    m.source.clone(),
                    m.message_id.clone(),
                    m.message_type.clone(),
                    m.biz_key.clone(),
                ];
                match stored.remove(&key) {
                    Some(id) => Ingested::Stored(id),
                    None => Ingested::Duplicate,
                }
            })
            .collect())
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedMessage>, ConnectorError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // A claim is bookkeeping: lost in a server crash, the row is PENDING again and is
        // claimed anew (the late outcome of the old claim is refused by its token), which
        // is the at-least-once a crash means anyway. So it does not wait for its WAL flush,
        // which would otherwise add a disk flush to every message's latency. `SET LOCAL`
        // lowers only this transaction below the session's durable setting (`connect`),
        // and the claim's WAL is flushed at the latest with the next durable commit after
        // it (the outcome's), so a durable outcome never rests on a lost claim. The three
        // requests go out together.
        let rows = self
            .with_client(async |client| {
                let begin = client.batch_execute("BEGIN; SET LOCAL synchronous_commit = off");
                // Typed parameters: sent with the claim itself (no prepare round trip
                // first), so the three requests really go out together.
                let params: [(&(dyn ToSql + Sync), Type); 1] = [(&limit, Type::INT8)];
                let claim = client.query_typed(&self.sql.claim, &params);
                let commit = client.batch_execute("COMMIT");
                let (begun, claimed, committed) = tokio::join!(begin, claim, commit);
                begun
                    .and(claimed)
                    .and_then(|rows| committed.map(|()| rows))
                    .map_err(|e| self.error(&e, "claiming inbox messages"))
            })
            .await?;
        let mut claimed: Vec<ClaimedMessage> = rows
            .iter()
            .map(claimed_from_row)
            .collect::<Result<_, _>>()?;
        // The UPDATE returns rows in no particular order; workers start them oldest first.
        claimed.sort_by_key(|m| m.id);
        Ok(claimed)
    }

    async fn complete(
        &self,
        message: &ClaimedMessage,
        outcome: InboxOutcome<'_>,
    ) -> Result<Completed, ConnectorError> {
        let id = message.id;
        let token = message.claim_token.0.as_str();
        let (update, reason, delay): (&str, Option<String>, Option<i64>) = match outcome {
            InboxOutcome::Done { .. } => (&self.sql.done, None, None),
            InboxOutcome::Failed { error, retry_delay } => (
                &self.sql.failed,
                Some(last_error_text(error)),
                Some(delay_ms(retry_delay)),
            ),
            InboxOutcome::ManualRequired { reason } => {
                (&self.sql.manual, Some(last_error_text(reason)), None)
            }
            InboxOutcome::Released { reason } => {
                (&self.sql.released, Some(last_error_text(reason)), None)
            }
        };
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&id, &token];
        if let Some(reason) = &reason {
            params.push(reason);
        }
        if let Some(delay) = &delay {
            params.push(delay);
        }
        // The SQL handler's statement, its fields bound as text.
        let handler = match outcome {
            InboxOutcome::Done {
                statement: Some(statement),
            } => {
                let (sql, fields) = kit::bind_named(statement, |n| format!("${n}::text"))?;
                let values: Vec<String> = fields.iter().map(|f| f.text(message)).collect();
                Some((sql, values))
            }
            _ => None,
        };
        self.with_client(async |client| {
            // BEGIN, the claim's UPDATE and the handler's statement go out together
            // (tokio-postgres pipelines requests polled at once): the statement runs even
            // when the claim is lost, and is rolled back then with the rest.
            let begin = client.batch_execute("BEGIN");
            let written = client.execute(update, &params);
            let statement = async {
                let Some((sql, values)) = &handler else {
                    return Ok(());
                };
                let values: Vec<&(dyn ToSql + Sync)> =
                    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                client.execute(sql.as_str(), &values).await.map(|_| ())
            };
            let (begun, written, ran) = tokio::join!(begin, written, statement);
            // A statement that fails to parse fails before the UPDATE runs (which then
            // reports the aborted transaction): the statement's error is the news.
            let outcome = match (begun, written, ran) {
                (Err(e), _, _) => Err(self.error(&e, "starting an inbox write-back")),
                (_, Ok(0), _) => Ok(Completed::ClaimLost),
                (_, _, Err(e)) if e.as_db_error().is_some() => {
                    Ok(Completed::StatementFailed(handler_error(&e)))
                }
                (_, _, Err(e)) => Err(self.error(&e, "running the inbox SQL handler")),
                (_, Err(e), _) => Err(self.error(&e, "writing back an inbox message")),
                (_, Ok(_), Ok(())) => Ok(Completed::Written),
            };
            let end = if matches!(outcome, Ok(Completed::Written)) {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            let ended = client.batch_execute(end).await;
            match (outcome, ended) {
                (Ok(done), Ok(())) => Ok(done),
                (Err(e), _) => Err(e),
                // A deferred constraint of the handler's tables fails only here, and the
                // transaction is rolled back: the handler's failure, as if its statement
                // had failed.
                (Ok(Completed::Written), Err(e)) if e.as_db_error().is_some() => {
                    Ok(Completed::StatementFailed(handler_error(&e)))
                }
                (Ok(_), Err(e)) => Err(self.error(&e, "committing an inbox write-back")),
            }
        })
        .await
    }

    async fn reap(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let reason = policy.reaped_reason();
        let timeout = delay_ms(policy.claim_timeout);
        let delay = delay_ms(policy.retry_delay);
        let rows = self
            .with_client(async |client| {
                client
                    .query(&self.sql.reap, &[&timeout, &delay, &reason])
                    .await
                    .map_err(|e| self.error(&e, "returning expired inbox claims to FAILED"))
            })
            .await?;
        let mut report = ReapReport::default();
        for row in &rows {
            match get::<String>(row, 0)?.as_str() {
                kit::MANUAL_REQUIRED => report.manual_required += 1,
                _ => report.failed += 1,
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
        let row = self
            .with_client(async |client| {
                client
                    .query_one(&self.sql.schedule, &[])
                    .await
                    .map_err(|e| self.error(&e, "reading the inbox schedule"))
            })
            .await?;
        Ok(RetrySchedule {
            next_due: get::<Option<SystemTime>>(&row, 0)?,
            oldest_claim: get::<Option<SystemTime>>(&row, 1)?,
        })
    }
}

/// A failed handler statement as stored in `last_error`: the server's message, its code
/// and, when it gives one, the detail.
fn handler_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!(
                "SQL handler: {} (SQLSTATE {}): {detail}",
                db.message(),
                db.code().code()
            ),
            None => format!(
                "SQL handler: {} (SQLSTATE {})",
                db.message(),
                db.code().code()
            ),
        },
        None => format!("SQL handler: {e}"),
    }
}

fn claimed_from_row(row: &Row) -> Result<ClaimedMessage, ConnectorError> {
    Ok(ClaimedMessage {
        id: get(row, 0)?,
        source: get(row, 1)?,
        message_id: get(row, 2)?,
        message_type: get(row, 3)?,
        biz_key: get(row, 4)?,
        payload: get::<Option<Vec<u8>>>(row, 5)?.unwrap_or_default(),
        headers: kit::headers_from_column(get::<Option<&str>>(row, 6)?),
        retry_count: get(row, 7)?,
        max_retry_count: get(row, 8)?,
        created_at: get(row, 9)?,
        claim_token: ClaimToken(get(row, 10)?),
    })
}
