//! The MySQL/MariaDB [`OutboxStore`]: status write-back and the checkpoint row.
//!
//! A write-back is one transaction sent as **one** multi-statement text query (one round
//! trip): a SUCCESS `UPDATE … JOIN (SELECT … UNION ALL …)` for the whole batch, a FAILED
//! single-table `UPDATE … CASE id WHEN …` for the failures, and the checkpoint upsert, then
//! `COMMIT`. Every value is a number or a hex literal, so no `sql_mode` or character set can
//! change what a statement means. When any statement fails the connection is dropped, so
//! the server rolls the transaction back.
//!
//! `claims.rs` holds the claims, the claimed write-back, the reaper, the retry schedule
//! and the blocked keys; `operator.rs` the operator's actions. Rows become events through
//! the connector kit's row conversion, as on the log path.

mod claims;
mod operator;

use std::fmt::Write as _;

use mysql_async::Conn;
use std::collections::HashSet;

use outboxd_connector::{
    last_error_text, ClaimRequest, ClaimedEvent, ClaimedWriteBack, ConnectorError, Delivered,
    DeliveryFailure, OutboxStore, ParkedEvent, Position, ReapPolicy, ReapReport, RetrySchedule,
    WriteBack,
};
use outboxd_connector_kit::store as kit_store;
use tokio::sync::Mutex;

use crate::client::{execute, query_first, text};
use crate::log::position::BinlogPosition;
use crate::schema::{hex_literal, qualified, sql_string};
use crate::MysqlConnector;

/// Rows per statement: keeps statements well below `max_allowed_packet`.
const ROWS_PER_STATEMENT: usize = 5000;

/// The SQL side of one MySQL pipeline. Holds one connection; when it breaks, the failing
/// call returns a transient error and the next call reconnects.
#[derive(Debug)]
pub struct MysqlOutboxStore {
    pub(crate) connector: MysqlConnector,
    pub(crate) outbox: String,
    pub(crate) checkpoint: String,
    pub(crate) conn: Mutex<Option<Conn>>,
}

impl MysqlOutboxStore {
    /// Connects and checks that the tables answer; fails definitely when one is missing
    /// (run `outboxd init`).
    pub(crate) async fn open(connector: &MysqlConnector) -> Result<Self, ConnectorError> {
        let store = Self {
            connector: connector.clone(),
            outbox: qualified(&connector.layout.outbox_table),
            checkpoint: qualified(&connector.layout.checkpoint_table),
            conn: Mutex::new(None),
        };
        let mut conn = connector.sql_conn().await?;
        let probe = format!(
            "SELECT id, status, retry_count, max_retry_count, next_retry_time, last_error, \
             sent_at, kafka_partition, kafka_offset, updated_at FROM {} LIMIT 0; \
             SELECT pipeline, position, updated_at FROM {} LIMIT 0",
            store.outbox, store.checkpoint
        );
        execute(&mut conn, &probe, &store.context("checking the tables")).await?;
        *store.conn.lock().await = Some(conn);
        Ok(store)
    }

    pub(crate) fn context(&self, what: &str) -> String {
        format!(
            "{what} ({} / {} on {}; run `outboxd check`, `outboxd init` creates missing tables)",
            self.connector.layout.outbox_table,
            self.connector.layout.checkpoint_table,
            self.connector.endpoint()
        )
    }

    /// Runs `sql` on the connection, reconnecting first when there is none; drops the
    /// connection when the statement fails.
    async fn run(&self, sql: &str, context: &str) -> Result<(), ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = execute(conn, sql, context).await;
        if result.is_err() {
            // The transaction's state is unknown: let the server roll it back.
            *slot = None;
        }
        result
    }
}

impl OutboxStore for MysqlOutboxStore {
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        if kit_store::is_empty(&batch) {
            return Ok(());
        }
        let mut sql = String::from("START TRANSACTION;\n");
        for chunk in batch.delivered.chunks(ROWS_PER_STATEMENT) {
            success_sql(&mut sql, &self.outbox, chunk);
        }
        for chunk in batch.failed.chunks(ROWS_PER_STATEMENT) {
            failed_sql(&mut sql, &self.outbox, chunk);
        }
        for chunk in batch.parked.chunks(ROWS_PER_STATEMENT) {
            parked_sql(&mut sql, &self.outbox, chunk);
        }
        if let Some(position) = batch.checkpoint {
            let position = BinlogPosition::from_position(position)?;
            sql.push_str(&checkpoint_sql(
                &self.checkpoint,
                &self.connector.pipeline,
                &position,
            ));
            sql.push_str(";\n");
        }
        sql.push_str("COMMIT");
        let context = self.context(&format!(
            "writing back {} delivered, {} failed and {} parked outbox rows",
            batch.delivered.len(),
            batch.failed.len(),
            batch.parked.len()
        ));
        self.run(&sql, &context).await
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
        result.map(|b| b.as_ref().map(BinlogPosition::position))
    }
}

/// Reads the checkpoint row of the connector's pipeline.
pub(crate) async fn load_checkpoint(
    conn: &mut Conn,
    connector: &MysqlConnector,
) -> Result<Option<BinlogPosition>, ConnectorError> {
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
    match text.parse::<BinlogPosition>() {
        Ok(position) => Ok(Some(position)),
        Err(_) => Err(ConnectorError::definite(format!(
            "the checkpoint of pipeline `{}` in {table} is `{text}`, not a binlog position; \
             delete the row, run `outboxd init --config <file>` to record the current position \
             and `outboxd recover --config <file>` to rescan INIT rows",
            connector.pipeline
        ))),
    }
}

