//! The operator's actions on a PostgreSQL outbox ([`TableAdmin`] with
//! [`TableKind::Outbox`]): `outboxd status`, `retry`, `park`, `resolve`, `janitor`. The
//! INIT scan of `outboxd recover` is the store's ([`super::claims`]).
//!
//! Each action is one short transaction. Those that make rows due again or release a key
//! (`retry`, `resolve`) also `NOTIFY` the pipeline's [`retry_channel`] in the same
//! transaction, so a running outboxd listening there can wake its retry worker at once
//! instead of at its next idle check.

use outboxd_connector::{
    parked_by_operator, resolved_by_operator, ConnectorError, HeldKey, JanitorAction, JanitorRule,
    Position, RetrySelector, RowDetail, RowQuery, RowSummary, StatusCount, StatusSummary,
    TableAdmin, TableKind,
};

use outboxd_connector_kit::browse;
use outboxd_connector_kit::store::add_status_row;

use crate::schema::qualified;
use crate::store::{delay_ms, get, parse_checkpoint, PgOutboxStore};

/// PostgreSQL's longest identifier (NAMEDATALEN - 1), in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// The `LISTEN`/`NOTIFY` channel of a pipeline: `outboxd_<pipeline>`, cut to PostgreSQL's
/// 63-byte identifier limit on a character boundary. `outboxd retry` and `outboxd
/// resolve` notify it (payload `retry` or `resolve`) when they changed a row. Listen with
/// the name quoted: `LISTEN "outboxd_orders"`.
pub fn retry_channel(pipeline: &str) -> String {
    let mut channel = format!("outboxd_{pipeline}");
    if channel.len() > MAX_IDENTIFIER_BYTES {
        let mut at = MAX_IDENTIFIER_BYTES;
        while !channel.is_char_boundary(at) {
            at -= 1;
        }
        channel.truncate(at);
    }
    channel
}

impl PgOutboxStore {
    /// Runs one UPDATE of a single row (or a selection) and, when it changed rows and
    /// `notify` is set, notifies the retry channel, in one transaction.
    async fn update_and_notify(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        notify: Option<&str>,
        what: &str,
    ) -> Result<u64, ConnectorError> {
        let channel = retry_channel(&self.connector.pipeline);
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let result = async {
            let tx = conn.client.transaction().await?;
            let changed = tx.execute(sql, params).await?;
            if let (Some(payload), true) = (notify, changed > 0) {
                tx.execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
                    .await?;
            }
            tx.commit().await?;
            Ok(changed)
        }
        .await;
        result.map_err(|e: tokio_postgres::Error| self.error(&e, what))
    }
}

impl TableAdmin for PgOutboxStore {
    const TABLE: TableKind = TableKind::Outbox;

    async fn status_summary(&self) -> Result<StatusSummary, ConnectorError> {
        let checkpoint_table = &self.connector.layout.checkpoint_table;
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let client = &conn.client;

        // Every outbox table of the store (one, for an operator's command).
        let mut summary = StatusSummary::default();
        let names = self.columns();
        let message_type = &names.message_type;
        // A table without a creation time (Debezium's) has no age to tell.
        let created_at = names.created_at.as_deref().unwrap_or("NULL::timestamptz");
        for table in &self.connector.layout.outbox_tables {
            let counts = format!(
                "SELECT status::text, {message_type}::text, count(*), min({created_at}) FROM {} \
                 GROUP BY 1, 2 ORDER BY 1, 2",
                qualified(table)
            );
            let rows = client
                .query(&counts, &[])
                .await
                .map_err(|e| self.error(&e, "counting outbox rows"))?;
            for row in &rows {
                let count = StatusCount {
                    status: get(row, 0)?,
                    message_type: get(row, 1)?,
                    rows: get(row, 2)?,
                };
                add_status_row(&mut summary, count, get(row, 3)?);
            }
        }

        let sql = format!(
            "SELECT position, updated_at FROM {} WHERE pipeline = $1",
            qualified(checkpoint_table)
        );
        let row = client
            .query_opt(&sql, &[&self.connector.pipeline])
            .await
            .map_err(|e| self.error(&e, "reading the checkpoint"))?;
        if let Some(row) = row {
            let text: String = get(&row, 0)?;
            let position: Position =
                parse_checkpoint(&text, checkpoint_table, &self.connector.pipeline)?;
            summary.checkpoint = Some((position, get(&row, 1)?));
        }

        // No slot (poll mode, or not created yet) and standbys: no lag to tell.
        let row = client
            .query_opt(
                "SELECT CASE WHEN pg_is_in_recovery() OR confirmed_flush_lsn IS NULL THEN NULL \
                 ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint END \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.connector.slot()],
            )
            .await
            .map_err(|e| self.error(&e, "reading the replication slot's lag"))?;
        if let Some(row) = row {
            let lag: Option<i64> = get(&row, 0)?;
            summary.source_lag_bytes = lag.map(|l| u64::try_from(l).unwrap_or(0));
        }
        Ok(summary)
    }

