//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`), and its deletion once delivered: the statements of
//! `outboxd_connector_kit::store::own_row_insert`, with PostgreSQL's literals; plain, not
//! prepared (a canary runs once an interval, not per event).

use outboxd_connector::{ConnectorError, NewOutboxRow};

use outboxd_connector_kit::store::{own_row_delete, own_row_insert};

use crate::schema::{qualified, quote_ident};
use crate::store::PgOutboxStore;

/// `value` as a PostgreSQL string literal (an escape string when it has a backslash, so
/// the text is the same whatever `standard_conforming_strings` says).
fn literal(value: &str) -> String {
    let quoted = value.replace('\'', "''");
    if quoted.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

impl PgOutboxStore {
    pub(crate) async fn insert_own_row(&self, row: &NewOutboxRow) -> Result<(), ConnectorError> {
        let table = qualified(self.table());
        let sql = own_row_insert(&table, &self.connector.layout, row, quote_ident, literal);
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.client
            .execute(sql.as_str(), &[])
            .await
            .map_err(|e| self.error(&e, "writing a canary row"))?;
        Ok(())
    }

    pub(crate) async fn delete_own_row(&self, message_id: &str) -> Result<bool, ConnectorError> {
        let table = qualified(self.table());
        let sql = own_row_delete(
            &table,
            &self.connector.layout,
            message_id,
            quote_ident,
            literal,
        );
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let deleted = conn
            .client
            .execute(sql.as_str(), &[])
            .await
            .map_err(|e| self.error(&e, "deleting a delivered canary row"))?;
        Ok(deleted > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::literal;

    #[test]
    fn literals_keep_quotes_and_backslashes() {
        assert_eq!(literal("a'b"), "'a''b'");
        assert_eq!(literal(r"a\b"), r"E'a\\b'");
        assert_eq!(literal(r#"{"canary":1}"#), r#"'{"canary":1}'"#);
    }
}
