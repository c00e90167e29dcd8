//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`) and `outboxd verify`'s synthetic events, read back and deleted by their
//! message ids: the statements of `outboxd_connector_kit::store::own_rows_insert` and its
//! siblings, with PostgreSQL's literals; plain, not prepared (a canary runs once an
//! interval, `verify` a few transactions a second).

use outboxd_connector::{
    ConnectorError, NewOutboxRow, OwnRowState, OwnRowsToDelete, TransactionEnd,
};
use tokio_postgres::SimpleQueryMessage;

use outboxd_connector_kit::store::{
    own_row_state, own_rows_delete, own_rows_insert, own_rows_select,
};

use crate::schema::{qualified, quote_ident};
use crate::store::PgOutboxStore;

/// `value` as a PostgreSQL string literal (an escape string when it has a backslash, so
/// the text is the same whatever `standard_conforming_strings` says).
pub(crate) fn literal(value: &str) -> String {
    let quoted = value.replace('\'', "''");
    if quoted.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

impl PgOutboxStore {
    pub(crate) async fn insert_own_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> Result<(), ConnectorError> {
        if rows.is_empty() {
            return Ok(());
        }
        let table = qualified(self.table());
        let layout = &self.connector.layout;
        let sql = own_rows_insert(&table, layout, rows, end, quote_ident, literal);
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // Until the string's COMMIT or ROLLBACK has run: a call cancelled meanwhile (a
        // canary's timeout) leaves the connection to be replaced, not reused mid-transaction.
        conn.transaction_open = true;
        if let Err(e) = conn.client.batch_execute(sql.as_str()).await {
            // The INSERT failed inside the transaction the string opened: end it, so the
            // shared connection is usable again (a lost connection has no transaction).
            if conn.client.batch_execute("ROLLBACK").await.is_ok() {
                conn.transaction_open = false;
            }
            return Err(self.error(&e, "writing outboxd's own outbox rows"));
        }
        conn.transaction_open = false;
        Ok(())
    }

    pub(crate) async fn read_own_rows(
        &self,
        message_ids: &[String],
    ) -> Result<Vec<OwnRowState>, ConnectorError> {
        let table = qualified(self.table());
        let sql = own_rows_select(
            &table,
            &self.connector.layout,
            message_ids,
            quote_ident,
            literal,
        );
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let messages = conn
            .client
            .simple_query(sql.as_str())
            .await
            .map_err(|e| self.error(&e, "reading outboxd's own outbox rows"))?;
        let mut states = Vec::new();
        for message in messages {
            if let SimpleQueryMessage::Row(row) = message {
                let cells: Vec<Option<&str>> = (0..row.len()).map(|i| row.get(i)).collect();
                states.push(own_row_state(&cells)?);
            }
        }
        Ok(states)
    }

    pub(crate) async fn delete_own_rows_of(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> Result<u64, ConnectorError> {
        let table = qualified(self.table());
        let layout = &self.connector.layout;
        let sql = own_rows_delete(&table, layout, message_ids, which, quote_ident, literal);
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.client
            .execute(sql.as_str(), &[])
            .await
            .map_err(|e| self.error(&e, "deleting outboxd's own outbox rows"))
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
