//! Rows outboxd writes into the outbox itself, as an application would: the canary's
//! (`[canary]`), and its deletion once delivered. Plain statements with literals, not
//! prepared ones: a literal takes the column's type (text, uuid, jsonb or bytea), which a
//! text parameter would not, and a canary runs once an interval, not per event.

use outboxd_connector::{ConnectorError, NewOutboxRow};

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
        let names = &self.connector.layout.columns;
        let mut columns = vec![
            quote_ident(&names.message_id),
            quote_ident(&names.message_type),
            quote_ident(&names.biz_key),
            quote_ident(&names.payload),
        ];
        let mut values = vec![
            literal(&row.message_id),
            literal(&row.message_type),
            literal(&row.biz_key),
            literal(&row.payload),
        ];
        if let (Some(column), Some(topic)) = (&names.topic, &row.topic) {
            columns.push(quote_ident(column));
            values.push(literal(topic));
        }
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({})",
            qualified(self.table()),
            columns.join(", "),
            values.join(", ")
        );
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.client
            .execute(sql.as_str(), &[])
            .await
            .map_err(|e| self.error(&e, "writing a canary row"))?;
        Ok(())
    }

    pub(crate) async fn delete_own_row(&self, message_id: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "DELETE FROM {} WHERE {} = {} AND status = 'SUCCESS'",
            qualified(self.table()),
            quote_ident(&self.connector.layout.columns.message_id),
            literal(message_id)
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
