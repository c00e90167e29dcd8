//! The operator console's reads on PostgreSQL, outbox and inbox alike: the statements of
//! `outboxd_connector_kit::browse` with PostgreSQL's literals, run as plain text queries
//! (an operator's page, not a hot path: nothing to prepare) and read back from text.

use std::future::Future;

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
    payload_cut: |column, n, binary| match binary {
        true => format!("octet_length({column}) > {n}"),
        false => format!("length({column}::text) > {n}"),
    },
    held_keys: HeldKeysScan::SkipScan,
};

/// A bound on the console's statements on the server too, not only on the client's wait:
/// a page the operator left does not keep scanning. `LOCAL`: the statements of one simple
/// query run as one implicit transaction, so the bound ends with it.
const STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = '10s'; ";

/// A row's cells as text.
type Cells = Vec<Option<String>>;

/// The text cells of every row `sql` returns.
async fn text_rows(client: &Client, sql: &str) -> Result<Vec<Cells>, tokio_postgres::Error> {
    let messages = client
        .simple_query(&format!("{STATEMENT_TIMEOUT}{sql}"))
        .await?;
    Ok(messages
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(cells(row)),
            _ => None,
        })
        .collect())
}

fn cells(row: &SimpleQueryRow) -> Cells {
    (0..row.len())
        .map(|i| row.get(i).map(str::to_owned))
        .collect()
}

/// Each row read with `read`.
fn read_rows<T>(
    rows: &[Cells],
    read: fn(&[Option<&str>]) -> Result<T, String>,
) -> Result<Vec<T>, ConnectorError> {
    rows.iter()
        .map(|row| {
            let cells: Vec<Option<&str>> = row.iter().map(Option::as_deref).collect();
            read(&cells).map_err(ConnectorError::definite)
        })
        .collect()
}

/// The statement of a read, made for the table as the connection finds it (its payload
/// column `bytea` or not).
type MakeSql<'a> = &'a (dyn Fn(&BrowseTable) -> String + Sync);

/// A store the console reads through: the outbox's or the inbox's, each on its own
/// connection.
pub(crate) trait Browse: Sync {
    /// Which table.
    const KIND: TableKind;

    /// Runs the statement `make` writes for the table as the connection finds it.
    fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> impl Future<Output = Result<Vec<Cells>, ConnectorError>> + Send;
}

/// One page of rows ([`TableAdmin::list_rows`](outboxd_connector::TableAdmin::list_rows)).
pub(crate) async fn list<B: Browse>(
    store: &B,
    query: &RowQuery,
) -> Result<Vec<RowSummary>, ConnectorError> {
    query.check(B::KIND)?;
    let what = format!("listing {} rows", B::KIND.name());
    let sql = |t: &BrowseTable| browse::list_rows_sql(t, &DIALECT, query);
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
    let what = format!("reading {} row {id}", B::KIND.name());
    let sql = |t: &BrowseTable| browse::row_detail_sql(t, &DIALECT, id, preview);
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
    let what = format!("reading the {}'s held keys", B::KIND.name());
    let sql = |t: &BrowseTable| browse::held_keys_sql(t, &DIALECT, after_key, limit);
    read_rows(
        &store.text_rows(&sql, &what).await?,
        browse::held_key_from_cells,
    )
}

impl Browse for PgOutboxStore {
    const KIND: TableKind = TableKind::Outbox;

    async fn text_rows(&self, make: MakeSql<'_>, what: &str) -> Result<Vec<Cells>, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let table =
            BrowseTable::outbox(qualified(self.table()), &self.connector.layout, quote_ident)
                .with_binary_payload(conn.payload_bytea());
        text_rows(&conn.client, &make(&table))
            .await
            .map_err(|e| self.error(&e, what))
    }
}

impl Browse for PgInboxStore {
    const KIND: TableKind = TableKind::Inbox;

    async fn text_rows(&self, make: MakeSql<'_>, what: &str) -> Result<Vec<Cells>, ConnectorError> {
        let table = BrowseTable::inbox(qualified(&self.connector.layout.inbox_table))
            .with_binary_payload(self.payload_is_bytes());
        let sql = make(&table);
        self.with_client(async |client| {
            text_rows(client, &sql)
                .await
                .map_err(|e| self.error(&e, what))
        })
        .await
    }
}
