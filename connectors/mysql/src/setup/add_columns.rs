//! `outboxd init --add-columns` for MySQL and MariaDB: the columns outboxd writes, added to
//! an application's outbox table whose rows it is to keep (`outbox.rows = "kept"` on
//! Debezium's table, or on any table `outbox.columns` maps), and the two indexes the retry
//! worker and strict ordering use.
//!
//! One `ALTER TABLE` adds everything a table lacks (one rebuild where the server needs one:
//! the auto-increment row id fills the rows already there in table order). `status` is
//! added with the default SUCCESS, so the rows already there (sent by whatever relayed
//! them before) are not sent again; a second statement then makes INIT the default for
//! every row inserted afterwards. MySQL's DDL is not transactional: rows the application
//! inserts between the two statements are SUCCESS, so run it before outboxd relays from
//! the table (README says so). Should the second statement fail, `init` refuses to go on
//! while `status` does not default to INIT, and `init --add-columns` sets it.

use outboxd_connector::OutboxLayout;
use outboxd_connector_kit::columns::{self, StateColumn};
use outboxd_connector_kit::setup as kit_setup;

use super::*;

/// What a table has of outboxd's columns and indexes.
#[derive(Debug, Default)]
pub(crate) struct TableState {
    /// The table's columns, with their `COLUMN_DEFAULT` as `information_schema` gives it.
    pub(crate) columns: Vec<(String, Option<String>)>,
    /// The names of its indexes.
    pub(crate) indexes: Vec<String>,
}

impl TableState {
    /// The columns of [`columns::state_columns`] it lacks (names compared without case, as
    /// MySQL compares column names).
    pub(crate) fn missing<'a>(&self, layout: &'a OutboxLayout) -> Vec<&'a str> {
        columns::missing_state_columns(layout, |name| {
            self.columns
                .iter()
                .any(|(p, _)| p.eq_ignore_ascii_case(name))
        })
    }

    /// Whether it has a `status` column that does not default to INIT (new rows would
    /// not be published).
    fn status_default_is_not_init(&self) -> bool {
        self.columns.iter().any(|(name, default)| {
            name.eq_ignore_ascii_case("status")
                && default.as_deref().map(|d| d.trim_matches('\'')) != Some("INIT")
        })
    }
}

/// The statements that give `table` what `state` lacks of outboxd's columns and of its
/// two retry indexes, under the layout's names, and make INIT the default of `status`.
/// Empty when nothing is missing. [`TableState::default`] gives the whole script.
pub(crate) fn add_columns_sql(
    layout: &OutboxLayout,
    table: &str,
    state: &TableState,
) -> Vec<String> {
    let quoted = qualified(table);
    let missing = state.missing(layout);
    let mut clauses = Vec::new();
    for (name, kind) in columns::state_columns(layout) {
        if !missing.contains(&name) {
            continue;
        }
        let definition = match kind {
            StateColumn::RowId => "BIGINT NOT NULL AUTO_INCREMENT UNIQUE",
            StateColumn::Status => "VARCHAR(16) NOT NULL DEFAULT 'SUCCESS'",
            StateColumn::RetryCount => "INT NOT NULL DEFAULT 0",
            StateColumn::MaxRetryCount => "INT NOT NULL DEFAULT 10",
            StateColumn::Timestamp => "TIMESTAMP(6) NULL DEFAULT NULL",
            StateColumn::UpdatedAt => "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
            StateColumn::ClaimToken => "CHAR(36) NULL",
            StateColumn::LastError => "TEXT NULL",
            StateColumn::Partition => "INT NULL",
            StateColumn::Offset => "BIGINT NULL",
        };
        clauses.push(format!("ADD COLUMN {} {definition}", quote_ident(name)));
    }
    // The indexes of schemas/mysql/outbox.sql, on the mapped id and key.
    let id = quote_ident(layout.columns.id.as_deref().unwrap_or("id"));
    let key = quote_ident(&layout.columns.biz_key);
    let base = split_qualified(table).1;
    for (index, columns) in [
        (
            format!("{base}_retry_due_idx"),
            format!("next_retry_time, {id}"),
        ),
        (
            format!("{base}_key_retry_idx"),
            format!("{key}, next_retry_time, {id}"),
        ),
    ] {
        if !state.indexes.iter().any(|i| i.eq_ignore_ascii_case(&index)) {
            clauses.push(format!("ADD INDEX {} ({columns})", quote_ident(&index)));
        }
    }
    let mut statements = Vec::new();
    if !clauses.is_empty() {
        statements.push(format!("ALTER TABLE {quoted} {}", clauses.join(", ")));
    }
    if missing.contains(&"status") || state.status_default_is_not_init() {
        statements.push(format!(
            "ALTER TABLE {quoted} ALTER COLUMN status SET DEFAULT 'INIT'"
        ));
    }
    statements
}

