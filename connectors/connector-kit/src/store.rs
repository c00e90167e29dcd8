//! Small pieces of the store side that read the same in every engine.

use std::time::SystemTime;

use outboxd_connector::{
    ConnectorError, NewOutboxRow, OutboxLayout, OwnRowState, OwnRowsToDelete, StatusCount,
    StatusSummary, TransactionEnd, WriteBack,
};

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

/// The transaction that writes rows outboxd writes into the outbox itself
/// ([`NewOutboxRow`]: the canary's, `outboxd verify`'s) into `table` (quoted), with the
/// engine's identifier quoting and string literal: `BEGIN`, one multi-row `INSERT` of
/// message id, type, key and payload (and the topic and headers where the table has such
/// columns; NULL for a row without them), then `COMMIT` or `ROLLBACK` as `end` says. Several
/// statements in one string, sent in one round trip (PostgreSQL's simple query, MySQL's
/// multi-statements). Literals rather than parameters: a literal takes the column's type
/// (text, uuid, JSON or binary), which a text parameter would not.
pub fn own_rows_insert(
    table: &str,
    layout: &OutboxLayout,
    rows: &[NewOutboxRow],
    end: TransactionEnd,
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
    columns.extend(names.topic.as_deref().map(&quote));
    columns.extend(names.headers.as_deref().map(&quote));
    let values: Vec<String> = rows
        .iter()
        .map(|row| {
            let mut values = vec![
                literal(&row.message_id),
                literal(&row.message_type),
                literal(&row.biz_key),
                literal(&row.payload),
            ];
            if names.topic.is_some() {
                values.push(row.topic.as_deref().map_or("NULL".into(), &literal));
            }
            if names.headers.is_some() {
                values.push(row.headers.as_deref().map_or("NULL".into(), &literal));
            }
            format!("({})", values.join(", "))
        })
        .collect();
    let end = match end {
        TransactionEnd::Commit => "COMMIT",
        TransactionEnd::Rollback => "ROLLBACK",
    };
    format!(
        "BEGIN; INSERT INTO {table} ({}) VALUES {}; {end}",
        columns.join(", "),
        values.join(", ")
    )
}

/// `column IN (...)` over `values` as literals; `FALSE` for none (`column` as it goes into
/// the statement, quoted where it needs to be). The statements on rows outboxd wrote
/// itself name them by id.
pub fn in_literals(column: &str, values: &[String], literal: impl Fn(&str) -> String) -> String {
    if values.is_empty() {
        return "FALSE".into();
    }
    let values: Vec<String> = values.iter().map(|value| literal(value)).collect();
    format!("{column} IN ({})", values.join(", "))
}

/// The message id column `IN` `message_ids` (see [`in_literals`]).
fn message_id_in(
    layout: &OutboxLayout,
    message_ids: &[String],
    quote: impl Fn(&str) -> String,
    literal: impl Fn(&str) -> String,
) -> String {
    in_literals(&quote(&layout.columns.message_id), message_ids, literal)
}

/// The `SELECT` of [`OutboxStore::own_rows`](outboxd_connector::OutboxStore::own_rows):
/// message id, status, retry count, partition, offset and last error, each as the engine
/// gives it in text (read them with [`own_row_state`]).
pub fn own_rows_select(
    table: &str,
    layout: &OutboxLayout,
    message_ids: &[String],
    quote: impl Fn(&str) -> String,
    literal: impl Fn(&str) -> String,
) -> String {
    format!(
        "SELECT {}, status, retry_count, kafka_partition, kafka_offset, last_error \
         FROM {table} WHERE {}",
        quote(&layout.columns.message_id),
        message_id_in(layout, message_ids, quote, literal)
    )
}

/// A row of [`own_rows_select`] from its cells in text, in the statement's order.
pub fn own_row_state(cells: &[Option<&str>]) -> Result<OwnRowState, ConnectorError> {
    own_row_state_of(cells).map_err(ConnectorError::definite)
}

/// The cells of a row of [`own_rows_select`].
const OWN_ROW_CELLS: usize = 6;

