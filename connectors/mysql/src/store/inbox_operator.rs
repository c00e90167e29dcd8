//! The operator's actions on a MySQL/MariaDB inbox ([`TableAdmin`] with
//! [`TableKind::Inbox`]): `outboxd status`, `retry`, `park`, `resolve`, `janitor` with
//! `--inbox`, the same trait as the outbox's (`operator.rs`). Each is one statement but
//! the janitor's, which selects, copies and deletes a batch in one transaction, and
//! creates its archive table like the inbox when it is missing.

use mysql_async::prelude::Queryable;
use mysql_async::Row;
use outboxd_connector::{
    parked_by_operator, resolved_without_handling, ConnectorError, HeldKey, JanitorAction,
    JanitorRule, RetrySelector, RowDetail, RowQuery, RowSummary, StatusCount, StatusSummary,
    TableAdmin, TableKind,
};
use outboxd_connector_kit::browse;
use outboxd_connector_kit::inbox as kit;

use super::inbox::{answer, answers_of, no_id, MysqlInboxStore, BEGIN, BEGIN_STATEMENTS};
use crate::client::{int, query, query_first, text, text_or_empty};
use crate::schema::{qualified, quote_ident, sql_string, table_ident};
use crate::store::claims::id_list;
use crate::store::delay_ms;
use crate::time::system_time;

impl TableAdmin for MysqlInboxStore {
    const TABLE: TableKind = TableKind::Inbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let sql = format!(
            "SELECT status, message_type, COUNT(*), MIN(created_at) FROM {} \
             GROUP BY 1, 2 ORDER BY 1, 2",
            self.table
        );
        let what = "counting inbox rows";
        let rows: Vec<Row> = self
            .with_conn(async |s| {
                (s.conn.query(sql.as_str()).await).map_err(|e| self.fail(what, &e))
            })
            .await?;
        let mut summary = StatusSummary::default();
        for row in &rows {
            let count = StatusCount {
                status: text_or_empty(row, 0)?,
                message_type: text_or_empty(row, 1)?,
                rows: int(row, 2)?.unwrap_or(0),
            };
            let oldest = system_time(text(row, 3)?);
            if [kit::PENDING, kit::FAILED, kit::PROCESSING].contains(&count.status.as_str()) {
                summary.oldest_unsent = summary.oldest_unsent.min(oldest).or(oldest);
            }
            summary.counts.push(count);
        }
        Ok(summary)
    }

    async fn retry_rows(&self, selector: &RetrySelector) -> Result<u64, ConnectorError> {
        selector.check()?;
        let set = format!(
            "UPDATE {} SET status = 'FAILED', next_retry_time = NOW(6), retry_count = 0, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6)",
            self.table
        );
        let (sql, what) = match selector {
            RetrySelector::Id(id) => (
                format!("{set} WHERE id = {id} AND status IN ('FAILED', 'MANUAL_REQUIRED')"),
                format!("making inbox row {id} due again"),
            ),
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let of_type = (message_type.as_deref()).map_or(String::new(), |t| {
                    format!(" AND message_type = {}", sql_string(t))
                });
                (
                    format!("{set} WHERE status = {}{of_type}", sql_string(status)),
                    format!("making {status} inbox rows due again"),
                )
            }
        };
        self.change(&sql, &what).await
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', next_retry_time = NOW(6), last_error = {}, \
             claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status IN ('PENDING', 'FAILED')",
            self.table,
            sql_string(&parked_by_operator(reason))
        );
        Ok(self
            .change(&sql, &format!("parking inbox row {id}"))
            .await?
            > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'DONE', processed_at = NOW(6), next_retry_time = NULL, \
             last_error = {}, claimed_at = NULL, claim_token = NULL, updated_at = NOW(6) \
             WHERE id = {id} AND status <> 'DONE'",
            self.table,
            sql_string(&resolved_without_handling(reason))
        );
        Ok(self
            .change(&sql, &format!("resolving inbox row {id}"))
            .await?
            > 0)
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
        let dedupe_window = rule.window_for(Self::TABLE)?;
        if batch == 0 {
            return Ok(0);
        }
        let table = &self.table;
        // `next_retry_time IS NULL` (always so for DONE rows) lets the due index give the
        // oldest DONE rows in id order, without sorting every DONE row.
        let select = format!(
            "{BEGIN}; SELECT id FROM {table} WHERE status = 'DONE' AND next_retry_time IS NULL \
             AND processed_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             AND created_at < NOW(6) - INTERVAL {} * 1000 MICROSECOND \
             ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED",
            delay_ms(rule.older_than),
            delay_ms(dedupe_window)
        );
        let archive = match &rule.action {
            JanitorAction::Delete => None,
            JanitorAction::Archive(name) => {
                self.create_archive(name).await?;
                Some(qualified(name))
            }
        };
        let what = match &rule.action {
            JanitorAction::Delete => "deleting old DONE inbox rows".to_owned(),
            JanitorAction::Archive(name) => format!("moving old DONE inbox rows to {name}"),
        };
        self.with_conn(async |s| {
            let mut answers = answers_of(self, &mut s.conn, &select, &what).await?;
            let ids = (answer(&mut answers, BEGIN_STATEMENTS)?.rows.iter())
                .map(|row| int(row, 0)?.ok_or_else(|| no_id(table)))
                .collect::<Result<Vec<i64>, _>>()?;
            if ids.is_empty() {
                s.conn
                    .query_drop("COMMIT")
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
                return Ok(0);
            }
            let list = id_list(ids);
            let copy = archive.as_ref().map_or(String::new(), |archive| {
                format!("INSERT INTO {archive} SELECT * FROM {table} WHERE id IN ({list}); ")
            });
            let delete = format!("{copy}DELETE FROM {table} WHERE id IN ({list}); COMMIT");
            let answers = answers_of(self, &mut s.conn, &delete, &what).await?;
            let deleted = answers.len().saturating_sub(2);
            Ok(answers.get(deleted).map_or(0, |a| a.affected))
        })
        .await
    }
}