    async fn retry_rows(&self, selector: &RetrySelector) -> Result<u64, ConnectorError> {
        selector.check()?;
        let outbox = qualified(self.table());
        let names = self.columns();
        let set = "SET status = 'FAILED', next_retry_time = now(), retry_count = 0, \
                   claimed_at = NULL, claim_token = NULL, updated_at = now()";
        match selector {
            RetrySelector::Id(id) => {
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE {} = $1 AND status IN ('FAILED', 'MANUAL_REQUIRED')",
                    names.id
                );
                let what = format!("making row {id} due again");
                self.update_and_notify(&sql, &[id], Some("retry"), &what)
                    .await
            }
            RetrySelector::Status {
                status,
                message_type,
            } => {
                // `next_retry_time IS NOT NULL` holds for both statuses and lets the
                // partial index find them.
                let sql = format!(
                    "UPDATE {outbox} {set} WHERE next_retry_time IS NOT NULL AND status = $1 \
                     AND ($2::text IS NULL OR {} = $2)",
                    names.message_type
                );
                let what = format!("making {status} rows due again");
                self.update_and_notify(&sql, &[status, message_type], Some("retry"), &what)
                    .await
            }
        }
    }

    async fn park_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let outbox = qualified(self.table());
        let sql = format!(
            "UPDATE {outbox} SET status = 'MANUAL_REQUIRED', \
             next_retry_time = COALESCE(next_retry_time, now()), \
             last_error = $2, claimed_at = NULL, claim_token = NULL, updated_at = now() \
             WHERE {} = $1 AND status IN ('INIT', 'FAILED')",
            self.columns().id
        );
        let note = parked_by_operator(reason);
        let what = format!("parking row {id}");
        let changed = self
            .update_and_notify(&sql, &[&id, &note], None, &what)
            .await?;
        Ok(changed > 0)
    }

    async fn resolve_row(&self, id: i64, reason: &str) -> Result<bool, ConnectorError> {
        let outbox = qualified(self.table());
        let sql = format!(
            "UPDATE {outbox} SET status = 'SUCCESS', sent_at = NULL, next_retry_time = NULL, \
             last_error = $2, claimed_at = NULL, claim_token = NULL, updated_at = now() \
             WHERE {} = $1 AND status <> 'SUCCESS'",
            self.columns().id
        );
        let note = resolved_by_operator(reason);
        let what = format!("resolving row {id}");
        let changed = self
            .update_and_notify(&sql, &[&id, &note], Some("resolve"), &what)
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
        rule.window_for(Self::TABLE)?;
        if batch == 0 {
            return Ok(0);
        }
        let outbox = qualified(self.table());
        let retention_ms = delay_ms(rule.older_than);
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        // Rows resolved by an operator were never sent: they age from their update.
        let id = self.columns().id;
        let old = format!(
            "SELECT {id} FROM {outbox} WHERE status = 'SUCCESS' \
             AND COALESCE(sent_at, updated_at) < now() - $1::bigint * interval '1 millisecond' \
             ORDER BY {id} LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let client = &conn.client;
        let (sql, what) = match &rule.action {
            JanitorAction::Delete => (
                format!("DELETE FROM {outbox} WHERE {id} IN ({old})"),
                "deleting old SUCCESS rows".to_owned(),
            ),
            JanitorAction::Archive(table) => {
                let archive = qualified(table);
                let exists = client
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[&archive])
                    .await
                    .map_err(|e| self.error(&e, "looking up the archive table"))?;
                if !get::<bool>(&exists, 0)? {
                    // Same columns, no identity or defaults: ids are copied as they are.
                    let create = format!("CREATE TABLE IF NOT EXISTS {archive} (LIKE {outbox})");
                    client.batch_execute(&create).await.map_err(|e| {
                        self.error(&e, &format!("creating the archive table {table}"))
                    })?;
                }
                (
                    format!(
                        "WITH moved AS (DELETE FROM {outbox} WHERE {id} IN ({old}) RETURNING *) \
                         INSERT INTO {archive} SELECT * FROM moved"
                    ),
                    format!(
                        "moving old SUCCESS rows to {table} (its columns must match the outbox's)"
                    ),
                )
            }
        };
        client
            .execute(&sql, &[&retention_ms, &limit])
            .await
            .map_err(|e| self.error(&e, &what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_channel_fits_an_identifier() {
        assert_eq!(retry_channel("orders"), "outboxd_orders");
        let long = retry_channel(&"é".repeat(40));
        assert!(long.len() <= MAX_IDENTIFIER_BYTES);
        assert!(long.starts_with("outboxd_é"));
    }
}