/// The SUCCESS update of `rows`: one multi-table UPDATE joined to a derived table.
fn success_sql(sql: &mut String, outbox: &str, rows: &[Delivered]) {
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
    sql.push_str(
        ") AS d ON o.id = d.id SET o.status = 'SUCCESS', o.sent_at = NOW(6), \
         o.updated_at = NOW(6), o.kafka_partition = d.kp, o.kafka_offset = d.ko, \
         o.last_error = NULL, o.next_retry_time = NULL \
         WHERE o.status IN ('INIT', 'FAILED');\n",
    );
}

/// The FAILED update of `rows`: a single-table UPDATE, whose assignments MySQL evaluates
/// left to right, so `status` is computed from the `retry_count` before its increment
/// (MariaDB's SIMULTANEOUS_ASSIGNMENT mode gives the same result).
fn failed_sql(sql: &mut String, outbox: &str, rows: &[DeliveryFailure]) {
    if rows.is_empty() {
        return;
    }
    let (mut errors, mut delays) = failure_cases(rows.iter());
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
         updated_at = NOW(6) \
         WHERE id IN ({ids}) AND status = 'INIT';"
    );
}

/// `CASE id WHEN … THEN …` (without `END`) of each failure's `last_error` text and of its
/// retry delay in milliseconds.
pub(crate) fn failure_cases<'a>(
    failures: impl Iterator<Item = &'a DeliveryFailure>,
) -> (String, String) {
    let mut errors = String::from("CASE id");
    let mut delays = String::from("CASE id");
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

/// Rows parked behind an earlier event of their key: FAILED, due now, `retry_count` kept.
fn parked_sql(sql: &mut String, outbox: &str, rows: &[ParkedEvent]) {
    if rows.is_empty() {
        return;
    }
    let mut reasons = String::from("CASE id");
    let mut ids = String::new();
    for (i, p) in rows.iter().enumerate() {
        let _ = write!(
            reasons,
            " WHEN {} THEN {}",
            p.id,
            sql_string(&last_error_text(&p.reason))
        );
        if i > 0 {
            ids.push_str(", ");
        }
        let _ = write!(ids, "{}", p.id);
    }
    reasons.push_str(" END");
    let _ = writeln!(
        sql,
        "UPDATE {outbox} SET status = 'FAILED', next_retry_time = NOW(6), \
         last_error = {reasons}, updated_at = NOW(6) \
         WHERE id IN ({ids}) AND status = 'INIT';"
    );
}

/// The checkpoint upsert: inserts the row, or moves it forward — never backward — by
/// (file, offset). `updated_at` is assigned first, while `position` is still the old one.
pub(crate) fn checkpoint_sql(table: &str, pipeline: &str, position: &BinlogPosition) -> String {
    let text = position.to_string();
    let (file, offset) = (position.file.as_str(), position.offset);
    let newer = format!(
        "(position NOT LIKE 'binlog:%' OR ({file}, {offset}) >= \
         (SUBSTRING_INDEX(SUBSTRING_INDEX(position, ':', 2), ':', -1), \
         CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(position, ':', 3), ':', -1) AS UNSIGNED)))",
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

    #[test]
    fn success_is_one_statement_for_the_batch() {
        let mut sql = String::new();
        let rows: Vec<Delivered> = (1..=3)
            .map(|id| Delivered {
                id,
                partition: 0,
                offset: id * 10,
            })
            .collect();
        success_sql(&mut sql, "`outbox`", &rows);
        assert_eq!(sql.matches("UPDATE").count(), 1, "{sql}");
        assert!(sql.contains("SELECT 1 AS id, 0 AS kp, 10 AS ko UNION ALL SELECT 2, 0, 20"));
        assert!(sql.contains("WHERE o.status IN ('INIT', 'FAILED')"));
    }

    #[test]
    fn failures_carry_their_errors_as_hex() {
        let mut sql = String::new();
        let rows = [DeliveryFailure {
            id: 7,
            error: "it's broken; DROP TABLE x".into(),
            retry_delay: Duration::from_millis(1500),
        }];
        failed_sql(&mut sql, "`outbox`", &rows);
        assert!(!sql.contains("it's"), "{sql}");
        assert!(sql.contains("WHEN 7 THEN 1500"), "{sql}");
        assert!(sql.contains("WHERE id IN (7) AND status = 'INIT'"));
        // status before retry_count: evaluated left to right.
        assert!(
            sql.find("status = CASE").unwrap() < sql.find("retry_count = retry_count + 1").unwrap()
        );
    }

    #[test]
    fn checkpoint_upsert_compares_file_and_offset() {
        let position: BinlogPosition = "binlog:mariadb-bin.000002:1234:0-1-9".parse().unwrap();
        let sql = checkpoint_sql("`outboxd_checkpoint`", "orders", &position);
        assert!(sql.contains(&hex_literal(b"mariadb-bin.000002")), "{sql}");
        assert!(sql.contains(", 1234) >= ("), "{sql}");
        assert!(sql.find("updated_at = IF").unwrap() < sql.find("position = IF").unwrap());
    }
}
