//! The write-back: one transaction per batch (or one statement that commits on its own,
//! for the common case), and the wait for rows whose commit was decoded before it became
//! visible.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outboxd_connector::{last_error_text, WriteBack};
use outboxd_connector_kit::{status, tables};
use tokio_postgres::{Client, Statement};

use super::{delay_ms, Conn, PgOutboxStore, RowStatements};
use crate::log::identity::StoredCheckpoint;

impl PgOutboxStore {
    /// One write-back transaction: the rows' statuses (when the batch has any) and the
    /// checkpoint row.
    ///
    /// `BEGIN`, every table's status updates and the checkpoint upsert go to the server
    /// together, in one round trip: tokio-postgres sends a request when its future is first
    /// polled, and `try_join` polls `BEGIN` before the rest. Then, only when some row was not
    /// updated, the visibility wait; then `COMMIT`. Writing the checkpoint before that wait
    /// is safe: nothing of the transaction is visible before `COMMIT`, and the wait ends
    /// (rows found, or taken as deleted) before it. Two round trips instead of four: the
    /// write-back runs every `writeback_interval`, so each one costs CPU and latency.
    pub(super) async fn write_back_on(
        conn: &mut Conn,
        batch: &WriteBack<'_>,
        parts: &[tables::TableWriteBack<'_>],
        pipeline: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let position = batch
            .checkpoint
            .map(|p| StoredCheckpoint::text(p, &conn.system));
        // Each table's rows (the caller checked the tables).
        let tables: Vec<(&RowStatements, WriteBackRows)> = parts
            .iter()
            .filter_map(|part| {
                let statements = conn.outboxes.get(usize::from(part.table))?.rows.as_ref()?;
                Some((statements, WriteBackRows::new(&part.rows())))
            })
            .collect();
        if Self::write_back_at_once(conn, &tables, position.as_deref(), pipeline).await? {
            return Ok(());
        }
        conn.transaction_open = true;
        let client = &conn.client;
        let written = async {
            let updates = futures_util::future::try_join_all(
                tables
                    .iter()
                    .map(|(statements, rows)| rows.apply(client, statements.updates())),
            );
            let checkpoint = async {
                match &position {
                    Some(position) => client
                        .execute(&conn.checkpoint, &[&pipeline, position])
                        .await
                        .map(drop),
                    None => Ok(()),
                }
            };
            let ((), (updated, ())) = futures_util::try_join!(
                client.batch_execute("BEGIN"),
                futures_util::future::try_join(updates, checkpoint),
            )?;
            for ((statements, rows), updated) in tables.iter().zip(updated) {
                Self::await_visibility(client, statements, rows, &updated).await?;
            }
            client.batch_execute("COMMIT").await
        };
        match written.await {
            Ok(()) => {
                conn.transaction_open = false;
                Ok(())
            }
            Err(e) => {
                // A failed statement aborted the transaction; end it here so the
                // connection stays usable (when this fails too, `lock` replaces it).
                if conn.client.batch_execute("ROLLBACK").await.is_ok() {
                    conn.transaction_open = false;
                }
                Err(e)
            }
        }
    }

    /// The common write-backs in one statement that commits on its own, one round trip
    /// instead of two: only a checkpoint, or one table's SUCCESS rows with the checkpoint
    /// (written only when every row was updated). Returns whether it wrote the whole
    /// batch; when not (other kinds of rows, several tables, or a row the statement did
    /// not update), [`Self::write_back_on`]'s transaction writes it, the rows already
    /// SUCCESS matching no status predicate there. At a steady rate the write-back runs
    /// every `writeback_interval` and is mostly this case, so the round trip saved is a
    /// round of wake-ups of the relay and of the server each time.
    async fn write_back_at_once(
        conn: &Conn,
        tables: &[(&RowStatements, WriteBackRows)],
        position: Option<&str>,
        pipeline: &str,
    ) -> Result<bool, tokio_postgres::Error> {
        let Some(position) = position else {
            return Ok(false);
        };
        match tables {
            [] => {
                conn.client
                    .execute(&conn.checkpoint, &[&pipeline, &position])
                    .await?;
                Ok(true)
            }
            [(statements, rows)] if rows.only_delivered() => {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                    &rows.d_ids,
                    &rows.d_parts,
                    &rows.d_offsets,
                    &rows.replace_positions,
                    &pipeline,
                    &position,
                ];
                let row = conn
                    .client
                    .query_one(&statements.success_and_checkpoint, &params)
                    .await?;
                row.try_get(0)
            }
            _ => Ok(false),
        }
    }

