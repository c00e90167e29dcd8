//! What `outboxd verify --inbox` needs of the inbox store, as the PostgreSQL connector
//! does it (`connectors/postgres/src/store/inbox_verify.rs`): its own messages read back
//! and deleted by message id, and a scratch table for its SQL handler's effects.

use mysql_async::prelude::Queryable;
use mysql_async::Row;
use outboxd_connector::{ConnectorError, OwnMessageState};
use outboxd_connector_kit::inbox as kit;

use super::inbox::MysqlInboxStore;
use crate::client::{int, text_or_empty};
use crate::schema::{quote_ident, split_qualified, sql_string};

impl MysqlInboxStore {
    /// Scratch table `name` in the inbox table's database.
    fn scratch_table(&self, name: &str) -> Result<String, ConnectorError> {
        kit::check_scratch_name(name)?;
        Ok(match split_qualified(&self.connector.layout.inbox_table) {
            (Some(db), _) => format!("{}.{}", quote_ident(&db), quote_ident(name)),
            (None, _) => quote_ident(name),
        })
    }

    pub(super) async fn rows_of(&self, sql: &str, what: &str) -> Result<Vec<Row>, ConnectorError> {
        self.with_conn(async |s| {
            (s.conn.query::<Row, _>(sql).await).map_err(|e| self.fail(what, &e))
        })
        .await
    }

    pub(super) async fn read_own_messages(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<Vec<OwnMessageState>, ConnectorError> {
        let sql = kit::own_messages_select(&self.table, source, message_ids, sql_string);
        let rows = self
            .rows_of(&sql, "reading verify's inbox messages")
            .await?;
        rows.iter()
            .map(|row| {
                Ok(OwnMessageState {
                    message_id: text_or_empty(row, 0)?,
                    status: text_or_empty(row, 1)?,
                    retry_count: int(row, 2)?
                        .and_then(|n| i32::try_from(n).ok())
                        .unwrap_or(0),
                })
            })
            .collect()
    }

    pub(super) async fn delete_own_messages_of(
        &self,
        source: &str,
        message_ids: &[String],
    ) -> Result<u64, ConnectorError> {
        let sql = kit::own_messages_delete(&self.table, source, message_ids, sql_string);
        self.change(&sql, "deleting verify's inbox messages").await
    }

    pub(super) async fn create_scratch(&self, name: &str) -> Result<String, ConnectorError> {
        let table = self.scratch_table(name)?;
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {table} (n BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             message_id VARCHAR(255) NOT NULL, biz_key VARCHAR(255) NOT NULL) ENGINE = InnoDB"
        );
        self.change(
            &ddl,
            "creating verify's scratch table (the user needs CREATE, DROP, INSERT and SELECT \
             on the database, or on the scratch table's name)",
        )
        .await?;
        Ok(kit::scratch_insert(&table))
    }

    pub(super) async fn read_scratch(
        &self,
        name: &str,
    ) -> Result<Vec<(String, String)>, ConnectorError> {
        let sql = kit::scratch_select(&self.scratch_table(name)?);
        let rows = self.rows_of(&sql, "reading verify's scratch table").await?;
        rows.iter()
            .map(|row| Ok((text_or_empty(row, 0)?, text_or_empty(row, 1)?)))
            .collect()
    }

    pub(super) async fn drop_scratch(&self, name: &str) -> Result<(), ConnectorError> {
        let sql = kit::scratch_drop(&self.scratch_table(name)?);
        self.change(&sql, "dropping verify's scratch table")
            .await
            .map(drop)
    }
}