fn own_row_state_of(cells: &[Option<&str>]) -> Result<OwnRowState, String> {
    if cells.len() != OWN_ROW_CELLS {
        return Err(format!(
            "reading outboxd's own rows: {OWN_ROW_CELLS} cells expected, the row has {}",
            cells.len()
        ));
    }
    let cell = |i: usize| cells.get(i).copied().flatten();
    let [message_id, status, retry_count, partition, offset, last_error] =
        [cell(0), cell(1), cell(2), cell(3), cell(4), cell(5)];
    let number = |cell: Option<&str>, what: &str| -> Result<Option<i64>, String> {
        cell.map(|text| {
            text.trim()
                .parse::<i64>()
                .map_err(|e| format!("{what} {text:?} is not a number: {e}"))
        })
        .transpose()
    };
    let partition = number(partition, "kafka_partition")?;
    let offset = number(offset, "kafka_offset")?;
    Ok(OwnRowState {
        message_id: message_id.ok_or("message_id is NULL")?.to_owned(),
        status: status.ok_or("status is NULL")?.to_owned(),
        retry_count: number(retry_count, "retry_count")?
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0),
        position: match (partition, offset) {
            (Some(p), Some(o)) => i32::try_from(p).ok().map(|p| (p, o)),
            _ => None,
        },
        last_error: last_error.map(str::to_owned),
    })
}

/// The `DELETE` of [`OutboxStore::delete_own_rows`](outboxd_connector::OutboxStore::delete_own_rows).
pub fn own_rows_delete(
    table: &str,
    layout: &OutboxLayout,
    message_ids: &[String],
    which: OwnRowsToDelete,
    quote: impl Fn(&str) -> String,
    literal: impl Fn(&str) -> String,
) -> String {
    let only = match which {
        OwnRowsToDelete::Delivered => " AND status = 'SUCCESS'",
        OwnRowsToDelete::All => "",
    };
    format!(
        "DELETE FROM {table} WHERE {}{only}",
        message_id_in(layout, message_ids, quote, literal)
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
        let row = |id: &str, topic: Option<&str>| NewOutboxRow {
            headers: topic.map(|_| r#"{"h":"1"}"#.into()),
            message_id: id.into(),
            message_type: "outboxd.canary".into(),
            biz_key: id.into(),
            topic: topic.map(Into::into),
            payload: "{}".into(),
        };
        let rows = [row("c-1", Some("canary")), row("c-2", None)];
        let quote = |n: &str| format!("\"{n}\"");
        let literal = |v: &str| format!("'{v}'");
        let mut layout = OutboxLayout::default();
        assert_eq!(
            own_rows_insert("o", &layout, &rows, TransactionEnd::Commit, quote, literal),
            "BEGIN; INSERT INTO o (\"message_id\", \"message_type\", \"biz_key\", \"payload\", \
             \"topic\", \"headers\") VALUES ('c-1', 'outboxd.canary', 'c-1', '{}', 'canary', \
             '{\"h\":\"1\"}'), ('c-2', 'outboxd.canary', 'c-2', '{}', NULL, NULL); COMMIT"
        );
        assert!(own_rows_insert(
            "o",
            &layout,
            &rows,
            TransactionEnd::Rollback,
            quote,
            literal
        )
        .ends_with("; ROLLBACK"));
        let ids = ["c-1".to_owned(), "c-2".to_owned()];
        assert_eq!(
            own_rows_delete(
                "o",
                &layout,
                &ids,
                OwnRowsToDelete::Delivered,
                quote,
                literal
            ),
            "DELETE FROM o WHERE \"message_id\" IN ('c-1', 'c-2') AND status = 'SUCCESS'"
        );
        assert_eq!(
            own_rows_delete("o", &layout, &[], OwnRowsToDelete::All, quote, literal),
            "DELETE FROM o WHERE FALSE"
        );
        assert!(own_rows_select("o", &layout, &ids, quote, literal)
            .ends_with("FROM o WHERE \"message_id\" IN ('c-1', 'c-2')"));
        layout.columns.topic = None;
        assert!(
            !own_rows_insert("o", &layout, &rows, TransactionEnd::Commit, quote, literal)
                .contains("topic")
        );
    }

    #[test]
    fn own_row_states_read_from_text() {
        let state = own_row_state(&[
            Some("v-1"),
            Some("SUCCESS"),
            Some("0"),
            Some("3"),
            Some("41"),
            None,
        ])
        .unwrap();
        assert_eq!(state.position, Some((3, 41)));
        assert_eq!(state.status, "SUCCESS");
        let unsent = own_row_state(&[Some("v-2"), Some("INIT"), Some("2"), None, None, Some("x")]);
        assert_eq!(unsent.unwrap().position, None);
        assert!(own_row_state(&[Some("v"), Some("INIT"), Some("x"), None, None, None]).is_err());
        assert!(own_row_state(&[Some("v"), Some("INIT"), Some("0"), None, None]).is_err());
    }
}
