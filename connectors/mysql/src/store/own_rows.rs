//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`), and its deletion once delivered; as the PostgreSQL connector does them
//! (see `connectors/postgres/src/store/own_rows.rs`): the statements of
//! `outboxd_connector_kit::store::own_row_insert`, each value a utf8mb4 string
//! ([`sql_string`]), which a text, JSON or binary column takes.

use outboxd_connector::{ConnectorError, NewOutboxRow};

use outboxd_connector_kit::store::{own_row_delete, own_row_insert};

use crate::schema::{quote_ident, sql_string};
use crate::store::MysqlOutboxStore;

impl MysqlOutboxStore {
    pub(crate) async fn insert_own_row(&self, row: &NewOutboxRow) -> Result<(), ConnectorError> {
        let layout = &self.connector.layout;
        let sql = own_row_insert(&self.outbox.quoted, layout, row, quote_ident, sql_string);
        self.update(&sql, "writing a canary row").await.map(drop)
    }

    pub(crate) async fn delete_own_row(&self, message_id: &str) -> Result<bool, ConnectorError> {
        let layout = &self.connector.layout;
        let sql = own_row_delete(
            &self.outbox.quoted,
            layout,
            message_id,
            quote_ident,
            sql_string,
        );
        let deleted = self.update(&sql, "deleting a delivered canary row").await?;
        Ok(deleted > 0)
    }
}
