//! Helpers for the lines of `outboxd check`, the same in every engine.

use outboxd_connector::{CheckLine, CheckReport, ConnectorError};

use crate::columns;

/// Adds `line`, or a FAIL line for `item` when the query behind it failed.
pub fn push(report: &mut CheckReport, item: &str, line: Result<CheckLine, ConnectorError>) {
    report.push(line.unwrap_or_else(|e| failed_query(item, &e)));
}

/// The line of an item that could not be checked because a query failed.
pub fn failed_query(item: &str, e: &ConnectorError) -> CheckLine {
    CheckLine::fail(item, format!("could not check: {e}"), "see the error above")
}

/// The `outbox table` line: OK when every column of
/// [`columns::required_columns`] is there, else FAIL naming the missing ones.
/// `present` says whether the table has a column of that name (each engine compares
/// names as its SQL does); `schema_file` is the engine's DDL (`schemas/<engine>/outbox.sql`)
/// and `quoted_table` the table's name as the engine's SQL writes it.
pub fn outbox_columns_line(
    table: &str,
    quoted_table: &str,
    key_column: &str,
    schema_file: &str,
    present: impl Fn(&str) -> bool,
) -> CheckLine {
    let missing: Vec<&str> = columns::required_columns(key_column)
        .into_iter()
        .filter(|name| !present(name))
        .collect();
    if missing.is_empty() {
        CheckLine::ok(
            "outbox table",
            format!("{table}, all required columns present"),
        )
    } else {
        CheckLine::fail(
            "outbox table",
            format!("{table} lacks column(s) {}", missing.join(", ")),
            format!(
                "add them as in {schema_file} (ALTER TABLE {quoted_table} ADD COLUMN …), or set \
                 the key column in the config"
            ),
        )
    }
}

/// The `outbox payload` line: OK when `payload`'s type (as the engine's catalog names
/// it) is one of `accepted`, else FAIL with `fix`. `None` when the table has no payload
/// column (the columns line says so).
pub fn payload_type_line(
    columns: &[(String, String)],
    accepted: &[&str],
    fix: &str,
) -> Option<CheckLine> {
    let (_, ty) = columns.iter().find(|(c, _)| c == "payload")?;
    Some(if accepted.contains(&ty.as_str()) {
        CheckLine::ok("outbox payload", ty.clone())
    } else {
        CheckLine::fail("outbox payload", format!("payload is {ty}"), fix)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::CheckStatus;

    #[test]
    fn missing_columns_are_named() {
        let line = outbox_columns_line("outbox", "`outbox`", "biz_key", "x.sql", |c| {
            c != "claim_token" && c != "claimed_at"
        });
        assert_eq!(line.status, CheckStatus::Fail);
        assert_eq!(
            line.detail,
            "outbox lacks column(s) claimed_at, claim_token"
        );
        let line = outbox_columns_line("outbox", "`outbox`", "tenant", "x.sql", |c| c != "tenant");
        assert_eq!(line.detail, "outbox lacks column(s) tenant");
        let ok = outbox_columns_line("outbox", "`outbox`", "biz_key", "x.sql", |_| true);
        assert_eq!(ok.status, CheckStatus::Ok);
    }
}
