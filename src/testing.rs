//! In-memory twins of the connector contract for unit tests of the core (the relay and
//! the claim worker): an [`OutboxStore`] keeping rows, claims and the checkpoint in a map,
//! and a [`ChangeStream`] fed by the test that checks, at every confirmation, that no
//! transaction at or before the confirmed position still has an INIT row.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use outboxd_connector::{
    ChangeItem, ChangeStream, ClaimRequest, ClaimScope, ClaimToken, ClaimedEvent, ClaimedWriteBack,
    CommittedTransaction, ConnectorError, NewOutboxRow, OutboxEvent, OutboxStore, OwnRowState,
    OwnRowsToDelete, Position, ReapPolicy, ReapReport, RetrySchedule, RowId, TransactionEnd,
    TransactionPart, WriteBack,
};
use tokio::sync::mpsc;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a test's log subscriber wrote: JSON lines, as `run --log-format json` writes them.
#[derive(Clone, Default)]
pub(crate) struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// A JSON log subscriber writing into this capture (set it as the default for a test).
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&lock(&self.0)).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A position of the in-memory stream: `n` in the log.
pub(crate) fn lsn(n: u64) -> Position {
    Position::new(u128::from(n), format!("lsn:0/{n:X}"))
}

/// An outbox event of row `id` and business key `key`.
pub(crate) fn event(id: i64, key: &str) -> OutboxEvent {
    OutboxEvent {
        id,
        table: 0,
        message_id: format!("m-{id}"),
        message_type: "test.event".into(),
        biz_key: key.into(),
        key: Bytes::from(key.to_owned()),
        topic: None,
        routing: None,
        payload: Bytes::from_static(b"{}"),
        headers: Vec::new(),
        created_at: "2026-01-01T00:00:00Z".into(),
        retry_count: 0,
        max_retry_count: 10,
        commit_time: None,
        rejected: None,
    }
}

/// One outbox row.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) status: &'static str,
    pub(crate) biz_key: String,
    pub(crate) last_error: Option<String>,
    pub(crate) retry_count: i32,
    claim_token: Option<String>,
    /// When a FAILED row is due again (`next_retry_time`).
    due_at: Option<Instant>,
    /// `kafka_offset`: where the row's record landed.
    pub(crate) offset: Option<i64>,
}

#[derive(Default)]
struct StoreState {
    rows: BTreeMap<i64, Row>,
    checkpoint: Option<Position>,
    write_backs: usize,
    claims: u64,
    /// Every write-back fails as on a database that is restarting.
    unavailable: bool,
    /// Write-backs refused while unavailable.
    refused: usize,
    /// The ids of the rows `insert_rows` wrote, by message id.
    own_rows: HashMap<String, i64>,
}

/// An outbox table and checkpoint row in memory, with the write-back rules of the
/// contract (SUCCESS only from INIT, FAILED or MANUAL_REQUIRED, FAILED only from INIT —
/// or from SUCCESS under exactly-once —, checkpoint forward).
#[derive(Default)]
pub(crate) struct MemoryStore {
    state: Mutex<StoreState>,
    /// Write-backs wait while this is set, as behind a slow commit.
    hold_write_backs: std::sync::atomic::AtomicBool,
    /// Write-backs waiting behind `hold_write_backs`.
    held_write_backs: std::sync::atomic::AtomicUsize,
    /// Claims get no answer while set (a silent database).
    silent_claims: std::sync::atomic::AtomicBool,
    /// Calls of `claim`, answered or not.
    claim_calls: std::sync::atomic::AtomicUsize,
}

impl MemoryStore {
    /// Inserts INIT rows (as the application's transaction would).
    pub(crate) fn insert(&self, rows: &[(i64, &str)]) {
        let mut state = lock(&self.state);
        for (id, key) in rows {
            state.rows.insert(
                *id,
                Row {
                    status: "INIT",
                    biz_key: (*key).to_owned(),
                    last_error: None,
                    retry_count: 0,
                    claim_token: None,
                    due_at: None,
                    offset: None,
                },
            );
        }
    }

    pub(crate) fn row(&self, id: i64) -> Option<Row> {
        lock(&self.state).rows.get(&id).cloned()
    }

