//! The statement texts of the write-back (the SUCCESS, FAILED, parked and rejected
//! updates, each a whole batch's) and the checkpoint upsert; the claimed write-back uses
//! the same failure and reason cases (`claims.rs`). Every value is a number or a hex
//! literal.

use std::fmt::Write as _;

use outboxd_connector::{last_error_text, Delivered, DeliveryFailure, ParkedEvent};

use super::{delay_ms, OutboxTable};
use crate::log::identity::{ServerIdentity, StoredCheckpoint};
use crate::log::position::BinlogPosition;
use crate::schema::{hex_literal, sql_string};

/// The SUCCESS update of `rows`: one multi-table UPDATE joined to a derived table. With
/// `replace_positions` ([`WriteBack::replace_positions`]) SUCCESS rows take the new
/// position too.
pub(super) fn success_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[Delivered],
    replace_positions: bool,
) {
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
    let _ = write!(
        sql,
        ") AS d ON o.{} = d.id SET o.status = 'SUCCESS', o.sent_at = NOW(6), \
         o.updated_at = NOW(6), o.kafka_partition = d.kp, o.kafka_offset = d.ko, \
         o.last_error = NULL, o.next_retry_time = NULL \
         WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED'",
        outbox.names.id
    );
    sql.push_str(if replace_positions {
        ", 'SUCCESS');\n"
    } else {
        ");\n"
    });
}

/// The statuses a FAILED, parked or rejected row is written from: INIT, and with
/// `replace_positions` ([`WriteBack::replace_positions`], exactly-once) SUCCESS too: such
/// a row of a window read again was written SUCCESS before a Kafka commit that never
/// happened. What such a row keeps of its SUCCESS goes ([`UNSENT`]): its position names
/// an aborted record.
fn failable(replace_positions: bool) -> &'static str {
    if replace_positions {
        "status IN ('INIT', 'SUCCESS')"
    } else {
        "status = 'INIT'"
    }
}

/// The assignments that undo a SUCCESS (a no-op on an INIT row): see [`failable`].
const UNSENT: &str = "sent_at = NULL, kafka_partition = NULL, kafka_offset = NULL";

/// The FAILED update of `rows`: a single-table UPDATE, whose assignments MySQL evaluates
/// left to right, so `status` is computed from the `retry_count` before its increment
/// (MariaDB's SIMULTANEOUS_ASSIGNMENT mode gives the same result).
pub(super) fn failed_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[DeliveryFailure],
    replace_positions: bool,
) {
    if rows.is_empty() {
        return;
    }
    let (mut errors, mut delays) = failure_cases(&outbox.names.id, rows.iter());
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
         updated_at = NOW(6), {UNSENT} \
         WHERE {} IN ({ids}) AND {};",
        outbox.names.id,
        failable(replace_positions)
    );
}

/// `CASE <id> WHEN … THEN …` (without `END`) of each failure's `last_error` text and of its
/// retry delay in milliseconds; `id` is the quoted row id column.
pub(crate) fn failure_cases<'a>(
    id: &str,
    failures: impl Iterator<Item = &'a DeliveryFailure>,
) -> (String, String) {
    let mut errors = format!("CASE {id}");
    let mut delays = format!("CASE {id}");
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

/// Rows parked behind an earlier event of their key (FAILED) or rejected
/// (MANUAL_REQUIRED): due now, `retry_count` kept, with the reason; from the statuses of
/// [`failable`].
pub(super) fn noted_sql(
    sql: &mut String,
    outbox: &OutboxTable,
    rows: &[ParkedEvent],
    status: &str,
    replace_positions: bool,
) {
    if rows.is_empty() {
        return;
    }
    let reasons = reason_case(&outbox.names.id, rows.iter());
    let ids = rows
        .iter()
        .map(|p| p.id.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        sql,
        "UPDATE {outbox} SET status = '{status}', next_retry_time = NOW(6), \
         last_error = {reasons}, updated_at = NOW(6), {UNSENT} \
         WHERE {} IN ({ids}) AND {};",
        outbox.names.id,
        failable(replace_positions)
    );
}

/// `CASE <id> WHEN 1 THEN '<reason>' … END`: each row's reason for `last_error`; `id` is
/// the quoted row id column.
pub(crate) fn reason_case<'a>(id: &str, rows: impl Iterator<Item = &'a ParkedEvent>) -> String {
    let mut reasons = format!("CASE {id}");
    for p in rows {
        let reason = sql_string(&last_error_text(&p.reason));
        let _ = write!(reasons, " WHEN {} THEN {reason}", p.id);
    }
    reasons.push_str(" END");
    reasons
}