    /// Waits, in the open write-back transaction, until the rows of `rows` that were not
    /// `updated` are visible, and writes their statuses.
    async fn await_visibility(
        client: &Client,
        statements: &RowStatements,
        rows: &WriteBackRows,
        updated: &HashSet<i64>,
    ) -> Result<(), tokio_postgres::Error> {
        // A row not updated is either past the status this batch writes (a replay after a
        // crash: fine) or not visible yet: PostgreSQL flushes a commit record, which the
        // walsender may decode and send at once, a moment before the committing session
        // makes the transaction visible to others. The checkpoint must not pass a row
        // whose status was not written, so wait (briefly) until every row is visible.
        // With a synchronous standby that moment lasts until the standby confirms the
        // commit (or the committing session gives up waiting): while any session waits
        // for that (`wait_event = 'SyncRep'`), a missing row may be one of its rows, so
        // the wait goes on for as long as that lasts; only then is a missing row taken
        // as deleted.
        let mut missing: Vec<i64> = rows
            .ids()
            .filter(|id| !updated.contains(id))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let started = Instant::now();
        let mut deadline = started + VISIBILITY_WAIT;
        let mut pause = Duration::from_millis(2);
        let mut told = started;
        while !missing.is_empty() {
            let found = client.query(&statements.exists, &[&missing]).await?;
            let found: HashSet<i64> = found
                .iter()
                .map(|row| row.try_get::<_, i64>(0))
                .collect::<Result<_, _>>()?;
            if !found.is_empty() {
                // Replayed rows match no status predicate: a no-op for them.
                rows.only(&found)
                    .apply(client, statements.updates())
                    .await?;
                missing.retain(|id| !found.contains(id));
            }
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                if !commit_waits_for_a_standby(client).await? {
                    break;
                }
                deadline = Instant::now() + VISIBILITY_WAIT;
                if told.elapsed() >= Duration::from_secs(10) || told == started {
                    told = Instant::now();
                    tracing::warn!(
                        rows = missing.len(),
                        waiting = ?started.elapsed(),
                        "write-back: outbox rows not visible yet while a commit waits for a \
                         synchronous standby; the log position is held until they are"
                    );
                }
            }
            tracing::debug!(
                rows = missing.len(),
                "write-back: outbox rows not visible yet (their commit was decoded first); waiting"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        if !missing.is_empty() {
            tracing::warn!(
                ids = ?missing,
                "write-back: outbox rows published but not found in the table (deleted?); \
                 their status is not written"
            );
        }
        Ok(())
    }
}

/// How long a write-back waits for the rows of a just-decoded commit to become visible
/// (longer while a commit waits for a synchronous standby).
const VISIBILITY_WAIT: Duration = Duration::from_secs(2);

/// Whether a session's commit is waiting for a synchronous standby to confirm it: its
/// rows are in the log but not yet visible. Only commits issued before this write-back
/// began count (`now()` is the transaction's start): a commit decoded already was issued
/// before, and later ones on a busy cluster must not keep the wait going. Needs
/// `pg_monitor` (or superuser) to see other roles' sessions; without it, none is seen and
/// a missing row is taken as deleted after [`VISIBILITY_WAIT`], as before.
async fn commit_waits_for_a_standby(client: &Client) -> Result<bool, tokio_postgres::Error> {
    // Inside a transaction pg_stat_activity is read once and kept: read it afresh.
    client
        .execute("SELECT pg_stat_clear_snapshot()", &[])
        .await?;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE wait_event = 'SyncRep' AND query_start <= now())",
            &[],
        )
        .await?;
    row.try_get(0)
}