    pub(crate) fn status(&self, id: i64) -> &'static str {
        self.row(id).map_or("absent", |r| r.status)
    }

    /// The row's `kafka_offset`.
    pub(crate) fn offset(&self, id: i64) -> Option<i64> {
        self.row(id).and_then(|r| r.offset)
    }

    /// A row shown SUCCESS at `offset`, as a write-back before a crash left it.
    pub(crate) fn set_delivered(&self, id: i64, offset: i64) {
        if let Some(row) = lock(&self.state).rows.get_mut(&id) {
            row.status = "SUCCESS";
            row.offset = Some(offset);
        }
    }

    /// What another writer (the claim worker, an operator) would do.
    pub(crate) fn set_status(&self, id: i64, status: &'static str) {
        if let Some(row) = lock(&self.state).rows.get_mut(&id) {
            row.status = status;
        }
    }

    /// Write-backs wait while `held` (a slow commit), and go on once it is cleared.
    /// Claims wait with no answer while `silent` (a database behind a network black hole).
    pub(crate) fn silence_claims(&self, silent: bool) {
        self.silent_claims
            .store(silent, std::sync::atomic::Ordering::SeqCst);
    }

    /// Calls of `claim` so far, answered or not.
    pub(crate) fn claim_calls(&self) -> usize {
        self.claim_calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn hold_write_backs(&self, held: bool) {
        self.hold_write_backs
            .store(held, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many write-backs are waiting behind [`Self::hold_write_backs`].
    pub(crate) fn held_write_backs(&self) -> usize {
        self.held_write_backs
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Write-backs fail (transient) while `down`, as during a database restart.
    pub(crate) fn set_unavailable(&self, down: bool) {
        lock(&self.state).unavailable = down;
    }

    /// How many write-backs were refused while unavailable.
    pub(crate) fn refused_write_backs(&self) -> usize {
        lock(&self.state).refused
    }

    /// Replaces the checkpoint row, as `outboxd recover` (or a restore) does.
    pub(crate) fn reset_checkpoint(&self, position: Option<Position>) {
        lock(&self.state).checkpoint = position;
    }

    pub(crate) fn checkpoint(&self) -> Option<Position> {
        lock(&self.state).checkpoint.clone()
    }
}

impl OutboxStore for MemoryStore {
    async fn write_back(&self, batch: WriteBack<'_>) -> Result<(), ConnectorError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.hold_write_backs.load(SeqCst) {
            self.held_write_backs.fetch_add(1, SeqCst);
            while self.hold_write_backs.load(SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            self.held_write_backs.fetch_sub(1, SeqCst);
        }
        let mut state = lock(&self.state);
        if state.unavailable {
            state.refused += 1;
            return Err(ConnectorError::transient(
                "the database system is shutting down",
            ));
        }
        state.write_backs += 1;
        for d in batch.delivered {
            if let Some(row) = state.rows.get_mut(&d.id) {
                let resent = batch.replace_positions && row.status == "SUCCESS";
                if matches!(row.status, "INIT" | "FAILED" | "MANUAL_REQUIRED") || resent {
                    row.status = "SUCCESS";
                    row.offset = Some(d.offset);
                }
            }
        }
        // From INIT, and under exactly-once from SUCCESS too (an aborted window's
        // write-back): see `WriteBack::replace_positions`.
        let failable = |row: &&mut Row| {
            row.status == "INIT" || (batch.replace_positions && row.status == "SUCCESS")
        };
        for f in batch.failed {
            if let Some(row) = state.rows.get_mut(&f.id).filter(failable) {
                row.status = "FAILED";
                row.retry_count += 1;
                row.last_error = Some(f.error.clone());
                row.due_at = Some(Instant::now() + f.retry_delay);
                row.offset = None;
            }
        }
        for p in batch.parked {
            if let Some(row) = state.rows.get_mut(&p.id).filter(failable) {
                row.status = "FAILED";
                row.last_error = Some(p.reason.clone());
                row.due_at = Some(Instant::now());
                row.offset = None;
            }
        }
        for r in batch.rejected {
            if let Some(row) = state.rows.get_mut(&r.id).filter(failable) {
                row.status = "MANUAL_REQUIRED";
                row.last_error = Some(r.reason.clone());
                row.offset = None;
            }
        }
        if let Some(position) = batch.checkpoint {
            if state.checkpoint.as_ref() < Some(position) {
                state.checkpoint = Some(position.clone());
            }
        }
        Ok(())
    }

    async fn load_checkpoint(&self) -> Result<Option<Position>, ConnectorError> {
        Ok(self.checkpoint())
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedEvent>, ConnectorError> {
        self.claim_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        while self.silent_claims.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let mut state = lock(&self.state);
        state.claims += 1;
        let claim = state.claims;
        let mut claimed = Vec::new();
        let now = Instant::now();
        for (id, row) in state.rows.iter_mut() {
            let due = row.due_at.is_none_or(|at| at <= now);
            let in_scope = (row.status == "FAILED" && due)
                || (request.scope == ClaimScope::NewAndDueFailed && row.status == "INIT");
            if !in_scope || claimed.len() == request.limit {
                continue;
            }
            let token = format!("claim-{claim}-{id}");
            row.status = "PROCESSING";
            row.claim_token = Some(token.clone());
            let mut event = event(*id, &row.biz_key);
            event.retry_count = row.retry_count;
            claimed.push(ClaimedEvent {
                event,
                claim_token: ClaimToken(token),
            });
        }
        Ok(claimed)
    }

    async fn complete_claimed(&self, batch: ClaimedWriteBack<'_>) -> Result<u64, ConnectorError> {
        let mut state = lock(&self.state);
        let mut updated = 0;
        for (d, token) in batch.delivered {
            if let Some(row) = take_claim(&mut state.rows, d.id, token) {
                row.status = "SUCCESS";
                updated += 1;
            }
        }
        for (f, token) in batch.failed {
            if let Some(row) = take_claim(&mut state.rows, f.id, token) {
                row.status = "FAILED";
                row.retry_count += 1;
                row.last_error = Some(f.error.clone());
                row.due_at = Some(Instant::now() + f.retry_delay);
                updated += 1;
            }
        }
        for (r, token) in batch.released {
            if let Some(row) = take_claim(&mut state.rows, r.id, token) {
                row.status = "FAILED";
                row.last_error = Some(r.reason.clone());
                row.due_at = Some(Instant::now());
                updated += 1;
            }
        }
        for (r, token) in batch.rejected {
            if let Some(row) = take_claim(&mut state.rows, r.id, token) {
                row.status = "MANUAL_REQUIRED";
                row.last_error = Some(r.reason.clone());
                updated += 1;
            }
        }
        Ok(updated)
    }

    async fn reap(&self, _policy: ReapPolicy) -> Result<ReapReport, ConnectorError> {
        Ok(ReapReport::default())
    }

    async fn retry_schedule(&self) -> Result<RetrySchedule, ConnectorError> {
        Ok(RetrySchedule::default())
    }

    async fn blocked_keys(
        &self,
        keys: Option<&[String]>,
    ) -> Result<HashSet<String>, ConnectorError> {
        let state = lock(&self.state);
        Ok(state
            .rows
            .values()
            .filter(|r| matches!(r.status, "FAILED" | "PROCESSING" | "MANUAL_REQUIRED"))
            .filter(|r| keys.is_none_or(|keys| keys.contains(&r.biz_key)))
            .map(|r| r.biz_key.clone())
            .collect())
    }

    async fn highest_delivered_id(&self) -> Result<Option<i64>, ConnectorError> {
        let state = lock(&self.state);
        Ok(state
            .rows
            .iter()
            .filter(|(_, r)| r.status == "SUCCESS")
            .map(|(id, _)| *id)
            .max())
    }

    /// One table: rows are found by id.
    async fn delivered_among(&self, rows: &[RowId]) -> Result<HashSet<RowId>, ConnectorError> {
        let state = lock(&self.state);
        Ok(rows
            .iter()
            .filter(|row| {
                state
                    .rows
                    .get(&row.id)
                    .is_some_and(|r| r.status == "SUCCESS")
            })
            .copied()
            .collect())
    }

    /// Rows of the one table, INIT, after the last (none when rolled back).
    async fn insert_rows(
        &self,
        rows: &[NewOutboxRow],
        end: TransactionEnd,
    ) -> Result<(), ConnectorError> {
        if end == TransactionEnd::Rollback {
            return Ok(());
        }
        let mut state = lock(&self.state);
        for new in rows {
            let id = state.rows.keys().next_back().map_or(1, |last| last + 1);
            state.rows.insert(
                id,
                Row {
                    status: "INIT",
                    biz_key: new.biz_key.clone(),
                    last_error: None,
                    retry_count: 0,
                    claim_token: None,
                    due_at: None,
                    offset: None,
                },
            );
            state.own_rows.insert(new.message_id.clone(), id);
        }
        Ok(())
    }

    async fn own_rows(&self, message_ids: &[String]) -> Result<Vec<OwnRowState>, ConnectorError> {
        let state = lock(&self.state);
        let found = message_ids.iter().filter_map(|message_id| {
            let row = state.rows.get(state.own_rows.get(message_id)?)?;
            Some(OwnRowState {
                message_id: message_id.clone(),
                status: row.status.to_owned(),
                retry_count: row.retry_count,
                position: row.offset.map(|offset| (0, offset)),
                last_error: row.last_error.clone(),
            })
        });
        Ok(found.collect())
    }

    async fn delete_own_rows(
        &self,
        message_ids: &[String],
        which: OwnRowsToDelete,
    ) -> Result<u64, ConnectorError> {
        let mut state = lock(&self.state);
        let mut deleted = 0;
        for message_id in message_ids {
            let Some(&id) = state.own_rows.get(message_id) else {
                continue;
            };
            let delivered = state.rows.get(&id).is_some_and(|r| r.status == "SUCCESS");
            if which == OwnRowsToDelete::All || delivered {
                state.rows.remove(&id);
                state.own_rows.remove(message_id);
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// One table (index 0): its INIT rows after `after_id`, in id order.
    async fn scan_init(
        &self,
        table: u16,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, ConnectorError> {
        let state = lock(&self.state);
        if table != 0 {
            return Ok(Vec::new());
        }
        Ok((state.rows.range(after_id.saturating_add(1)..))
            .filter(|(_, row)| row.status == "INIT")
            .take(limit)
            .map(|(id, row)| event(*id, &row.biz_key))
            .collect())
    }
}

/// The row of `id` if `token` still holds its claim; the claim is cleared.
fn take_claim<'a>(
    rows: &'a mut BTreeMap<i64, Row>,
    id: i64,
    token: &ClaimToken,
) -> Option<&'a mut Row> {
    let row = rows
        .get_mut(&id)
        .filter(|r| r.claim_token.as_deref() == Some(token.0.as_str()))?;
    row.claim_token = None;
    Some(row)
}

/// What the stream saw: positions confirmed, and any confirmation that passed an INIT row.
#[derive(Default)]
pub(crate) struct StreamLog {
    pub(crate) confirmed: Vec<Position>,
    pub(crate) violations: Vec<String>,
}

/// The test's end of a [`MemoryStream`].
pub(crate) struct LogWriter {
    items: mpsc::UnboundedSender<Result<ChangeItem, ConnectorError>>,
}

impl LogWriter {
    /// A committed transaction at `lsn(position)` inserting `events`.
    pub(crate) fn commit(&self, position: u64, events: Vec<OutboxEvent>) {
        let tx = CommittedTransaction {
            commit_position: lsn(position),
            commit_time: None,
            events,
        };
        let _ = self.items.send(Ok(ChangeItem::Transaction(tx)));
    }

    /// A part of a large transaction that begins at `lsn(begins)`; its end is a
    /// [`LogWriter::commit`].
    pub(crate) fn part(&self, begins: u64, events: Vec<OutboxEvent>) {
        let part = TransactionPart {
            begin_position: lsn(begins),
            commit_time: None,
            events,
        };
        let _ = self.items.send(Ok(ChangeItem::Part(part)));
    }
}

/// A log tail fed by a [`LogWriter`]. Once the writer is gone it waits forever, as an idle
/// log does.
pub(crate) struct MemoryStream {
    items: mpsc::UnboundedReceiver<Result<ChangeItem, ConnectorError>>,
    store: Arc<MemoryStore>,
    /// Row ids of each transaction yielded, by position.
    yielded: Vec<(Position, Vec<i64>)>,
    /// Row ids of the parts of the transaction whose end is not yielded yet.
    open: Vec<i64>,
    log: Arc<Mutex<StreamLog>>,
}

impl MemoryStream {
    pub(crate) fn new(store: Arc<MemoryStore>) -> (Self, LogWriter, Arc<Mutex<StreamLog>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(StreamLog::default()));
        let stream = Self {
            items: rx,
            store,
            yielded: Vec::new(),
            open: Vec::new(),
            log: Arc::clone(&log),
        };
        (stream, LogWriter { items: tx }, log)
    }
}

impl ChangeStream for MemoryStream {
    async fn next(&mut self) -> Result<ChangeItem, ConnectorError> {
        match self.items.recv().await {
            Some(item) => {
                match &item {
                    Ok(ChangeItem::Transaction(tx)) => {
                        let mut ids = std::mem::take(&mut self.open);
                        ids.extend(tx.events.iter().map(|e| e.id));
                        self.yielded.push((tx.commit_position.clone(), ids));
                    }
                    Ok(ChangeItem::Part(part)) => {
                        self.open.extend(part.events.iter().map(|e| e.id));
                    }
                    _ => {}
                }
                item
            }
            None => std::future::pending().await,
        }
    }

    async fn confirm(&mut self, position: &Position) -> Result<(), ConnectorError> {
        let mut log = lock(&self.log);
        if let Some(last) = log.confirmed.last().filter(|last| *last >= position) {
            let violation = format!("confirmed {position} after {last}");
            log.violations.push(violation);
        }
        for (at, ids) in self.yielded.iter().filter(|(at, _)| at <= position) {
            for id in ids {
                if self.store.status(*id) == "INIT" {
                    log.violations.push(format!(
                        "confirmed {position} with row {id} of {at} still INIT"
                    ));
                }
            }
        }
        log.confirmed.push(position.clone());
        Ok(())
    }
}
