//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`), and its deletion once delivered; as the PostgreSQL connector does them
//! (see `connectors/postgres/src/store/own_rows.rs`). Each value is a utf8mb4 string
//! ([`sql_string`]), which a text, JSON or binary column takes.

use outboxd_connector::{ConnectorError, NewOutboxRow};

use crate::schema::{quote_ident, sql_string};
use crate::store::MysqlOutboxStore;

impl MysqlOutboxStore {
    pub(crate) async fn insert_own_row(&self, row: &NewOutboxRow) -> Result<(), ConnectorError> {
        let names = &self.connector.layout.columns;
        let mut columns = vec![
            quote_ident(&names.message_id),
            quote_ident(&names.message_type),
            quote_ident(&names.biz_key),
            quote_ident(&names.payload),
        ];
        let mut values = vec![
            sql_string(&row.message_id),
            sql_string(&row.message_type),
            sql_string(&row.biz_key),
            sql_string(&row.payload),
        ];
        if let (Some(column), Some(topic)) = (&names.topic, &row.topic) {
            columns.push(quote_ident(column));
            values.push(sql_string(topic));
        }
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            self.outbox.quoted,
            columns.join(", "),
            values.join(", ")
        );
        self.update(&sql, "writing a canary row").await.map(drop)
    }

    pub(crate) async fn delete_own_row(&self, message_id: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "DELETE FROM {} WHERE {} = {} AND status = 'SUCCESS'",
            self.outbox.quoted,
            quote_ident(&self.connector.layout.columns.message_id),
            sql_string(message_id)
        );
        let deleted = self.update(&sql, "deleting a delivered canary row").await?;
        Ok(deleted > 0)
    }
}
