//! The operator's actions on a MySQL/MariaDB outbox ([`TableAdmin`] with
//! [`TableKind::Outbox`]): `status`, `retry`, `park`, `resolve`, `janitor`, as the
//! PostgreSQL connector does them (see `connectors/postgres/src/store/operator.rs`). The
//! INIT scan of `recover` is the store's (`claims.rs`).

use mysql_async::prelude::Queryable;
use outboxd_connector::{
    parked_by_operator, resolved_by_operator, ConnectorError, HeldKey, JanitorAction, JanitorRule,
    RetrySelector, RowDetail, RowQuery, RowSummary, StatusCount, StatusSummary, TableAdmin,
    TableKind,
};

use outboxd_connector_kit::browse;
use outboxd_connector_kit::store::add_status_row;

use crate::client::{int, text, text_or_empty};
use crate::log::position::BinlogPosition;
use crate::log::server;
use crate::schema::{qualified, sql_string, table_ident};
use crate::store::claims::id_list;
use crate::store::{delay_ms, MysqlOutboxStore};
use crate::time::system_time;

impl TableAdmin for MysqlOutboxStore {
    const TABLE: TableKind = TableKind::Outbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        // Every outbox table of the store (one, for an operator's command).
        let mut summary = StatusSummary::default();
        for outbox in &self.outboxes {
            let message_type = &outbox.names.message_type;
            // A table without a creation time (Debezium's) has no age to tell.
            let created_at = outbox.names.created_at.as_deref().unwrap_or("NULL");
            let rows = self
                .rows(
                    &format!(
                        "SELECT status, {message_type}, COUNT(*), MIN({created_at}) FROM {outbox} \
                         GROUP BY status, {message_type} ORDER BY status, {message_type}"
                    ),
                    "counting outbox rows",
                )
                .await?;
            for row in &rows {
                let count = StatusCount {
                    status: text_or_empty(row, 0)?,
                    message_type: text_or_empty(row, 1)?,
                    rows: int(row, 2)?.unwrap_or(0),
                };
                add_status_row(&mut summary, count, system_time(text(row, 3)?));
            }
        }
        let sql = format!(
            "SELECT position, updated_at FROM {} WHERE pipeline = {}",
            self.checkpoint,
            sql_string(&self.connector.pipeline)
        );
        if let Some(row) = self.rows(&sql, "reading the checkpoint").await?.first() {
            let text_position = text_or_empty(row, 0)?;
            if let (Ok(position), Some(at)) = (
                text_position.parse::<BinlogPosition>(),
                system_time(text(row, 1)?),
            ) {
                summary.source_lag_bytes = self.binlog_lag(&position).await.ok().flatten();
                summary.checkpoint = Some((position.position(), at));
            }
        }
        Ok(summary)
    }

    async fn retry_rows(&self, selector: &RetrySelector) -> Result<u64, ConnectorError> {
        selector.check()?;
        let outbox = &self.outbox;
        let set = "SET status = 'FAILED', next_retry_time = NOW(6), retry_count = 0, \
                   claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)";
        match selector {
            RetrySelector::Id(id) => {
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE {} = {id} AND status IN ('FAILED', 'MANUAL_REQUIRED')",
                    outbox.names.id
                );
                self.update(&sql, &format!("making row {id} due again"))
                    .await
            }
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let of_type = message_type
                    .as_deref()
                    .map(|t| format!(" AND {} = {}", outbox.names.message_type, sql_string(t)))
                    .unwrap_or_default();
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE next_retry_time IS NOT NULL AND status = {}{of_type}",
                    sql_string(status)
                );
                self.update(&sql, &format!("making {status} rows due again"))
                    .await
            }
        }
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let note = sql_string(&parked_by_operator(reason));
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', \
             next_retry_time = COALESCE(next_retry_time, NOW(6)), last_error = {note}, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE {} = {id} AND status IN ('INIT', 'FAILED')",
            self.outbox, self.outbox.names.id
        );
        Ok(self.update(&sql, &format!("parking row {id}")).await? > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let note = sql_string(&resolved_by_operator(reason));
        let sql = format!(
            "UPDATE {} SET status = 'SUCCESS', sent_at = NULL, next_retry_time = NULL, \
             last_error = {note}, claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE {} = {id} AND status <> 'SUCCESS'",
            self.outbox, self.outbox.names.id
        );
        Ok(self.update(&sql, &format!("resolving row {id}")).await? > 0)
    }

    async fn list_rows(&self, query: &RowQuery) -> Result<Vec<RowSummary>, ConnectorError> {
        browse::list(self, &super::browse::DIALECT, query).await
    }

    async fn row_detail(
        &self,
        id: i64,
        preview_chars: usize,
    ) -> Result<Option<RowDetail>, ConnectorError> {
        browse::detail(self, &super::browse::DIALECT, id, preview_chars).await
    }

    async fn held_keys(
        &self,
        after_key: Option<&str>,
        limit: usize,
    ) -> Result<Vec<HeldKey>, ConnectorError> {
        browse::held(self, &super::browse::DIALECT, after_key, limit).await
    }

    async fn janitor_batch(&self, rule: &JanitorRule, batch: usize) -> Result<u64, ConnectorError> {
        rule.window_for(Self::TABLE)?;
        if batch == 0 {
            return Ok(0);
        }
        let outbox = self.outbox.clone();
        let id = outbox.names.id.clone();
        let retention_ms = delay_ms(rule.older_than);
        // Rows resolved by an operator were never sent: they age from their update.
        let old = format!(
            "status = 'SUCCESS' AND COALESCE(sent_at, updated_at) < \
             NOW(6) - INTERVAL {retention_ms} * 1000 MICROSECOND"
        );
        match &rule.action {
            JanitorAction::Delete => {
                let sql = format!("DELETE FROM {outbox} WHERE {old} ORDER BY {id} LIMIT {batch}");
                self.update(&sql, "deleting old SUCCESS rows").await
            }
            JanitorAction::Archive(table) => {
                let archive = qualified(table);
                // Created only when missing: CREATE TABLE IF NOT EXISTS needs CREATE even
                // when the table exists, which the runtime user has no need of once the
                // administrator made the archive table (README, "Privileges").
                let (db, name) = table_ident(table, &self.connector.config().database);
                let exists = format!(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} \
                     AND TABLE_NAME = {}",
                    sql_string(&db),
                    sql_string(&name)
                );
                if self
                    .rows(&exists, "looking up the archive table")
                    .await?
                    .is_empty()
                {
                    self.update(
                        &format!("CREATE TABLE IF NOT EXISTS {archive} LIKE {outbox}"),
                        &format!("creating the archive table {table}"),
                    )
                    .await?;
                }
                let what = format!(
                    "moving old SUCCESS rows to {table} (its columns must match the outbox's)"
                );
                self.in_transaction(&what, move |conn| {
                    Box::pin(async move {
                        let ids: Vec<i64> = conn
                            .query(format!(
                                "SELECT {id} FROM {outbox} WHERE {old} ORDER BY {id} LIMIT {batch} \
                                 FOR UPDATE SKIP LOCKED"
                            ))
                            .await?;
                        if ids.is_empty() {
                            return Ok(0);
                        }
                        let ids = id_list(ids);
                        conn.query_drop(format!(
                            "INSERT INTO {archive} SELECT * FROM {outbox} WHERE {id} IN ({ids})"
                        ))
                        .await?;
                        conn.query_drop(format!("DELETE FROM {outbox} WHERE {id} IN ({ids})"))
                            .await?;
                        Ok(conn.affected_rows())
                    })
                })
                .await
            }
        }
    }
}

impl MysqlOutboxStore {
    /// Binlog bytes written after `position`: the rest of its file and every later file.
    async fn binlog_lag(&self, b: &BinlogPosition) -> Result<Option<u64>, ConnectorError> {
        let mut conn = self.connector.sql_conn().await?;
        let logs = server::binary_logs(&mut conn).await?;
        let Some(at) = logs.iter().position(|(name, _)| *name == b.file) else {
            return Ok(None);
        };
        let rest = logs[at].1.saturating_sub(b.offset);
        Ok(Some(
            rest + logs[at + 1..].iter().map(|(_, size)| size).sum::<u64>(),
        ))
    }
}