/// The columns (with their defaults) and indexes of `table`.
pub(super) async fn table_state(
    conn: &mut Conn,
    c: &MysqlConnector,
    table: &str,
) -> Result<TableState, ConnectorError> {
    let (db, name) = table_ident(table, &c.config().database);
    let at = format!(
        "TABLE_SCHEMA = {} AND TABLE_NAME = {}",
        sql_string(&db),
        sql_string(&name)
    );
    let what = format!("reading the columns of {table}");
    let sql =
        format!("SELECT COLUMN_NAME, COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE {at}");
    let mut state = TableState::default();
    for row in &query(conn, &sql, &what).await? {
        let default = text_or_empty(row, 1)?;
        let default = (!default.is_empty() && default != "NULL").then_some(default);
        state.columns.push((text_or_empty(row, 0)?, default));
    }
    let sql = format!("SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE {at}");
    for row in &query(conn, &sql, &what).await? {
        state.indexes.push(text_or_empty(row, 0)?);
    }
    Ok(state)
}

/// `outboxd init --add-columns`: adds what each application's outbox table lacks. Returns
/// one line per table.
pub(crate) async fn add_columns(c: &MysqlConnector) -> Result<Vec<String>, ConnectorError> {
    let layout = c.layout();
    if !columns::adds_state_columns(layout) {
        return Ok(vec![kit_setup::nothing_to_add()]);
    }
    let mut conn = c.sql_conn().await?;
    let mut report = Vec::new();
    for table in &layout.outbox_tables {
        if !table_exists(&mut conn, c, table).await? {
            return Err(kit_setup::application_table_missing(table));
        }
        let state = table_state(&mut conn, c, table).await?;
        let missing = state.missing(layout);
        for sql in add_columns_sql(layout, table, &state) {
            execute(
                &mut conn,
                &sql,
                &format!("adding outboxd's columns to {table}"),
            )
            .await?;
        }
        report.push(kit_setup::added_columns_line(table, &missing));
    }
    Ok(report)
}

/// `init` without `--add-columns` on an application's table with kept rows: the definite
/// error naming what is missing (or a `status` that does not default to INIT), before
/// anything is created.
pub(super) async fn refuse_missing_columns(
    conn: &mut Conn,
    c: &MysqlConnector,
    layout: &OutboxLayout,
) -> Result<(), ConnectorError> {
    if !columns::adds_state_columns(layout) {
        return Ok(());
    }
    for table in &layout.outbox_tables {
        if !table_exists(conn, c, table).await? {
            continue; // `application_outbox` says so
        }
        let state = table_state(conn, c, table).await?;
        let missing = state.missing(layout);
        if !missing.is_empty() {
            return Err(kit_setup::columns_to_add(table, &missing));
        }
        if state.status_default_is_not_init() {
            return Err(ConnectorError::definite(format!(
                "outbox table {table}: `status` does not default to INIT, so the \
                 application's new rows would not be published: run `outboxd init \
                 --add-columns` (it sets the default)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::ColumnNames;

    #[test]
    fn one_alter_adds_the_missing_columns_then_new_rows_default_to_init() {
        let layout = OutboxLayout {
            outbox_tables: vec!["app.outboxevent".into()],
            key_column: "aggregateid".into(),
            columns: ColumnNames::debezium_kept(),
            ..OutboxLayout::default()
        };
        let state = TableState {
            columns: ["id", "aggregatetype", "aggregateid", "type", "payload"]
                .into_iter()
                .chain(columns::state_columns(&layout).into_iter().map(|(n, _)| n))
                .filter(|n| *n != "outboxd_seq" && *n != "status")
                .map(|n| (n.to_owned(), None))
                .collect(),
            indexes: vec!["PRIMARY".into()],
        };
        let sql = add_columns_sql(&layout, "app.outboxevent", &state);
        assert_eq!(sql.len(), 2, "{sql:?}");
        assert!(sql[0].starts_with(
            "ALTER TABLE `app`.`outboxevent` ADD COLUMN `outboxd_seq` BIGINT NOT NULL \
             AUTO_INCREMENT UNIQUE, ADD COLUMN `status` VARCHAR(16) NOT NULL DEFAULT 'SUCCESS', \
             ADD INDEX"
        ));
        assert!(sql[0].contains("(`aggregateid`, next_retry_time, `outboxd_seq`)"));
        assert!(sql[1].ends_with("SET DEFAULT 'INIT'"));
        // Everything there, status defaulting to INIT: nothing to do.
        let mut done = state;
        done.columns.push(("outboxd_seq".into(), None));
        done.columns.push(("status".into(), Some("'INIT'".into())));
        done.indexes.push("outboxevent_retry_due_idx".into());
        done.indexes.push("outboxevent_key_retry_idx".into());
        assert!(add_columns_sql(&layout, "app.outboxevent", &done).is_empty());
        // A status left defaulting to SUCCESS by a half-done run: set to INIT.
        done.columns.last_mut().unwrap().1 = Some("SUCCESS".into());
        let repair = add_columns_sql(&layout, "app.outboxevent", &done);
        assert_eq!(repair.len(), 1);
        assert!(repair[0].ends_with("SET DEFAULT 'INIT'"));
    }
}