/// One write-back's rows as the statements' arrays.
#[derive(Clone, Default)]
struct WriteBackRows {
    d_ids: Vec<i64>,
    /// [`WriteBack::replace_positions`].
    replace_positions: bool,
    d_parts: Vec<i32>,
    d_offsets: Vec<i64>,
    f_ids: Vec<i64>,
    f_errors: Vec<String>,
    f_delays: Vec<i64>,
    p_ids: Vec<i64>,
    p_reasons: Vec<String>,
    p_statuses: Vec<&'static str>,
}

impl RowStatements {
    /// The SUCCESS, FAILED and parked updates, in the order [`WriteBackRows::apply`] runs them.
    fn updates(&self) -> [&Statement; 3] {
        [&self.success, &self.failed, &self.parked]
    }
}

impl WriteBackRows {
    fn new(batch: &WriteBack<'_>) -> Self {
        let (d, f, p) = (batch.delivered, batch.failed, batch.parked);
        Self {
            replace_positions: batch.replace_positions,
            d_ids: d.iter().map(|x| x.id).collect(),
            d_parts: d.iter().map(|x| x.partition).collect(),
            d_offsets: d.iter().map(|x| x.offset).collect(),
            f_ids: f.iter().map(|x| x.id).collect(),
            f_errors: f.iter().map(|x| last_error_text(&x.error)).collect(),
            f_delays: f.iter().map(|x| delay_ms(x.retry_delay)).collect(),
            p_ids: p.iter().chain(batch.rejected).map(|x| x.id).collect(),
            p_reasons: (p.iter().chain(batch.rejected))
                .map(|x| last_error_text(&x.reason))
                .collect(),
            p_statuses: (p.iter().map(|_| status::FAILED))
                .chain(batch.rejected.iter().map(|_| status::MANUAL_REQUIRED))
                .collect(),
        }
    }

    /// Whether every row was delivered (none failed, parked or rejected).
    fn only_delivered(&self) -> bool {
        self.f_ids.is_empty() && self.p_ids.is_empty()
    }

    fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.d_ids
            .iter()
            .chain(&self.f_ids)
            .chain(&self.p_ids)
            .copied()
    }

    /// The rows whose id is in `keep`.
    fn only(&self, keep: &HashSet<i64>) -> Self {
        let mut out = Self {
            replace_positions: self.replace_positions,
            ..Self::default()
        };
        for (i, id) in self.d_ids.iter().enumerate() {
            if keep.contains(id) {
                out.d_ids.push(*id);
                out.d_parts.push(self.d_parts[i]);
                out.d_offsets.push(self.d_offsets[i]);
            }
        }
        for (i, id) in self.f_ids.iter().enumerate() {
            if keep.contains(id) {
                out.f_ids.push(*id);
                out.f_errors.push(self.f_errors[i].clone());
                out.f_delays.push(self.f_delays[i]);
            }
        }
        for (i, id) in self.p_ids.iter().enumerate() {
            if keep.contains(id) {
                out.p_ids.push(*id);
                out.p_reasons.push(self.p_reasons[i].clone());
                out.p_statuses.push(self.p_statuses[i]);
            }
        }
        out
    }

    /// Runs the SUCCESS, FAILED and parked updates, pipelined in this order (so a row
    /// both delivered and failed in one batch ends SUCCESS); returns the ids updated.
    async fn apply(
        &self,
        client: &Client,
        [success, failed, parked]: [&Statement; 3],
    ) -> Result<HashSet<i64>, tokio_postgres::Error> {
        let s = async {
            if self.d_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    success,
                    &[&self.d_ids, &self.d_parts, &self.d_offsets, replace],
                )
                .await
        };
        let f = async {
            if self.f_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    failed,
                    &[&self.f_ids, &self.f_errors, &self.f_delays, replace],
                )
                .await
        };
        let p = async {
            if self.p_ids.is_empty() {
                return Ok(Vec::new());
            }
            let replace = &self.replace_positions;
            client
                .query(
                    parked,
                    &[&self.p_ids, &self.p_reasons, &self.p_statuses, replace],
                )
                .await
        };
        let (s, f, p) = futures_util::try_join!(s, f, p)?;
        s.iter()
            .chain(&f)
            .chain(&p)
            .map(|row| row.try_get::<_, i64>(0))
            .collect()
    }
}
