//! The operator console's reads on MySQL/MariaDB, outbox and inbox alike, as the
//! PostgreSQL connector does them (`connectors/postgres/src/store/browse.rs`): the
//! statements of `outboxd_connector_kit::browse` with utf8mb4 string literals, read back
//! from the text protocol's cells.

use std::future::Future;

use mysql_async::Row;
use outboxd_connector::{ConnectorError, HeldKey, RowDetail, RowQuery, RowSummary};
use outboxd_connector_kit::browse::{self, BrowseTable, Dialect, HeldKeysScan};

use super::inbox::MysqlInboxStore;
use super::MysqlOutboxStore;
use crate::schema::{quote_ident, sql_string};

/// MySQL's side of the console's statements. A `TIMESTAMP` column is stored in UTC and
/// `UNIX_TIMESTAMP` reads it back as such, whatever the session's time zone.
const DIALECT: Dialect = Dialect {
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

/// Each row's cells as text, read with `read`.
fn read_rows<T>(
    rows: &[Row],
    read: fn(&[Option<&str>]) -> Result<T, String>,
) -> Result<Vec<T>, ConnectorError> {
    rows.iter()
        .map(|row| {
            let cells: Vec<Option<String>> = (0..row.len()).map(|i| lossy_text(row, i)).collect();
            let cells: Vec<Option<&str>> = cells.iter().map(Option::as_deref).collect();
            read(&cells).map_err(ConnectorError::definite)
        })
        .collect()
}

/// A store the console reads through: the outbox's or the inbox's, each on its own
/// connection.
pub(crate) trait Browse: Sync {
    /// The table, quoted, with its columns.
    fn browse_table(&self) -> BrowseTable;

    /// Runs `sql`.
    fn text_rows(
        &self,
        sql: &str,
        what: &str,
    ) -> impl Future<Output = Result<Vec<Row>, ConnectorError>> + Send;
}

/// One page of rows ([`TableAdmin::list_rows`](outboxd_connector::TableAdmin::list_rows)).
pub(crate) async fn list<B: Browse>(
    store: &B,
    query: &RowQuery,
) -> Result<Vec<RowSummary>, ConnectorError> {
    let table = store.browse_table();
    query.check(table.kind)?;
    let sql = bounded(browse::list_rows_sql(&table, &DIALECT, query));
    let what = format!("listing {} rows", table.kind.name());
    read_rows(
        &store.text_rows(&sql, &what).await?,
        browse::summary_from_cells,
    )
}

/// One row in full ([`TableAdmin::row_detail`](outboxd_connector::TableAdmin::row_detail)).
pub(crate) async fn detail<B: Browse>(
    store: &B,
    id: i64,
    preview: usize,
) -> Result<Option<RowDetail>, ConnectorError> {
    let table = store.browse_table();
    let sql = bounded(browse::row_detail_sql(&table, &DIALECT, id, preview));
    let what = format!("reading {} row {id}", table.kind.name());
    let rows = read_rows(
        &store.text_rows(&sql, &what).await?,
        browse::detail_from_cells,
    )?;
    Ok(rows.into_iter().next())
}

/// The held keys ([`TableAdmin::held_keys`](outboxd_connector::TableAdmin::held_keys)).
pub(crate) async fn held<B: Browse>(
    store: &B,
    after_key: Option<&str>,
    limit: usize,
) -> Result<Vec<HeldKey>, ConnectorError> {
    let table = store.browse_table();
    let sql = bounded(browse::held_keys_sql(&table, &DIALECT, after_key, limit));
    let what = format!("reading the {}'s held keys", table.kind.name());
    read_rows(
        &store.text_rows(&sql, &what).await?,
        browse::held_key_from_cells,
    )
}

impl Browse for MysqlOutboxStore {
    fn browse_table(&self) -> BrowseTable {
        BrowseTable::outbox(
            self.outbox.quoted.clone(),
            &self.connector.layout,
            quote_ident,
        )
    }

    async fn text_rows(&self, sql: &str, what: &str) -> Result<Vec<Row>, ConnectorError> {
        self.rows(sql, what).await
    }
}

impl Browse for MysqlInboxStore {
    fn browse_table(&self) -> BrowseTable {
        BrowseTable::inbox(self.table.clone())
    }

    async fn text_rows(&self, sql: &str, what: &str) -> Result<Vec<Row>, ConnectorError> {
        self.rows_of(sql, what).await
    }
}