impl MysqlInboxStore {
    /// Creates the janitor's archive table like the inbox when it is missing, without the
    /// inbox's unique keys: a message stored again after the deduplication window is
    /// archived a second time.
    async fn create_archive(&self, name: &str) -> Result<(), ConnectorError> {
        let archive = qualified(name);
        let (db, table) = table_ident(name, &self.connector.config().database);
        let what = format!("creating the archive table {name}");
        self.with_conn(async |s| {
            let conn = &mut s.conn;
            let exists = format!(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = {} \
                 AND TABLE_NAME = {}",
                sql_string(&db),
                sql_string(&table)
            );
            if query_first(conn, &exists, &what).await?.is_some() {
                return Ok(());
            }
            let create = format!("CREATE TABLE IF NOT EXISTS {archive} LIKE {}", self.table);
            conn.query_drop(create.as_str())
                .await
                .map_err(|e| self.fail(&what, &e))?;
            let unique = format!(
                "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
                 WHERE TABLE_SCHEMA = {} AND TABLE_NAME = {} AND NON_UNIQUE = 0 \
                 AND INDEX_NAME <> 'PRIMARY'",
                sql_string(&db),
                sql_string(&table)
            );
            let drops = (query(conn, &unique, &what).await?.iter())
                .map(|row| {
                    Ok(format!(
                        "DROP INDEX {}",
                        quote_ident(&text_or_empty(row, 0)?)
                    ))
                })
                .collect::<Result<Vec<String>, ConnectorError>>()?;
            if !drops.is_empty() {
                let alter = format!("ALTER TABLE {archive} {}", drops.join(", "));
                conn.query_drop(alter.as_str())
                    .await
                    .map_err(|e| self.fail(&what, &e))?;
            }
            Ok(())
        })
        .await
    }
}
