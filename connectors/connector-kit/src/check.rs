//! Helpers for the lines of `outboxd check`, the same in every engine.

use outboxd_connector::{CheckLine, CheckReport, ConnectorError, OutboxLayout};

use crate::columns;

/// Adds `line`, or a FAIL line for `item` when the query behind it failed.
pub fn push(report: &mut CheckReport, item: &str, line: Result<CheckLine, ConnectorError>) {
    report.push(line.unwrap_or_else(|e| failed_query(item, &e)));
}

/// The line of an item that could not be checked because a query failed.
pub fn failed_query(item: &str, e: &ConnectorError) -> CheckLine {
    CheckLine::fail(item, format!("could not check: {e}"), "see the error above")
}

/// The `outbox table` line: OK when every required column is there, else FAIL naming
/// the missing ones. With kept rows those are [`columns::required_columns`] (outboxd's
/// table); with deleted rows, the columns the log path reads under `outbox.columns`
/// ([`columns::log_fields`]). `present` says whether the table has a column of that name
/// (each engine compares names as its SQL does); `schema_file` is the engine's DDL
/// (`schemas/<engine>/outbox.sql`) and `quoted_table` the table's name as the engine's SQL
/// writes it.
pub fn outbox_columns_line(
    table: &str,
    quoted_table: &str,
    layout: &OutboxLayout,
    schema_file: &str,
    present: impl Fn(&str) -> bool,
) -> CheckLine {
    let required: Vec<&str> = match layout.tracks_status() {
        true => columns::required_columns(layout),
        false => columns::log_fields(layout)
            .into_iter()
            .filter(|(field, _)| !field.optional_in_log())
            .map(|(_, name)| name)
            .collect(),
    };
    let mut missing: Vec<&str> = required.into_iter().filter(|name| !present(name)).collect();
    missing.dedup();
    if missing.is_empty() {
        let detail = match columns::missing_trace_column(layout, &present) {
            Some(trace) => format!(
                "{table}, all required columns present; no trace column `{trace}`: events \
                 carry no trace context"
            ),
            None => format!("{table}, all required columns present"),
        };
        CheckLine::ok("outbox table", detail)
    } else if columns::adds_state_columns(layout) {
        CheckLine::fail(
            "outbox table",
            format!("{table} lacks column(s) {}", missing.join(", ")),
            "run `outboxd init --add-columns` (it adds the integer row id and the status \
             columns to the application's table; `outboxd schema` prints the statements), or \
             name the table's own columns in [outbox.columns]",
        )
    } else if layout.tracks_status() {
        CheckLine::fail(
            "outbox table",
            format!("{table} lacks column(s) {}", missing.join(", ")),
            format!(
                "add them as in {schema_file} (ALTER TABLE {quoted_table} ADD COLUMN …), or set \
                 the key column in the config"
            ),
        )
    } else {
        CheckLine::fail(
            "outbox table",
            format!("{table} lacks column(s) {}", missing.join(", ")),
            "name the table's own columns in [outbox.columns] (outbox.rows = \"deleted\" reads \
             only these), or check outbox.layout",
        )
    }
}

/// Privileges a role lacks on tables: `(table as the report names it, privileges)`.
pub type MissingGrants<'a> = [(String, Vec<&'a str>)];

/// The `table grants` line: OK when `missing` is empty, else FAIL saying what `role` (as
/// the report names it, e.g. `the user` or the role's name) lacks on which table, with the
/// `GRANT … ON <table> TO <grantee>;` statements that fix it, each table written by
/// `table_sql`, for `who_grants` to run (e.g. `as the tables' owner`); `grants_file` is the
/// engine's full list (`schemas/<engine>/grants.sql`).
pub fn table_grants_line(
    role: &str,
    missing: &MissingGrants<'_>,
    table_sql: impl Fn(&str) -> String,
    grantee: &str,
    who_grants: &str,
    grants_file: &str,
) -> CheckLine {
    const ITEM: &str = "table grants";
    if missing.is_empty() {
        return CheckLine::ok(
            ITEM,
            format!("{role} may read and write back the outbox and the checkpoint"),
        );
    }
    let said: Vec<String> = (missing.iter())
        .map(|(table, lacking)| format!("{} on {table}", lacking.join(", ")))
        .collect();
    let grants: Vec<String> = (missing.iter())
        .map(|(table, lacking)| {
            format!(
                "GRANT {} ON {} TO {grantee};",
                lacking.join(", "),
                table_sql(table)
            )
        })
        .collect();
    CheckLine::fail(
        ITEM,
        format!("{role} lacks {}", said.join("; ")),
        format!("{who_grants}: {} (see {grants_file})", grants.join(" ")),
    )
}

/// The `outbox payload` line: OK when `payload`'s type (as the engine's catalog names
/// it) is one of `accepted`, else FAIL with `fix`. `None` when the table has no payload
/// column (the columns line says so).
pub fn payload_type_line(
    columns: &[(String, String)],
    payload: &str,
    accepted: &[&str],
    fix: &str,
) -> Option<CheckLine> {
    let (_, ty) = columns
        .iter()
        .find(|(c, _)| c.eq_ignore_ascii_case(payload))?;
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
        let layout = OutboxLayout::default();
        let line = outbox_columns_line("outbox", "`outbox`", &layout, "x.sql", |c| {
            c != "claim_token" && c != "claimed_at"
        });
        assert_eq!(line.status, CheckStatus::Fail);
        assert_eq!(
            line.detail,
            "outbox lacks column(s) claimed_at, claim_token"
        );
        let tenant = OutboxLayout {
            key_column: "tenant".into(),
            ..OutboxLayout::default()
        };
        let line = outbox_columns_line("outbox", "`outbox`", &tenant, "x.sql", |c| c != "tenant");
        assert_eq!(line.detail, "outbox lacks column(s) tenant");
        let ok = outbox_columns_line("outbox", "`outbox`", &layout, "x.sql", |_| true);
        assert_eq!(ok.status, CheckStatus::Ok);
        // Debezium's table: its own columns, no status columns.
        let debezium = OutboxLayout {
            rows: outboxd_connector::RowLifecycle::Deleted,
            key_column: "aggregateid".into(),
            columns: outboxd_connector::ColumnNames::debezium(),
            ..OutboxLayout::default()
        };
        // Debezium's documented table has no `tracingspancontext` (Debezium needs it only
        // with tracing on): OK, said once.
        let columns = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        let line = outbox_columns_line("outbox", "`outbox`", &debezium, "x.sql", |c| {
            columns.contains(&c)
        });
        assert_eq!(line.status, CheckStatus::Ok, "{line:?}");
        assert!(
            line.detail.contains("no trace column `tracingspancontext`"),
            "{line:?}"
        );
        let line = outbox_columns_line("outbox", "`outbox`", &debezium, "x.sql", |c| {
            columns.contains(&c) && c != "aggregateid"
        });
        assert_eq!(line.detail, "outbox lacks column(s) aggregateid");
        assert!(line.fix.unwrap_or_default().contains("[outbox.columns]"));
    }
}
