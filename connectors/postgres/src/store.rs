//! The PostgreSQL [`OutboxStore`]: status write-back and the checkpoint row.
//!
//! Every write-back is one transaction of at most three statements, each covering the
//! whole batch through `unnest` of arrays, pipelined on one connection. The SUCCESS
//! update changes no indexed column of the shipped schema (`next_retry_time` stays NULL
//! for a row that never failed), so PostgreSQL can do it as a HOT update.

use std::time::Duration;

use outboxd_connector::{ConnectorError, OutboxStore, Position, WriteBack};
use tokio::sync::Mutex;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use crate::connect::classify_pg_error;
use crate::schema::qualified;
use crate::PostgresConnector;

/// `last_error` is cut to this many characters: a broker error is short, a stack of
/// nested causes need not fill the row.
const MAX_ERROR_CHARS: usize = 2000;

/// Longest retry delay written (ten years); longer ones are clamped so the interval
/// arithmetic cannot overflow.
const MAX_DELAY_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

/// The SQL side of one PostgreSQL pipeline.
///
/// Holds one connection; when it breaks, the failing call returns a transient error and
/// the next call reconnects (and prepares the statements again).
#[derive(Debug)]
pub struct PgOutboxStore {
    connector: PostgresConnector,
    sql: Sql,
    conn: Mutex<Option<Conn>>,
}

/// The statement texts, built once from the configured names.
#[derive(Debug)]
struct Sql {
    success: String,
    failed: String,
    checkpoint: String,
    load_checkpoint: String,
}

#[derive(Debug)]
struct Conn {
    client: Client,
    success: Statement,
    failed: Statement,
    checkpoint: Statement,
    load_checkpoint: Statement,
}

impl Sql {
    fn new(connector: &PostgresConnector) -> Self {
        let outbox = qualified(&connector.layout.outbox_table);
        let checkpoint = qualified(&connector.layout.checkpoint_table);
        Self {
            // Leaves next_retry_time alone unless it is set (a FAILED row retried): for a
            // fresh row NULL → NULL is no change, which keeps the update HOT.
            success: format!(
                "UPDATE {outbox} AS o SET status = 'SUCCESS', sent_at = now(), updated_at = now(), \
                 kafka_partition = d.partition, kafka_offset = d.kafka_offset, \
                 last_error = NULL, next_retry_time = NULL \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, partition, kafka_offset) \
                 WHERE o.id = d.id AND o.status IN ('INIT', 'FAILED')"
            ),
            failed: format!(
                "UPDATE {outbox} AS o SET retry_count = o.retry_count + 1, \
                 next_retry_time = now() + f.delay_ms * interval '1 millisecond', \
                 last_error = f.error, updated_at = now(), \
                 status = CASE WHEN o.retry_count + 1 >= o.max_retry_count \
                          THEN 'MANUAL_REQUIRED' ELSE 'FAILED' END \
                 FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(id, error, delay_ms) \
                 WHERE o.id = f.id AND o.status = 'INIT'"
            ),
            // Never backward: LSNs compare as pg_lsn (text order is wrong for 9/… vs 10/…);
            // other forms are replaced as they come.
            checkpoint: format!(
                "INSERT INTO {checkpoint} AS t (pipeline, position, updated_at) \
                 VALUES ($1, $2, now()) \
                 ON CONFLICT (pipeline) DO UPDATE SET position = EXCLUDED.position, updated_at = now() \
                 WHERE CASE WHEN left(t.position, 4) = 'lsn:' AND left(EXCLUDED.position, 4) = 'lsn:' \
                       THEN pg_lsn(substr(t.position, 5)) <= pg_lsn(substr(EXCLUDED.position, 5)) \
                       ELSE true END"
            ),
            load_checkpoint: format!("SELECT position FROM {checkpoint} WHERE pipeline = $1"),
        }
    }
}

impl PgOutboxStore {
    /// Connects and prepares the statements; fails definitely when a table or column is
    /// missing (run `outboxd init`).
    pub(crate) async fn open(connector: &PostgresConnector) -> Result<Self, ConnectorError> {
        let store = Self {
            connector: connector.clone(),
            sql: Sql::new(connector),
            conn: Mutex::new(None),
        };
        let conn = store.connect().await?;
        *store.conn.lock().await = Some(conn);
        Ok(store)
    }

