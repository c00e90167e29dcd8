//! The write-back of a batch of the relay's outcomes with its checkpoint.
//!
//! A write-back is one transaction sent as one multi-statement text query (one round
//! trip): a SUCCESS `UPDATE … JOIN (SELECT … UNION ALL …)` for the whole batch, a FAILED
//! single-table `UPDATE … CASE id WHEN …` for the failures, and the checkpoint upsert, then
//! `COMMIT`. Every value is a number or a hex literal, so no `sql_mode` or character set can
//! change what a statement means. When any statement fails the connection is dropped, so
//! the server rolls the transaction back.
//!
//! The server refuses a query text larger than its `max_allowed_packet` (read once per
//! connection), and refuses it again on every retry: so statements are cut by size as well
//! as by rows, and a write-back too large for one text (a transaction of 100,000 rows parked
//! behind their key) is sent in several, each under the limit, still in one transaction.
//!
//! Once a stream of the connector holds the pipeline's lock, a write-back commits only
//! while that connection still holds it (or nobody does): its last statement before
//! `COMMIT` fails when another connection holds the lock, so an outboxd whose lock
//! connection died, and which another one took over from, cannot write statuses or move
//! the checkpoint the new reader now owns.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::sync::atomic::Ordering;

use outboxd_connector::{last_error_text, ConnectorError, ErrorReason, WriteBack};
use outboxd_connector_kit::status;
use outboxd_connector_kit::tables;

use super::sql::{checkpoint_sql, failed_sql, noted_sql, success_sql};
use super::{MysqlOutboxStore, OutboxTable};
use crate::client::{classify, int, query_first};
use crate::log::identity::ServerIdentity;
use crate::log::position::BinlogPosition;
use crate::schema::sql_string;

/// Rows per statement at most: keeps each `CASE` short enough to evaluate quickly.
const ROWS_PER_STATEMENT: usize = 5000;
/// "Subquery returns more than 1 row": the write-back's lock fence failed.
const FENCE_ERROR: u16 = 1242;
/// Bytes of a query text kept free below `max_allowed_packet` (the packet's command byte,
/// and the estimates' slack).
const PACKET_MARGIN: usize = 1024;
/// The smallest `max_allowed_packet` the server accepts; assumed when it cannot be read.
const MIN_PACKET: usize = 1024;
/// Upper bound of a statement's text besides its rows (keywords, the table name twice).
const STATEMENT_OVERHEAD: usize = 600;

