//! Small pieces of the store side that read the same in every engine.

use std::time::SystemTime;

use outboxd_connector::{NewOutboxRow, OutboxLayout, StatusCount, StatusSummary, WriteBack};

use crate::status;

/// True when `batch` has nothing to write: no statuses and no checkpoint.
pub fn is_empty(batch: &WriteBack<'_>) -> bool {
    batch.delivered.is_empty()
        && batch.failed.is_empty()
        && batch.parked.is_empty()
        && batch.rejected.is_empty()
        && batch.checkpoint.is_none()
}

/// Adds one `(status, message_type, count, oldest created_at)` row of `outboxd status` to
/// `summary`; INIT, FAILED and PROCESSING rows count towards the oldest unsent row (a
/// claim left by a dead worker is as unsent as a FAILED row until the reaper takes it).
/// Rows of a status and type already there (from another outbox table) add up.
pub fn add_status_row(summary: &mut StatusSummary, count: StatusCount, oldest: Option<SystemTime>) {
    if [status::INIT, status::FAILED, status::PROCESSING].contains(&count.status.as_str()) {
        summary.oldest_unsent = match (summary.oldest_unsent, oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let same =
        |c: &&mut StatusCount| c.status == count.status && c.message_type == count.message_type;
    match summary.counts.iter_mut().find(same) {
        Some(known) => known.rows += count.rows,
        None => summary.counts.push(count),
    }
}

/// The schemas (PostgreSQL) or databases (MySQL) named by the layout's qualified table
/// names, each once, in table order; `qualifier` splits a name as the engine's SQL does.
pub fn table_qualifiers(
    layout: &OutboxLayout,
    qualifier: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for table in layout.tables_in_use() {
        if let Some(q) = qualifier(table) {
            if !out.contains(&q) {
                out.push(q);
            }
        }
    }
    out
}

/// The error of an operation on outbox rows when `outbox.rows = "deleted"`: such rows
/// carry no status, and the log is the only source of their events. The core never asks
/// for one in that mode; an operator command that does gets this.
pub fn rows_carry_no_status() -> outboxd_connector::ConnectorError {
    outboxd_connector::ConnectorError::definite(
        "outbox.rows = \"deleted\": the outbox rows carry no status for outboxd to read or \
         write (the application deletes them; the log is the only source of their events)",
    )
}

/// The `INSERT` of a row outboxd writes into the outbox itself ([`NewOutboxRow`], the
/// canary's) into `table` (quoted), with the engine's identifier quoting and string
/// literal: message id, type, key and payload, and the topic where the table has a topic
/// column. Literals rather than parameters: a literal takes the column's type (text,
/// uuid, JSON or binary), which a text parameter would not.
pub fn own_row_insert(
    table: &str,
    layout: &OutboxLayout,
    row: &NewOutboxRow,
    quote: impl Fn(&str) -> String,
    literal: impl Fn(&str) -> String,
) -> String {
    let names = &layout.columns;
    let mut columns = vec![
        quote(&names.message_id),
        quote(&names.message_type),
        quote(&names.biz_key),
        quote(&names.payload),
    ];
    let mut values = vec![
        literal(&row.message_id),
        literal(&row.message_type),
        literal(&row.biz_key),
        literal(&row.payload),
    ];
    if let (Some(column), Some(topic)) = (&names.topic, &row.topic) {
        columns.push(quote(column));
        values.push(literal(topic));
    }
    format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        columns.join(", "),
        values.join(", ")
    )
}

/// The `DELETE` of the row of `table` whose message id is `message_id`, only once SUCCESS
/// (see [`own_row_insert`]).
pub fn own_row_delete(
    table: &str,
    layout: &OutboxLayout,
    message_id: &str,
    quote: impl Fn(&str) -> String,
    literal: impl Fn(&str) -> String,
) -> String {
    format!(
        "DELETE FROM {table} WHERE {} = {} AND status = 'SUCCESS'",
        quote(&layout.columns.message_id),
        literal(message_id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn oldest_unsent_counts_init_failed_and_processing() {
        let mut s = StatusSummary::default();
        let t = |secs| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        let row = |status: &str| StatusCount {
            status: status.into(),
            message_type: "t".into(),
            rows: 1,
        };
        add_status_row(&mut s, row("SUCCESS"), t(1));
        add_status_row(&mut s, row("FAILED"), t(5));
        add_status_row(&mut s, row("INIT"), t(3));
        assert_eq!(s.oldest_unsent, t(3));
        add_status_row(&mut s, row("MANUAL_REQUIRED"), t(1));
        assert_eq!(
            s.oldest_unsent,
            t(3),
            "MANUAL_REQUIRED waits for an operator"
        );
        add_status_row(&mut s, row("PROCESSING"), t(2));
        assert_eq!(s.oldest_unsent, t(2));
        assert_eq!(s.counts.len(), 5);
        // The same status and type from another outbox table adds up.
        add_status_row(&mut s, row("FAILED"), t(9));
        assert_eq!(s.counts.len(), 5);
        let failed = s
            .counts
            .iter()
            .find(|c| c.status == "FAILED")
            .map(|c| c.rows);
        assert_eq!(failed, Some(2));
        assert!(is_empty(&WriteBack::default()));
    }

    #[test]
    fn qualifiers_once_each() {
        let layout = OutboxLayout::with_tables("app.outbox", "app.inbox", "ops.ckpt");
        let split = |t: &str| t.split_once('.').map(|(q, _)| q.to_owned());
        assert_eq!(table_qualifiers(&layout, split), ["app", "ops"]);
    }

    #[test]
    fn own_rows_name_the_layouts_columns_and_the_topic_only_where_there_is_one() {
        let row = NewOutboxRow {
            message_id: "c-1".into(),
            message_type: "outboxd.canary".into(),
            biz_key: "c-1".into(),
            topic: Some("canary".into()),
            payload: "{}".into(),
        };
        let quote = |n: &str| format!("\"{n}\"");
        let literal = |v: &str| format!("'{v}'");
        let mut layout = OutboxLayout::default();
        assert_eq!(
            own_row_insert("o", &layout, &row, quote, literal),
            "INSERT INTO o (\"message_id\", \"message_type\", \"biz_key\", \"payload\", \"topic\") \
             VALUES ('c-1', 'outboxd.canary', 'c-1', '{}', 'canary')"
        );
        layout.columns.topic = None;
        assert!(!own_row_insert("o", &layout, &row, quote, literal).contains("topic"));
        assert_eq!(
            own_row_delete("o", &layout, "c-1", quote, literal),
            "DELETE FROM o WHERE \"message_id\" = 'c-1' AND status = 'SUCCESS'"
        );
    }
}
