//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`) and `outboxd verify`'s synthetic events, read back and deleted by their
//! message ids; as the PostgreSQL connector does them (see
//! `connectors/postgres/src/store/own_rows.rs`): the statements of
//! `outboxd_connector_kit::store::own_rows_insert` and its siblings, each value a utf8mb4
//! string ([`sql_string`]), which a text, JSON or binary column takes.

use outboxd_connector::{
    ConnectorError, NewOutboxRow, OwnRowState, OwnRowsToDelete, TransactionEnd,
};

use outboxd_connector_kit::store::{
    own_row_state, own_rows_delete, own_rows_insert, own_rows_select,
};

use crate::client::text;
use crate::schema::{quote_ident, sql_string};
use crate::store::MysqlOutboxStore;

impl MysqlOutboxStore {
    pub(crate) async fn insert_own_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> Result<(), ConnectorError> {
        if rows.is_empty() {
            return Ok(());
        }
        let layout = &self.connector.layout;
        let sql = own_rows_insert(
            &self.outbox.quoted,
            layout,
            rows,
            end,
            quote_ident,
            sql_string,
        );
        // A failed statement drops the connection (see `update`), and its transaction with it.
        self.update(&sql, "writing outboxd's own outbox rows")
            .await
            .map(drop)
    }

    pub(crate) async fn read_own_rows(
        &self,
        message_ids: &[String],
    ) -> Result<Vec<OwnRowState>, ConnectorError> {
        let layout = &self.connector.layout;
        let sql = own_rows_select(
            &self.outbox.quoted,
            layout,
            message_ids,
            quote_ident,
            sql_string,
        );
        let rows = self.rows(&sql, "reading outboxd's own outbox rows").await?;
        let mut states = Vec::with_capacity(rows.len());
        for row in rows {
            let cells = (0..row.len())
                .map(|i| text(&row, i))
                .collect::<Result<Vec<Option<String>>, _>>()?;
            let cells: Vec<Option<&str>> = cells.iter().map(Option::as_deref).collect();
            states.push(own_row_state(&cells)?);
        }
        Ok(states)
    }

    pub(crate) async fn delete_own_rows_of(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> Result<u64, ConnectorError> {
        let layout = &self.connector.layout;
        let sql = own_rows_delete(
            &self.outbox.quoted,
            layout,
            message_ids,
            which,
            quote_ident,
            sql_string,
        );
        self.update(&sql, "deleting outboxd's own outbox rows")
            .await
    }
}