impl MysqlOutboxStore {
    /// `max_allowed_packet` of `conn`: read once per connection.
    async fn max_packet(&self, conn: &mut Conn) -> Result<usize, ConnectorError> {
        let id = conn.id();
        let cached = *self
            .max_packet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, value)) = cached {
            if at == id {
                return Ok(value);
            }
        }
        let row = query_first(
            conn,
            "SELECT @@max_allowed_packet",
            &self.context("reading max_allowed_packet"),
        )
        .await?;
        let value = row
            .map(|r| int(&r, 0))
            .transpose()?
            .flatten()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(MIN_PACKET);
        *self
            .max_packet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((id, value));
        Ok(value)
    }

    /// Runs `texts` in order on one connection (they make up one transaction); drops the
    /// connection when one fails, so the server rolls back what the others began.
    pub(super) async fn run_write_back(
        &self,
        batch: &WriteBack<'_>,
        context: &str,
    ) -> Result<(), ConnectorError> {
        let mut slot = self.conn.lock().await;
        if slot.is_none() {
            *slot = Some(self.connector.sql_conn().await?);
        }
        let Some(conn) = slot.as_mut() else {
            return Err(ConnectorError::transient("no MySQL connection"));
        };
        let result = async {
            let limit = self.max_packet(conn).await?.saturating_sub(PACKET_MARGIN);
            let lock_name = self.connector.lock_name();
            let fence = match self.connector.lock_conn.load(Ordering::SeqCst) {
                0 => None,
                id => Some((lock_name.as_str(), id)),
            };
            let texts = write_back_texts(
                batch,
                &self.outboxes,
                &self.checkpoint,
                &self.connector.pipeline,
                &self.server,
                fence,
                limit,
            )?;
            if texts.len() > 1 {
                tracing::debug!(
                    texts = texts.len(),
                    limit,
                    "write-back larger than max_allowed_packet: sent in several texts"
                );
            }
            for text in &texts {
                if let Err(e) = conn.query_drop(text.as_str()).await {
                    return Err(match (&e, fence) {
                        (mysql_async::Error::Server(server), Some((_, id)))
                            if server.code == FENCE_ERROR =>
                        {
                            self.lock_lost(id)
                        }
                        _ => classify(&e, context),
                    });
                }
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// The write-back's fence failed: another connection holds the pipeline's lock.
    fn lock_lost(&self, id: u32) -> ConnectorError {
        ConnectorError::transient(format!(
            "pipeline `{}` is held by another outboxd now: this one's lock connection (id \
             {id}) was lost and another reader took over, so its status write-back and \
             checkpoint are refused (rolled back); this outboxd stops reading and waits to \
             take the lock again",
            self.connector.pipeline
        ))
        .with_reason(ErrorReason::SlotInUse)
    }
}

/// The write-back of `batch` as one transaction: `START TRANSACTION`, the statements, the
/// checkpoint upsert, `COMMIT`, in as few query texts as fit `limit` bytes each (one,
/// unless the batch is large). A definite error when a single row's statement exceeds
/// `limit` (a `max_allowed_packet` below any useful size). The checkpoint names `server`.
///
/// With `fence` = `(lock name, connection id)`, the last statement before `COMMIT` fails
/// with [`FENCE_ERROR`] when another connection holds that lock.
fn write_back_texts(
    batch: &WriteBack<'_>,
    outboxes: &[OutboxTable],
    checkpoint: &str,
    pipeline: &str,
    server: &ServerIdentity,
    fence: Option<(&str, u32)>,
    limit: usize,
) -> Result<Vec<String>, ConnectorError> {
    let mut statements = Vec::new();
    // Each table's rows, in this one transaction.
    for part in tables::split_write_back(batch) {
        let outbox = outboxes
            .get(usize::from(part.table))
            .ok_or_else(|| tables::unknown_table(part.table, outboxes.len()))?;
        row_statements(&mut statements, &part.rows(), outbox, limit);
    }
    if let Some(position) = batch.checkpoint {
        let position = BinlogPosition::from_position(position)?;
        let mut sql = checkpoint_sql(checkpoint, pipeline, &position, server);
        sql.push_str(";\n");
        statements.push(sql);
    }
    if let Some((lock, id)) = fence {
        // A scalar subquery of two rows is an error on MySQL and MariaDB alike (SIGNAL
        // outside a stored program is MariaDB's only); no other statement here has one.
        statements.push(format!(
            "SELECT (SELECT 1 UNION ALL SELECT 2 FROM DUAL \
             WHERE COALESCE(IS_USED_LOCK({}), {id}) <> {id}) AS outboxd_lock_fence;\n",
            sql_string(lock)
        ));
    }

    const BEGIN: &str = "START TRANSACTION;\n";
    const COMMIT: &str = "COMMIT";
    let mut texts = Vec::new();
    let mut text = String::from(BEGIN);
    for statement in statements {
        if statement.len() + BEGIN.len() + COMMIT.len() > limit {
            return Err(ConnectorError::definite(format!(
                "a write-back statement of {} bytes does not fit the server's \
                 max_allowed_packet ({} bytes with outboxd's margin): raise max_allowed_packet \
                 (SET GLOBAL max_allowed_packet and in the server's configuration)",
                statement.len(),
                limit
            )));
        }
        if text.len() + statement.len() + COMMIT.len() > limit {
            texts.push(std::mem::take(&mut text));
        }
        text.push_str(&statement);
    }
    text.push_str(COMMIT);
    texts.push(text);
    Ok(texts)
}

/// The status statements of `batch`, whose rows are all in `outbox`, each under `limit`
/// bytes where a row allows.
fn row_statements(
    statements: &mut Vec<String>,
    batch: &WriteBack<'_>,
    outbox: &OutboxTable,
    limit: usize,
) {
    // Every row's share of its statement is bounded from above, so a chunk whose bounds
    // fit the room fits itself.
    let room = limit.saturating_sub(STATEMENT_OVERHEAD + 2 * outbox.quoted.len());
    for chunk in size_chunks(batch.delivered, room, |_| 80) {
        let mut sql = String::new();
        success_sql(&mut sql, outbox, chunk, batch.replace_positions);
        statements.push(sql);
    }
    for chunk in size_chunks(batch.failed, room, |f| {
        2 * last_error_text(&f.error).len() + 160
    }) {
        let mut sql = String::new();
        failed_sql(&mut sql, outbox, chunk, batch.replace_positions);
        statements.push(sql);
    }
    // Parked rows become FAILED, rejected ones MANUAL_REQUIRED: due now, with the reason.
    for (rows, status) in [
        (batch.parked, status::FAILED),
        (batch.rejected, status::MANUAL_REQUIRED),
    ] {
        for chunk in size_chunks(rows, room, |p| 2 * last_error_text(&p.reason).len() + 100) {
            let mut sql = String::new();
            noted_sql(&mut sql, outbox, chunk, status, batch.replace_positions);
            statements.push(sql);
        }
    }
}

/// `rows` in order, in chunks of at most [`ROWS_PER_STATEMENT`] rows whose `cost` adds up
/// to at most `room` (a row costing more than `room` goes alone).
fn size_chunks<T>(rows: &[T], room: usize, cost: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let c = cost(row);
        if i > start && (used + c > room || i - start == ROWS_PER_STATEMENT) {
            chunks.push(&rows[start..i]);
            (start, used) = (i, 0);
        }
        used += c;
    }
    if start < rows.len() {
        chunks.push(&rows[start..]);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::{Delivered, DeliveryFailure, ParkedEvent, Position};
    use std::time::Duration;

    /// outboxd's own table `name`.
    fn table(name: &str) -> OutboxTable {
        OutboxTable::new(name, &outboxd_connector::OutboxLayout::default())
    }

    fn parked(n: i64, key: &str) -> Vec<ParkedEvent> {
        (1..=n)
            .map(|id| ParkedEvent {
                table: 0,
                id,
                reason: format!("parked: an earlier event of biz_key `{key}` is not delivered yet"),
            })
            .collect()
    }

    #[test]
    fn a_small_write_back_is_one_text() {
        let rows = parked(3, "k");
        let position = checkpoint_position();
        let batch = WriteBack {
            parked: &rows,
            checkpoint: Some(&position),
            ..WriteBack::default()
        };
        let texts = write_back_texts(
            &batch,
            &[table("outbox")],
            "`cp`",
            "p",
            &SERVER,
            Some(("outboxd:p", 42)),
            1 << 20,
        )
        .unwrap();
        assert_eq!(texts.len(), 1);
        assert!(texts[0].starts_with("START TRANSACTION;\n"));
        assert!(texts[0].ends_with("COMMIT"));
        assert!(texts[0].contains("WHERE `id` IN (1, 2, 3) AND status = 'INIT'"));
        // The lock fence is the last statement before COMMIT.
        let fence = texts[0].find("IS_USED_LOCK(").unwrap();
        assert!(fence > texts[0].find("INSERT INTO `cp`").unwrap());
        assert!(texts[0][fence..].contains(", 42) <> 42) AS outboxd_lock_fence;\nCOMMIT"));
    }

    /// The checkpoint of the write-back texts below.
    fn checkpoint_position() -> Position {
        BinlogPosition {
            file: "mariadb-bin.000002".into(),
            offset: 99,
            gtid_set: None,
        }
        .position()
    }

    /// Several outbox tables: each row's statement names its own table (ids repeat across
    /// tables), all in one transaction before the checkpoint.
    #[test]
    fn each_tables_rows_are_written_to_that_table() {
        let delivered = [
            Delivered {
                table: 1,
                id: 7,
                partition: 0,
                offset: 70,
            },
            Delivered {
                table: 0,
                id: 7,
                partition: 0,
                offset: 71,
            },
        ];
        let position = checkpoint_position();
        let batch = WriteBack {
            delivered: &delivered,
            checkpoint: Some(&position),
            ..WriteBack::default()
        };
        let tables = [table("a.outbox"), table("b.outbox")];
        let texts = write_back_texts(&batch, &tables, "`cp`", "p", &SERVER, None, 1 << 20).unwrap();
        assert_eq!(texts.len(), 1);
        let text = &texts[0];
        let a = text.find("UPDATE `a`.`outbox` AS o JOIN (SELECT 7 AS id, 0 AS kp, 71 AS ko)");
        let b = text.find("UPDATE `b`.`outbox` AS o JOIN (SELECT 7 AS id, 0 AS kp, 70 AS ko)");
        let checkpoint = text.find("INSERT INTO `cp`");
        assert!(a.is_some() && b.is_some(), "{text}");
        assert!(a < b && b < checkpoint, "{text}");
        // A row of a table the pipeline does not have is refused, never written elsewhere.
        let stray = [Delivered {
            table: 2,
            ..delivered[0].clone()
        }];
        let batch = WriteBack {
            delivered: &stray,
            ..WriteBack::default()
        };
        let err = write_back_texts(&batch, &tables, "`cp`", "p", &SERVER, None, 1 << 20);
        assert!(err.is_err());
    }

    #[test]
    fn a_write_back_over_the_packet_limit_is_cut_into_texts_under_it() {
        let limit = 64 * 1024;
        let rows = parked(20_000, "order-7");
        let failed: Vec<DeliveryFailure> = (30_001..30_050)
            .map(|id| DeliveryFailure {
                table: 0,
                id,
                error: "x".repeat(3000),
                retry_delay: Duration::from_secs(1),
            })
            .collect();
        let delivered: Vec<Delivered> = (40_001..52_000)
            .map(|id| Delivered {
                table: 0,
                id,
                partition: 1,
                offset: id,
            })
            .collect();
        let position = checkpoint_position();
        let batch = WriteBack {
            delivered: &delivered,
            failed: &failed,
            parked: &rows,
            rejected: &[],
            checkpoint: Some(&position),
            replace_positions: false,
        };
        let texts = write_back_texts(
            &batch,
            &[table("outbox")],
            "`cp`",
            "p",
            &SERVER,
            None,
            limit,
        )
        .unwrap();
        assert!(texts.len() > 10, "{} texts", texts.len());
        for text in &texts {
            assert!(text.len() <= limit, "{} > {limit}", text.len());
        }
        let all = texts.concat();
        assert!(all.starts_with("START TRANSACTION;\n"));
        assert_eq!(all.matches("START TRANSACTION").count(), 1);
        assert_eq!(all.matches("COMMIT").count(), 1);
        assert!(all.ends_with("COMMIT"));
        // Every row in exactly one statement, and the checkpoint last before COMMIT.
        let ids = |kind: &str| -> usize {
            all.split(";\n")
                .filter(|s| s.contains(kind))
                .map(|s| s.matches(" THEN CONVERT(").count())
                .sum()
        };
        assert_eq!(
            ids("status = 'FAILED', next_retry_time = NOW(6)"),
            rows.len()
        );
        assert_eq!(ids("'MANUAL_REQUIRED'"), failed.len());
        assert_eq!(
            all.matches("UNION ALL SELECT").count() + all.matches(" AS kp, ").count(),
            delivered.len()
        );
        let checkpoint = all.find("INSERT INTO `cp`").unwrap();
        assert!(
            all[checkpoint..].find(";\n").unwrap() + checkpoint + 2 == all.len() - "COMMIT".len()
        );

        // A single row's statement over the limit cannot be cut: definite, names the fix.
        let err = write_back_texts(&batch, &[table("outbox")], "`cp`", "p", &SERVER, None, 4096)
            .unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message().contains("raise max_allowed_packet"), "{err}");
    }

    const SERVER: ServerIdentity = ServerIdentity::MariaDb {
        server_id: 1,
        domain: 0,
    };
}
