//! Small pieces of the store side that read the same in every engine.

use std::time::SystemTime;

use outboxd_connector::{OutboxLayout, StatusCount, StatusSummary, WriteBack};

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
}
