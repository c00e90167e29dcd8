//! The operator's actions on a PostgreSQL inbox ([`TableAdmin`] with
//! [`TableKind::Inbox`]): `outboxd status`, `retry`, `park`, `resolve`, `janitor` with
//! `--inbox`, the same trait as the outbox's (`operator.rs`). Each is one statement.

use std::time::SystemTime;

use outboxd_connector::{
    parked_by_operator, resolved_without_handling, ConnectorError, HeldKey, JanitorAction,
    JanitorRule, RetrySelector, RowDetail, RowQuery, RowSummary, StatusCount, StatusSummary,
    TableAdmin, TableKind,
};
use outboxd_connector_kit::browse;
use outboxd_connector_kit::inbox as kit;
use tokio_postgres::types::ToSql;

use super::inbox::PgInboxStore;
use super::{delay_ms, get};
use crate::schema::qualified;

impl PgInboxStore {
    /// Runs one statement; returns the rows it changed.
    async fn change(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        what: &str,
    ) -> Result<u64, ConnectorError> {
        self.with_client(async |client| {
            client
                .execute(sql, params)
                .await
                .map_err(|e| self.error(&e, what))
        })
        .await
    }

    fn table(&self) -> String {
        qualified(&self.connector.layout.inbox_table)
    }
}

impl TableAdmin for PgInboxStore {
    const TABLE: TableKind = TableKind::Inbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let sql = format!(
            "SELECT status, message_type, count(*), min(created_at) FROM {} \
             GROUP BY 1, 2 ORDER BY 1, 2",
            self.table()
        );
        let rows = self
            .with_client(async |client| {
                (client.query(&sql, &[]).await).map_err(|e| self.error(&e, "counting inbox rows"))
            })
            .await?;
        let mut summary = StatusSummary::default();
        for row in &rows {
            let count = StatusCount {
                status: get(row, 0)?,
                message_type: get(row, 1)?,
                rows: get(row, 2)?,
            };
            let oldest: Option<SystemTime> = get(row, 3)?;
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
            "UPDATE {} SET status = 'FAILED', next_retry_time = now(), retry_count = 0, \
             claimed_at = NULL, claim_token = NULL, updated_at = now()",
            self.table()
        );
        match selector {
            RetrySelector::Id(id) => {
                let sql =
                    format!("{set} WHERE id = $1 AND status IN ('FAILED', 'MANUAL_REQUIRED')");
                self.change(&sql, &[id], &format!("making inbox row {id} due again"))
                    .await
            }
            RetrySelector::Status {
                status,
                message_type,
            } => {
                let sql =
                    format!("{set} WHERE status = $1 AND ($2::text IS NULL OR message_type = $2)");
                let what = format!("making {status} inbox rows due again");
                self.change(&sql, &[status, message_type], &what).await
            }
        }
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'MANUAL_REQUIRED', next_retry_time = now(), last_error = $2, \
             claimed_at = NULL, claim_token = NULL, updated_at = now() \
             WHERE id = $1 AND status IN ('PENDING', 'FAILED')",
            self.table()
        );
        let note = parked_by_operator(reason);
        let changed = self
            .change(&sql, &[&id, &note], &format!("parking inbox row {id}"))
            .await?;
        Ok(changed > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let sql = format!(
            "UPDATE {} SET status = 'DONE', processed_at = now(), next_retry_time = NULL, \
             last_error = $2, claimed_at = NULL, claim_token = NULL, updated_at = now() \
             WHERE id = $1 AND status <> 'DONE'",
            self.table()
        );
        let note = resolved_without_handling(reason);
        let changed = self
            .change(&sql, &[&id, &note], &format!("resolving inbox row {id}"))
            .await?;
        Ok(changed > 0)
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
        let inbox = self.table();
        let retention_ms = delay_ms(rule.older_than);
        let window_ms = delay_ms(dedupe_window);
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let old = format!(
            "SELECT id FROM {inbox} WHERE status = 'DONE' \
             AND processed_at < now() - $1::bigint * interval '1 millisecond' \
             AND created_at < now() - $2::bigint * interval '1 millisecond' \
             ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED"
        );
        let (sql, what) = match &rule.action {
            JanitorAction::Delete => (
                format!("DELETE FROM {inbox} WHERE id IN ({old})"),
                "deleting old DONE inbox rows".to_owned(),
            ),
            JanitorAction::Archive(table) => {
                let archive = qualified(table);
                // Created only when missing: CREATE TABLE IF NOT EXISTS still needs CREATE on
                // the schema, which the runtime role has no need of once the administrator
                // made the archive table (README, "Privileges").
                let create = format!("CREATE TABLE IF NOT EXISTS {archive} (LIKE {inbox})");
                self.with_client(async |client| {
                    let exists = client
                        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&archive])
                        .await
                        .map_err(|e| self.error(&e, "looking up the archive table"))?;
                    if get::<bool>(&exists, 0)? {
                        return Ok(());
                    }
                    (client.batch_execute(&create).await)
                        .map_err(|e| self.error(&e, &format!("creating the archive table {table}")))
                })
                .await?;
                (
                    format!(
                        "WITH moved AS (DELETE FROM {inbox} WHERE id IN ({old}) RETURNING *) \
                         INSERT INTO {archive} SELECT * FROM moved"
                    ),
                    format!("moving old DONE inbox rows to {table}"),
                )
            }
        };
        self.change(&sql, &[&retention_ms, &window_ms, &limit], &what)
            .await
    }
}