    async fn connect(&self) -> Result<Conn, ConnectorError> {
        let client = self.connector.sql_client().await?;
        // The checkpoint (and, after it, the slot's confirmed position) may only move once
        // the statuses are durable: with synchronous_commit = off a crash could lose a
        // committed write-back. Stronger settings (remote_apply, …) are kept.
        let durable = "DO $$ BEGIN IF current_setting('synchronous_commit') = 'off' THEN \
                       PERFORM set_config('synchronous_commit', 'on', false); END IF; END $$";
        client.batch_execute(durable).await.map_err(|e| {
            classify_pg_error(&e, "setting synchronous_commit for the write-back")
        })?;
        let success_types = [Type::INT8_ARRAY, Type::INT4_ARRAY, Type::INT8_ARRAY];
        let failed_types = [Type::INT8_ARRAY, Type::TEXT_ARRAY, Type::INT8_ARRAY];
        let checkpoint_types = [Type::TEXT, Type::TEXT];
        let (success, failed, checkpoint, load_checkpoint) = futures_util::try_join!(
            self.prepare(
                &client,
                "SUCCESS write-back",
                &self.sql.success,
                &success_types
            ),
            self.prepare(
                &client,
                "FAILED write-back",
                &self.sql.failed,
                &failed_types
            ),
            self.prepare(
                &client,
                "checkpoint",
                &self.sql.checkpoint,
                &checkpoint_types
            ),
            self.prepare(
                &client,
                "checkpoint read",
                &self.sql.load_checkpoint,
                &[Type::TEXT]
            ),
        )?;
        Ok(Conn {
            client,
            success,
            failed,
            checkpoint,
            load_checkpoint,
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
                self.connector.layout.outbox_table,
                self.connector.layout.checkpoint_table,
                self.connector.endpoint()
            );
            classify_pg_error(&e, &context)
        })
    }

    /// The live connection, reconnecting when the previous one broke.
    async fn conn<'a>(&self, slot: &'a mut Option<Conn>) -> Result<&'a mut Conn, ConnectorError> {
        if slot.as_ref().is_some_and(|c| c.client.is_closed()) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        slot.as_mut()
            .ok_or_else(|| ConnectorError::transient("no PostgreSQL connection"))
    }

    async fn write_back_on(
        conn: &mut Conn,
        batch: WriteBack<'_>,
        pipeline: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let delivered = batch.delivered;
        let failed = batch.failed;
        let (d_ids, d_parts, d_offsets): (Vec<i64>, Vec<i32>, Vec<i64>) = (
            delivered.iter().map(|d| d.id).collect(),
            delivered.iter().map(|d| d.partition).collect(),
            delivered.iter().map(|d| d.offset).collect(),
        );
        let f_ids: Vec<i64> = failed.iter().map(|f| f.id).collect();
        let f_errors: Vec<String> = failed.iter().map(|f| truncate(&f.error)).collect();
        let f_delays: Vec<i64> = failed.iter().map(|f| delay_ms(f.retry_delay)).collect();
        let position = batch.checkpoint.map(Position::to_string);

        let tx = conn.client.transaction().await?;
        // Pipelined: each statement is sent before the previous answer arrives, in this
        // order, so a row both delivered and failed in one batch ends SUCCESS.
        let success = async {
            if d_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(&conn.success, &[&d_ids, &d_parts, &d_offsets])
                .await
        };
        let fail = async {
            if f_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(&conn.failed, &[&f_ids, &f_errors, &f_delays])
                .await
        };
        let checkpoint = async {
            match &position {
                Some(position) => tx.execute(&conn.checkpoint, &[&pipeline, position]).await,
                None => Ok(0),
            }
        };
        futures_util::try_join!(success, fail, checkpoint)?;
        tx.commit().await
    }
}

impl OutboxStore for PgOutboxStore {
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        if batch.delivered.is_empty() && batch.failed.is_empty() && batch.checkpoint.is_none() {
            return Ok(());
        }
        let mut slot = self.conn.lock().await;
        let conn = self.conn(&mut slot).await?;
        let result = Self::write_back_on(conn, batch, &self.connector.pipeline).await;
        result.map_err(|e| {
            let context = format!(
                "writing back {} delivered and {} failed outbox rows to {} on {}",
                batch.delivered.len(),
                batch.failed.len(),
                self.connector.layout.outbox_table,
                self.connector.endpoint()
            );
            classify_pg_error(&e, &context)
        })
    }

    async fn load_checkpoint(&self) -> Result<Option<Position>, ConnectorError> {
        let mut slot = self.conn.lock().await;
        let conn = self.conn(&mut slot).await?;
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
        text.parse().map(Some).map_err(|e| {
            ConnectorError::definite(format!(
                "the checkpoint of pipeline `{}` in {table} is corrupt; delete the row to \
                 resume from the replication slot's position",
                self.connector.pipeline
            ))
            .with_source(e)
        })
    }
}

/// At most [`MAX_ERROR_CHARS`] characters of `error`, cut on a character boundary.
fn truncate(error: &str) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => error[..at].to_owned(),
        None => error.to_owned(),
    }
}

fn delay_ms(delay: Duration) -> i64 {
    i64::try_from(delay.as_millis()).map_or(MAX_DELAY_MS, |ms| ms.min(MAX_DELAY_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(truncate("short"), "short");
        let long = "é".repeat(MAX_ERROR_CHARS + 5);
        let cut = truncate(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
    }

    #[test]
    fn clamps_delays() {
        assert_eq!(delay_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(delay_ms(Duration::from_secs(u64::MAX)), MAX_DELAY_MS);
    }
}
