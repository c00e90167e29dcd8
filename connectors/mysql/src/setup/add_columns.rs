//! `outboxd init --add-columns` for MySQL and MariaDB: the columns outboxd writes, added to
//! an application's outbox table whose rows it is to keep (`outbox.rows = "kept"` on
//! Debezium's table, or on any table `outbox.columns` maps), and the two indexes the retry
//! worker and strict ordering use.
//!
//! One `ALTER TABLE` adds everything a table lacks (one rebuild where the server needs one:
//! the auto-increment row id fills the rows already there in table order). `status` is
//! added with the default SUCCESS, so the rows already there (sent by whatever relayed
//! them before) are not sent again; a second statement then makes INIT the default for
//! every row inserted afterwards. MySQL's DDL is not transactional: should that second
//! statement fail, `init --add-columns` says so and running it again sets the default.

use outboxd_connector::OutboxLayout;
use outboxd_connector_kit::columns::{self, StateColumn};
use outboxd_connector_kit::setup as kit_setup;

use super::*;

/// The statements that add `missing` (names from [`columns::state_columns`]) to `table`
/// and its two retry indexes, under the layout's names; empty when nothing is missing.
pub(crate) fn add_columns_sql(layout: &OutboxLayout, table: &str, missing: &[&str]) -> Vec<String> {
    let quoted = qualified(table);
    let mut clauses = Vec::new();
    let mut status_added = false;
    for (name, kind) in columns::state_columns(layout) {
        if !missing.contains(&name) {
            continue;
        }
        let definition = match kind {
            StateColumn::RowId => "BIGINT NOT NULL AUTO_INCREMENT UNIQUE",
            StateColumn::Status => {
                status_added = true;
                "VARCHAR(16) NOT NULL DEFAULT 'SUCCESS'"
            }
            StateColumn::RetryCount => "INT NOT NULL DEFAULT 0",
            StateColumn::MaxRetryCount => "INT NOT NULL DEFAULT 10",
            StateColumn::Timestamp => "TIMESTAMP(6) NULL DEFAULT NULL",
            StateColumn::ClaimToken => "CHAR(36) NULL",
            StateColumn::LastError => "TEXT NULL",
            StateColumn::Partition => "INT NULL",
            StateColumn::Offset => "BIGINT NULL",
        };
        clauses.push(format!("ADD COLUMN {} {definition}", quote_ident(name)));
    }
    if clauses.is_empty() {
        return Vec::new();
    }
    // The indexes of schemas/mysql/outbox.sql, on the mapped id and key.
    let id = quote_ident(layout.columns.id.as_deref().unwrap_or("id"));
    let key = quote_ident(&layout.columns.biz_key);
    let base = split_qualified(table).1;
    clauses.push(format!(
        "ADD INDEX {} (next_retry_time, {id})",
        quote_ident(&format!("{base}_retry_due_idx"))
    ));
    clauses.push(format!(
        "ADD INDEX {} ({key}, next_retry_time, {id})",
        quote_ident(&format!("{base}_key_retry_idx"))
    ));
    let mut statements = vec![format!("ALTER TABLE {quoted} {}", clauses.join(", "))];
    if status_added {
        statements.push(format!(
            "ALTER TABLE {quoted} ALTER COLUMN status SET DEFAULT 'INIT'"
        ));
    }
    statements
}

/// The columns of [`columns::state_columns`] the table `table` lacks (names compared
/// without case, as MySQL compares column names).
pub(super) async fn missing_state_columns<'a>(
    conn: &mut Conn,
    c: &MysqlConnector,
    layout: &'a OutboxLayout,
    table: &str,
) -> Result<Vec<&'a str>, ConnectorError> {
    let (db, name) = table_ident(table, &c.config().database);
    let sql = format!(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} \
         AND TABLE_NAME = {}",
        sql_string(&db),
        sql_string(&name)
    );
    let rows = query(conn, &sql, &format!("reading the columns of {table}")).await?;
    let mut present = Vec::with_capacity(rows.len());
    for row in &rows {
        present.push(text_or_empty(row, 0)?);
    }
    Ok(columns::missing_state_columns(layout, &present, |a, b| {
        a.eq_ignore_ascii_case(b)
    }))
}

/// `outboxd init --add-columns`: adds what each application's outbox table lacks. Returns
/// one line per table.
pub(crate) async fn add_columns(c: &MysqlConnector) -> Result<Vec<String>, ConnectorError> {
    let layout = c.layout();
    if !columns::adds_state_columns(layout) {
        return Ok(vec![
            "--add-columns: nothing to add (outboxd's own table is created whole by `init`; \
             deleted rows carry no status)"
                .to_owned(),
        ]);
    }
    let mut conn = c.sql_conn().await?;
    let mut report = Vec::new();
    for table in &layout.outbox_tables {
        if !table_exists(&mut conn, c, table).await? {
            return Err(ConnectorError::definite(format!(
                "outbox table {table} does not exist: it is the application's table \
                 (outbox.columns), which outboxd does not create; create it first"
            )));
        }
        let missing = missing_state_columns(&mut conn, c, layout, table).await?;
        if missing.is_empty() {
            report.push(format!("table {table}: has every column outboxd writes"));
            continue;
        }
        for sql in add_columns_sql(layout, table, &missing) {
            execute(
                &mut conn,
                &sql,
                &format!("adding outboxd's columns to {table}"),
            )
            .await?;
        }
        report.push(format!(
            "added column(s) {} to table {table}, and its retry indexes (rows already there: \
             SUCCESS, not sent)",
            missing.join(", ")
        ));
    }
    Ok(report)
}

/// `init` without `--add-columns` on an application's table with kept rows: the definite
/// error naming what is missing, before anything is created.
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
        let missing = missing_state_columns(conn, c, layout, table).await?;
        if !missing.is_empty() {
            return Err(kit_setup::columns_to_add(table, &missing));
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
            columns: ColumnNames {
                id: Some("outboxd_seq".into()),
                ..ColumnNames::debezium()
            },
            ..OutboxLayout::default()
        };
        let sql = add_columns_sql(&layout, "app.outboxevent", &["outboxd_seq", "status"]);
        assert_eq!(sql.len(), 2, "{sql:?}");
        assert!(sql[0].starts_with(
            "ALTER TABLE `app`.`outboxevent` ADD COLUMN `outboxd_seq` BIGINT NOT NULL \
             AUTO_INCREMENT UNIQUE, ADD COLUMN `status` VARCHAR(16) NOT NULL DEFAULT 'SUCCESS'"
        ));
        assert!(sql[0].contains("(`aggregateid`, next_retry_time, `outboxd_seq`)"));
        assert!(sql[1].ends_with("SET DEFAULT 'INIT'"));
        assert!(add_columns_sql(&layout, "app.outboxevent", &[]).is_empty());
    }
}
