//! Claims, the claimed write-back, the reaper, the retry schedule, the blocked keys and
//! `recover`'s scan of INIT rows: the retry worker's, poll mode's and `recover`'s side of
//! the store (the methods of [`OutboxStore`](outboxd_connector::OutboxStore) but the
//! write-back and the checkpoint).

use std::collections::HashSet;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::SystemTime;

use outboxd_connector::{
    last_error_text, ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack,
    ConnectorError, OutboxEvent, ParkedEvent, ReapPolicy, ReapReport, RetrySchedule,
};
use outboxd_connector_kit::{status, tables};
use tokio_postgres::{Client, Row};

use super::{delay_ms, get, Conn, PgOutboxStore, RowStatements};

/// In strict poll mode, the window of INIT rows looked at per claim, as a multiple of
/// the claim's limit: rows locked by a concurrent claimer are skipped, and the window
/// leaves room for the next ones.
const POLL_WINDOW_FACTOR: i64 = 4;
impl PgOutboxStore {
    /// [`OutboxStore::claim`](outboxd_connector::OutboxStore::claim).
    pub(super) async fn claim_rows(
        &self,
        request: ClaimRequest,
    ) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.carry_status()?;
        // Each table in turn, from the one after the last claim's first, while the claim
        // has room: with several tables, a backlog in one does not starve the others.
        let count = conn.outboxes.len();
        let start = self.next_claim_table.fetch_add(1, AtomicOrdering::Relaxed) % count;
        let mut claimed = Vec::new();
        for index in (start..count).chain(0..start) {
            let room = request.limit.saturating_sub(claimed.len());
            if room == 0 {
                break;
            }
            let Conn {
                client, outboxes, ..
            } = &mut *conn;
            let outbox = &outboxes[index];
            let Some(statements) = outbox.rows.as_ref() else {
                continue;
            };
            let request = ClaimRequest {
                limit: room,
                ..request
            };
            let rows = Self::claim_on(client, statements, request)
                .await
                .map_err(|e| self.error(&e, &format!("claiming rows of {}", outbox.name)))?;
            let mut part = Vec::with_capacity(rows.len());
            for row in &rows {
                let mut event = outbox.event(row)?;
                event.table = u16::try_from(index).unwrap_or(u16::MAX);
                let token: String = get(row, outbox.sql.names.map.field_count())?;
                part.push(ClaimedEvent {
                    event,
                    claim_token: ClaimToken(token),
                });
            }
            // UPDATE … RETURNING has no order; callers publish a table's rows in id order.
            part.sort_by_key(|c| c.event.id);
            claimed.append(&mut part);
        }
        Ok(claimed)
    }

    /// [`OutboxStore::complete_claimed`](outboxd_connector::OutboxStore::complete_claimed).
    pub(super) async fn complete_claimed_rows(
        &self,
        batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, ConnectorError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        conn.carry_status()?;
        let parts = tables::split_claimed(&batch);
        for part in &parts {
            conn.outbox(part.table)?;
        }
        let written = async {
            let tx = conn.client.transaction().await?;
            let mut updated = 0;
            for part in &parts {
                if let Some(statements) = conn.outboxes[usize::from(part.table)].rows.as_ref() {
                    updated += Self::complete_on(&tx, statements, part.rows()).await?;
                }
            }
            tx.commit().await?;
            Ok(updated)
        };
        written
            .await
            .map_err(|e| self.error(&e, &format!("writing back {}", batch.describe())))
    }

    /// [`OutboxStore::reap`](outboxd_connector::OutboxStore::reap).
    pub(super) async fn reap_rows(&self, policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        let reason = policy.reaped_reason();
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let timeout = delay_ms(policy.claim_timeout);
        let delay = delay_ms(policy.retry_delay);
        let mut report = ReapReport::default();
        for (_, statements) in conn.all_rows()? {
            let rows = conn
                .client
                .query(&statements.reap, &[&timeout, &delay, &reason])
                .await
                .map_err(|e| self.error(&e, "returning expired claims to FAILED"))?;
            for row in &rows {
                let status: String = get(row, 0)?;
                if status == "MANUAL_REQUIRED" {
                    report.manual_required += 1;
                } else {
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// [`OutboxStore::retry_schedule`](outboxd_connector::OutboxStore::retry_schedule).
    pub(super) async fn schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // The earliest of every table's.
        let earliest = |a: Option<SystemTime>, b: Option<SystemTime>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut schedule = RetrySchedule::default();
        for (_, statements) in conn.all_rows()? {
            let row = conn
                .client
                .query_one(&statements.schedule, &[])
                .await
                .map_err(|e| self.error(&e, "reading the retry schedule"))?;
            schedule.next_due = earliest(schedule.next_due, get(&row, 0)?);
            schedule.oldest_claim = earliest(schedule.oldest_claim, get(&row, 1)?);
        }
        Ok(schedule)
    }

    /// [`OutboxStore::blocked_keys`](outboxd_connector::OutboxStore::blocked_keys).
    pub(super) async fn blocked(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        if keys.is_some_and(<[String]>::is_empty) || !self.connector.layout.tracks_status() {
            return Ok(HashSet::new());
        }
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        // A key in trouble in any table is held back: the record key is the same key
        // whatever the table.
        let mut blocked = HashSet::new();
        for (_, statements) in conn.all_rows()? {
            let rows = match keys {
                Some(keys) => conn.client.query(&statements.blocked_some, &[&keys]).await,
                None => conn.client.query(&statements.blocked_all, &[]).await,
            }
            .map_err(|e| self.error(&e, "reading the keys held back by failed rows"))?;
            for row in &rows {
                blocked.insert(get::<String>(row, 0)?);
            }
        }
        Ok(blocked)
    }

    /// [`OutboxStore::scan_init`](outboxd_connector::OutboxStore::scan_init): the INIT rows
    /// `outboxd recover` publishes.
    pub(super) async fn init_rows(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut locked = self.lock().await?;
        let conn = locked.conn()?;
        let outbox = conn.outbox(table)?;
        let id = &outbox.names().row.id;
        let sql = format!(
            "{} WHERE o.status = 'INIT' AND o.{id} > $1 ORDER BY o.{id} LIMIT $2",
            outbox.event_select()
        );
        let rows = conn
            .client
            .query(&sql, &[&after_id, &limit])
            .await
            .map_err(|e| self.error(&e, "scanning INIT rows"))?;
        rows.iter()
            .map(|row| {
                let mut event = outbox.event(row)?;
                event.table = table;
                Ok(event)
            })
            .collect()
    }

    async fn claim_on(
        client: &mut Client,
        statements: &RowStatements,
        request: ClaimRequest,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let poll = request.scope == ClaimScope::NewAndDueFailed;
        let statement = &statements.claim[usize::from(poll)][usize::from(request.strict_order)];
        let tx = client.transaction().await?;
        let rows = if poll && request.strict_order {
            let window = limit.saturating_mul(POLL_WINDOW_FACTOR);
            tx.query(statement, &[&limit, &window]).await?
        } else {
            tx.query(statement, &[&limit]).await?
        };
        tx.commit().await?;
        Ok(rows)
    }

    /// The claimed write-back of one table's rows, in transaction `tx`.
    async fn complete_on(
        tx: &tokio_postgres::Transaction<'_>,
        statements: &RowStatements,
        batch: ClaimedWriteBack<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        let d = batch.delivered;
        let d_ids: Vec<i64> = d.iter().map(|(x, _)| x.id).collect();
        let d_parts: Vec<i32> = d.iter().map(|(x, _)| x.partition).collect();
        let d_offsets: Vec<i64> = d.iter().map(|(x, _)| x.offset).collect();
        let d_tokens: Vec<&str> = d.iter().map(|(_, t)| t.0.as_str()).collect();
        let f = batch.failed;
        let f_ids: Vec<i64> = f.iter().map(|(x, _)| x.id).collect();
        let f_errors: Vec<String> = f.iter().map(|(x, _)| last_error_text(&x.error)).collect();
        let f_delays: Vec<i64> = f.iter().map(|(x, _)| delay_ms(x.retry_delay)).collect();
        let f_tokens: Vec<&str> = f.iter().map(|(_, t)| t.0.as_str()).collect();
        let r: Vec<(&ParkedEvent, &ClaimToken, &str)> = (batch.released.iter())
            .map(|(x, t)| (x, t, status::FAILED))
            .chain((batch.rejected.iter()).map(|(x, t)| (x, t, status::MANUAL_REQUIRED)))
            .collect();
        let r_ids: Vec<i64> = r.iter().map(|(x, _, _)| x.id).collect();
        let r_reasons: Vec<String> = r
            .iter()
            .map(|(x, _, _)| last_error_text(&x.reason))
            .collect();
        let r_tokens: Vec<&str> = r.iter().map(|(_, t, _)| t.0.as_str()).collect();
        let r_statuses: Vec<&str> = r.iter().map(|(_, _, s)| *s).collect();

        let success = async {
            if d_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_success,
                &[&d_ids, &d_parts, &d_offsets, &d_tokens],
            )
            .await
        };
        let fail = async {
            if f_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_failed,
                &[&f_ids, &f_errors, &f_delays, &f_tokens],
            )
            .await
        };
        let release = async {
            if r_ids.is_empty() {
                return Ok(0);
            }
            tx.execute(
                &statements.complete_released,
                &[&r_ids, &r_reasons, &r_tokens, &r_statuses],
            )
            .await
        };
        let (s, f, r) = futures_util::try_join!(success, fail, release)?;
        Ok(s + f + r)
    }
}
