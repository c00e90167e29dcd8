//! What `outboxd verify --inbox` needs of the inbox store: its own messages read back and
//! deleted by message id, and a scratch table for its SQL handler's effects, created and
//! dropped by the run (statements of `outboxd_connector_kit::inbox`, PostgreSQL's
//! literals; plain, not prepared: a verify run is not a hot path).

use outboxd_connector::{ConnectorError, OwnMessageState};
use outboxd_connector_kit::inbox as kit;
use tokio_postgres::SimpleQueryMessage;

use super::inbox::PgInboxStore;
use super::own_rows::literal;
use crate::schema::{qualified, quote_ident, TableName};

impl PgInboxStore {
    fn inbox_table(&self) -> String {
        qualified(&self.connector.layout.inbox_table)
    }

    /// Scratch table `name` in the inbox table's schema (where the role works).
    fn scratch_table(&self, name: &str) -> Result<String, ConnectorError> {
        kit::check_scratch_name(name)?;
        let inbox = TableName::parse(&self.connector.layout.inbox_table);
        Ok(match inbox.schema {
            Some(schema) => format!("{}.{}", quote_ident(&schema), quote_ident(name)),
            None => quote_ident(name),
        })
    }

    pub(super) async fn read_own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<Vec<OwnMessageState>, ConnectorError> {
        let sql = kit::own_messages_select(&self.inbox_table(), source, message_ids, literal);
        let messages = self
            .with_client(async |client| {
                (client.simple_query(sql.as_str()).await)
                    .map_err(|e| self.error(&e, "reading verify's inbox messages"))
            })
            .await?;
        let mut states = Vec::new();
        for message in messages {
            if let SimpleQueryMessage::Row(row) = message {
                let text = |i: usize| row.get(i).unwrap_or_default().to_owned();
                states.push(OwnMessageState {
                    message_id: text(0),
                    status: text(1),
                    retry_count: text(2).parse().unwrap_or(0),
                });
            }
        }
        Ok(states)
    }

    pub(super) async fn delete_own_messages_of(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<u64, ConnectorError> {
        let sql = kit::own_messages_delete(&self.inbox_table(), source, message_ids, literal);
        self.with_client(async |client| {
            (client.execute(sql.as_str(), &[]).await)
                .map_err(|e| self.error(&e, "deleting verify's inbox messages"))
        })
        .await
    }

    pub(super) async fn create_scratch(&self, name: &str) -> Result<String, ConnectorError> {
        let table = self.scratch_table(name)?;
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {table} (n bigint GENERATED ALWAYS AS IDENTITY PRIMARY \
             KEY, message_id text NOT NULL, biz_key text NOT NULL)"
        );
        self.with_client(async |client| {
            (client.batch_execute(&ddl).await).map_err(|e| {
                self.error(
                    &e,
                    "creating verify's scratch table (the role needs CREATE on the schema)",
                )
            })
        })
        .await?;
        Ok(kit::scratch_insert(&table))
    }

    pub(super) async fn read_scratch(
        &self,
        name: &str,
    ) -> Result<Vec<(String, String)>, ConnectorError> {
        let sql = kit::scratch_select(&self.scratch_table(name)?);
        let rows = self
            .with_client(async |client| {
                (client.query(sql.as_str(), &[]).await)
                    .map_err(|e| self.error(&e, "reading verify's scratch table"))
            })
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub(super) async fn drop_scratch(&self, name: &str) -> Result<(), ConnectorError> {
        let sql = kit::scratch_drop(&self.scratch_table(name)?);
        self.with_client(async |client| {
            (client.batch_execute(&sql).await)
                .map_err(|e| self.error(&e, "dropping verify's scratch table"))
        })
        .await
    }
}