/// The checkpoint upsert: inserts the row, or moves it forward — never backward — by
/// (file, offset). `updated_at` is assigned first, while `position` is still the old one.
/// The row names `server`, the server the position was read from.
pub(crate) fn checkpoint_sql(
    table: &str,
    pipeline: &str,
    position: &BinlogPosition,
    server: &ServerIdentity,
) -> String {
    let text = StoredCheckpoint::text(position, server);
    let (file, offset) = (position.file.as_str(), position.offset);
    // The stored coordinate is before any `;server…` suffix.
    let stored = "SUBSTRING_INDEX(position, ';', 1)";
    let newer = format!(
        "(position NOT LIKE 'binlog:%' OR ({file}, {offset}) >= \
         (SUBSTRING_INDEX(SUBSTRING_INDEX({stored}, ':', 2), ':', -1), \
         CAST(SUBSTRING_INDEX(SUBSTRING_INDEX({stored}, ':', 3), ':', -1) AS UNSIGNED)))",
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// outboxd's own table `name`.
    fn table(name: &str) -> OutboxTable {
        OutboxTable::new(name, &outboxd_connector::OutboxLayout::default())
    }

    #[test]
    fn success_is_one_statement_for_the_batch() {
        let mut sql = String::new();
        let rows: Vec<Delivered> = (1..=3)
            .map(|id| Delivered {
                table: 0,
                id,
                partition: 0,
                offset: id * 10,
            })
            .collect();
        success_sql(&mut sql, &table("outbox"), &rows, false);
        assert_eq!(sql.matches("UPDATE").count(), 1, "{sql}");
        assert!(sql.contains("SELECT 1 AS id, 0 AS kp, 10 AS ko UNION ALL SELECT 2, 0, 20"));
        assert!(sql.contains("WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED');"));
        // Exactly-once's resent rows: SUCCESS ones take the new position too.
        let mut again = String::new();
        success_sql(&mut again, &table("outbox"), &rows, true);
        assert!(
            again.contains("WHERE o.status IN ('INIT', 'FAILED', 'MANUAL_REQUIRED', 'SUCCESS');")
        );
    }

    #[test]
    fn failures_carry_their_errors_as_hex() {
        let mut sql = String::new();
        let rows = [DeliveryFailure {
            table: 0,
            id: 7,
            error: "it's broken; DROP TABLE x".into(),
            retry_delay: Duration::from_millis(1500),
        }];
        failed_sql(&mut sql, &table("outbox"), &rows, false);
        assert!(!sql.contains("it's"), "{sql}");
        assert!(sql.contains("WHEN 7 THEN 1500"), "{sql}");
        assert!(sql.contains("WHERE `id` IN (7) AND status = 'INIT'"));
        // status before retry_count: evaluated left to right.
        assert!(
            sql.find("status = CASE").unwrap() < sql.find("retry_count = retry_count + 1").unwrap()
        );
    }

    #[test]
    fn checkpoint_upsert_compares_file_and_offset() {
        let position: BinlogPosition = "binlog:mariadb-bin.000002:1234:0-1-9".parse().unwrap();
        let server = ServerIdentity::MariaDb {
            server_id: 1,
            domain: 0,
        };
        let sql = checkpoint_sql("`outboxd_checkpoint`", "orders", &position, &server);
        assert!(sql.contains(&hex_literal(b"mariadb-bin.000002")), "{sql}");
        let text = "binlog:mariadb-bin.000002:1234:0-1-9;server_id=1;domain=0";
        assert!(sql.contains(&sql_string(text)), "{sql}");
        assert!(sql.contains("SUBSTRING_INDEX(position, ';', 1)"), "{sql}");
        assert!(sql.contains(", 1234) >= ("), "{sql}");
        assert!(sql.find("updated_at = IF").unwrap() < sql.find("position = IF").unwrap());
    }
}
