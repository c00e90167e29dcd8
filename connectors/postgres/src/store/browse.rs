//! The operator console's reads on PostgreSQL, outbox and inbox alike: the statements of
//! `outboxd_connector_kit::browse` with PostgreSQL's literals, run as plain text queries
//! (an operator's page, not a hot path: nothing to prepare); the kit reads them back
//! (`outboxd_connector_kit::browse::{list, detail, held}`).

use outboxd_connector::{ConnectorError, TableKind};
use outboxd_connector_kit::browse::{
    Browse, BrowseTable, Dialect, HeldKeysScan, MakeSql, TextCells,
};
use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use super::inbox::PgInboxStore;
use super::own_rows::literal;
use super::PgOutboxStore;
use crate::schema::{qualified, quote_ident};

/// PostgreSQL's side of the console's statements.
pub(super) const DIALECT: Dialect = Dialect {
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

/// The text cells of every row `sql` returns.
async fn text_rows(client: &Client, sql: &str) -> Result<Vec<TextCells>, tokio_postgres::Error> {
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

fn cells(row: &SimpleQueryRow) -> TextCells {
    (0..row.len())
        .map(|i| row.get(i).map(str::to_owned))
        .collect()
}

impl Browse for PgOutboxStore {
    const KIND: TableKind = TableKind::Outbox;

    async fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> Result<Vec<TextCells>, ConnectorError> {
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

    async fn text_rows(
        &self,
        make: MakeSql<'_>,
        what: &str,
    ) -> Result<Vec<TextCells>, ConnectorError> {
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
