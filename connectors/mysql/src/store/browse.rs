//! The operator console's reads on MySQL/MariaDB, outbox and inbox alike, as the
//! PostgreSQL connector does them (`connectors/postgres/src/store/browse.rs`): the
//! statements of `outboxd_connector_kit::browse` with utf8mb4 string literals, their rows
//! handed to the kit as the text protocol's cells.

use mysql_async::Row;
use outboxd_connector::{ConnectorError, TableKind};
use outboxd_connector_kit::browse::{
    Browse, BrowseTable, Dialect, HeldKeysScan, MakeSql, TextCells,
};

use super::inbox::MysqlInboxStore;
use super::MysqlOutboxStore;
use crate::schema::{quote_ident, sql_string};

/// MySQL's side of the console's statements. A `TIMESTAMP` column is stored in UTC and
/// `UNIX_TIMESTAMP` reads it back as such, whatever the session's time zone.
pub(super) const DIALECT: Dialect = Dialect {
    literal: sql_string,
    epoch_micros: |column| format!("CAST(UNIX_TIMESTAMP({column}) * 1000000 AS SIGNED)"),
    as_text: |column| format!("CAST({column} AS CHAR)"),
    // JSON and text count characters, a `LONGBLOB` bytes; both read back lossily (a
    // binary payload's bytes that are not UTF-8 show as U+FFFD).
    payload_preview: |column, n, _| format!("LEFT({column}, {n})"),
    payload_bytes: |column, _| format!("OCTET_LENGTH({column})"),
    // `CHAR_LENGTH` counts as `LEFT` cuts: characters of text, bytes of a blob.
    payload_cut: |column, n, _| format!("CHAR_LENGTH({column}) > {n}"),
    held_keys: HeldKeysScan::Group,
};

/// A bound on the console's statements on the server too (MySQL's hint). MariaDB takes
/// the hint as a comment: the console stops waiting after 10 s and drops the connection,
/// and the server finishes the statement (every console statement is served by an index
/// or bounded to the rows in trouble).
const STATEMENT_TIMEOUT_HINT: &str = "SELECT /*+ MAX_EXECUTION_TIME(10000) */ ";

/// `sql` with [`STATEMENT_TIMEOUT_HINT`].
fn bounded(sql: String) -> String {
    match sql.strip_prefix("SELECT ") {
        Some(rest) => format!("{STATEMENT_TIMEOUT_HINT}{rest}"),
        None => sql,
    }
}

/// A cell as text, bytes that are not UTF-8 replaced (a binary payload's preview).
fn lossy_text(row: &Row, at: usize) -> Option<String> {
    match row.as_ref(at)? {
        mysql_async::Value::NULL => None,
        mysql_async::Value::Bytes(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        other => Some(other.as_sql(true).trim_matches('\'').to_owned()),
    }
}

/// Each row's cells as text.
fn text_cells(rows: &[Row]) -> Vec<TextCells> {
    rows.iter()
        .map(|row| (0..row.len()).map(|i| lossy_text(row, i)).collect())
        .collect()
}

impl Browse for MysqlOutboxStore {
    const KIND: TableKind = TableKind::Outbox;

    async fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> Result<Vec<TextCells>, ConnectorError> {
        let table = BrowseTable::outbox(
            self.outbox.quoted.clone(),
            &self.connector.layout,
            quote_ident,
        );
        Ok(text_cells(&self.rows(&bounded(make(&table)), what).await?))
    }
}

impl Browse for MysqlInboxStore {
    const KIND: TableKind = TableKind::Inbox;

    async fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> Result<Vec<TextCells>, ConnectorError> {
        let table = BrowseTable::inbox(self.table.clone());
        Ok(text_cells(
            &self.rows_of(&bounded(make(&table)), what).await?,
        ))
    }
}
