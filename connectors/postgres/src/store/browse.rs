//! The operator console's reads on PostgreSQL, outbox and inbox alike: the statements of
//! `outboxd_connector_kit::browse` with PostgreSQL's literals, run as plain text queries
//! (an operator's page, not a hot path: nothing to prepare) and read back from text.

use outboxd_connector::{ConnectorError, HeldKey, RowDetail, RowQuery, RowSummary, TableKind};
use outboxd_connector_kit::browse::{self, BrowseTable, Dialect, HeldKeysScan};
use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use super::inbox::PgInboxStore;
use super::own_rows::literal;
use super::PgOutboxStore;
use crate::schema::{qualified, quote_ident};

/// PostgreSQL's side of the console's statements.
const DIALECT: Dialect = Dialect {
    literal,
    epoch_micros: |column| format!("(extract(epoch FROM {column}) * 1000000)::bigint"),
    as_text: |column| format!("{column}::text"),
    // `bytea` in the escape format (printable bytes as they are, others as `\ooo`);
    // `jsonb`, `json` and text through their text output.
    payload_preview: |column, n, binary| match binary {
        true => format!("encode(substring({column} FROM 1 FOR {n}), 'escape')"),
        false => format!("left({column}::text, {n})"),
    },
    payload_bytes: |column, binary| match binary {
        true => format!("octet_length({column})"),
        false => format!("octet_length({column}::text)"),
    },
    held_keys: HeldKeysScan::SkipScan,
};

/// A bound on the console's statements on the server too, not only on the client's wait:
/// a page the operator left does not keep scanning.
const STATEMENT_TIMEOUT: &str = "SET statement_timeout = '10s'; ";

/// The text cells of every row `sql` returns, each read with `read`.
async fn read_rows<T>(
    client: &Client,
    sql: &str,
    read: fn(&[Option<&str>]) -> Result<T, String>,
) -> Result<Result<Vec<T>, ConnectorError>, tokio_postgres::Error> {
    let messages = client
        .simple_query(&format!("{STATEMENT_TIMEOUT}{sql}"))
        .await?;
    Ok(messages
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .map(|row| read(&cells(row)).map_err(ConnectorError::definite))
        .collect())
}

fn cells(row: &SimpleQueryRow) -> Vec<Option<&str>> {
    (0..row.len()).map(|i| row.get(i)).collect()
}

impl PgOutboxStore {
    fn browse(&self, binary_payload: bool) -> BrowseTable {
        let table = qualified(self.table());
        BrowseTable::outbox(table, &self.connector.layout, quote_ident)
            .with_binary_payload(binary_payload)
    }

    /// Runs the statement `sql` makes for the payload column's type.
    async fn browse_rows<T>(
        &self,
        sql: impl Fn(bool) -> String,
        read: fn(&[Option<&str>]) -> Result<T, String>,
        what: &str,
    ) -> Result<Vec<T>, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        read_rows(&conn.client, &sql(conn.payload_bytea()), read)
            .await
            .map_err(|e| self.error(&e, what))?
    }

    pub(crate) async fn browse_list(
        &self,
        query: &RowQuery,
    ) -> Result<Vec<RowSummary>, ConnectorError> {
        query.check(TableKind::Outbox)?;
        let sql = |binary| browse::list_rows_sql(&self.browse(binary), &DIALECT, query);
        self.browse_rows(sql, browse::summary_from_cells, "listing outbox rows")
            .await
    }

    pub(crate) async fn browse_detail(
        &self,
        id: i64,
        preview: usize,
    ) -> Result<Option<RowDetail>, ConnectorError> {
        let sql = |binary| browse::row_detail_sql(&self.browse(binary), &DIALECT, id, preview);
        let rows = self
            .browse_rows(sql, browse::detail_from_cells, "reading an outbox row")
            .await?;
        Ok(rows.into_iter().next())
    }

    pub(crate) async fn browse_held(
        &self,
        after_key: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HeldKey>, ConnectorError> {
        let sql = |binary| browse::held_keys_sql(&self.browse(binary), &DIALECT, after_key, limit);
        self.browse_rows(sql, browse::held_key_from_cells, "reading held outbox keys")
            .await
    }
}

impl PgInboxStore {
    fn browse(&self) -> BrowseTable {
        BrowseTable::inbox(qualified(&self.connector.layout.inbox_table))
            .with_binary_payload(self.payload_is_bytes())
    }

    async fn browse_rows<T>(
        &self,
        sql: &str,
        read: fn(&[Option<&str>]) -> Result<T, String>,
        what: &str,
    ) -> Result<Vec<T>, ConnectorError> {
        self.with_client(async |client| {
            read_rows(client, sql, read)
                .await
                .map_err(|e| self.error(&e, what))?
        })
        .await
    }

    pub(crate) async fn browse_list(
        &self,
        query: &RowQuery,
    ) -> Result<Vec<RowSummary>, ConnectorError> {
        query.check(TableKind::Inbox)?;
        let sql = browse::list_rows_sql(&self.browse(), &DIALECT, query);
        self.browse_rows(&sql, browse::summary_from_cells, "listing inbox rows")
            .await
    }

    pub(crate) async fn browse_detail(
        &self,
        id: i64,
        preview: usize,
    ) -> Result<Option<RowDetail>, ConnectorError> {
        let sql = browse::row_detail_sql(&self.browse(), &DIALECT, id, preview);
        let rows = self
            .browse_rows(&sql, browse::detail_from_cells, "reading an inbox row")
            .await?;
        Ok(rows.into_iter().next())
    }

    pub(crate) async fn browse_held(
        &self,
        after_key: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HeldKey>, ConnectorError> {
        let sql = browse::held_keys_sql(&self.browse(), &DIALECT, after_key, limit);
        self.browse_rows(&sql, browse::held_key_from_cells, "reading held inbox keys")
            .await
    }
}
