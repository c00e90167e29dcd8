//! The in-memory "database" the twins share: the outbox's rows with the columns the
//! contract writes, the row locks other transactions hold, the checkpoint row, the log of
//! committed transactions with their positions, the replication slot (the confirmed
//! position, or lost) and the server's identity. A store, a stream and the connector are
//! handles on one [`Database`], as connections to one server are, so what one writes the
//! others see.
//!
//! Every statement of the twins takes the one lock of [`State`] for its whole run: a
//! statement is atomic and isolated, as a short transaction is (a write-back that fails
//! writes nothing).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use outboxd_connector::{
    headers_from_json, ConnectorError, ErrorReason, OutboxEvent, Position, TableKind,
};
use tokio::sync::Notify;

use super::{lock, lsn};

/// The columns of a row [`super::MemoryStore::insert`] writes, which [`super::event`]
/// reads back: the relay's and the claim worker's tests compare events with it.
pub(super) const FIXTURE_TYPE: &str = "test.event";
/// See [`FIXTURE_TYPE`].
pub(super) const FIXTURE_PAYLOAD: &[u8] = b"{}";
/// See [`FIXTURE_TYPE`].
pub(super) const FIXTURE_CREATED_AT: &str = "2026-01-01T00:00:00Z";
/// See [`FIXTURE_TYPE`].
pub(super) const FIXTURE_MAX_RETRIES: i32 = 10;

/// The statuses that hold a key back under strict ordering, the engines' own list (a row
/// holds it with `next_retry_time` set, as every writer of them sets it: the engines'
/// partial index of rows in trouble).
pub(super) use outboxd_connector_kit::status::BLOCKING;

/// The fix every lost or foreign position names.
pub(super) const RECOVER: &str = "run `outboxd recover --config <file>`, which starts the log \
                                  afresh and publishes every INIT row";

/// One outbox row: the columns outboxd reads and writes.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) status: &'static str,
    pub(crate) biz_key: String,
    pub(crate) last_error: Option<String>,
    pub(crate) retry_count: i32,
    pub(crate) max_retry_count: i32,
    /// `kafka_partition` and `kafka_offset`: where the row's record landed.
    pub(crate) partition: Option<i32>,
    pub(crate) offset: Option<i64>,
    pub(crate) message_id: String,
    pub(crate) message_type: String,
    pub(crate) topic: Option<String>,
    pub(crate) payload: Bytes,
    /// The `headers` column as read into an event (the JSON object's entries in order).
    pub(crate) headers: Vec<(String, Bytes)>,
    /// `created_at` as the twin renders it (RFC 3339, UTC as `Z`).
    pub(crate) created_at: String,
    /// When a FAILED row is due again; set on every row in trouble (the retry index).
    pub(crate) next_retry_time: Option<SystemTime>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_at: Option<SystemTime>,
    pub(crate) sent_at: Option<SystemTime>,
}

impl Row {
    /// An INIT row with the columns an application's insert gives.
    pub(super) fn new(
        message_id: String,
        message_type: String,
        biz_key: String,
        payload: Bytes,
        headers: Vec<(String, Bytes)>,
        max_retry_count: i32,
    ) -> Self {
        Self {
            status: "INIT",
            biz_key,
            last_error: None,
            retry_count: 0,
            max_retry_count,
            partition: None,
            offset: None,
            message_id,
            message_type,
            topic: None,
            payload,
            headers,
            created_at: rfc3339(SystemTime::now()),
            next_retry_time: None,
            claim_token: None,
            claimed_at: None,
            sent_at: None,
        }
    }

    /// The row [`super::MemoryStore::insert`] writes for `id`, read back as
    /// [`super::event`]`(id, key)`.
    pub(super) fn fixture(id: i64, key: &str) -> Self {
        let mut row = Self::new(
            format!("m-{id}"),
            FIXTURE_TYPE.into(),
            key.into(),
            Bytes::from_static(FIXTURE_PAYLOAD),
            Vec::new(),
            FIXTURE_MAX_RETRIES,
        );
        row.created_at = FIXTURE_CREATED_AT.into();
        row
    }

    /// Headers from the `headers` column's JSON text, as every connector reads them.
    pub(super) fn headers_of(json: Option<&str>) -> Vec<(String, Bytes)> {
        json.and_then(headers_from_json).unwrap_or_default()
    }

    /// SUCCESS where the record landed, out of the rows in trouble (the write-back and the
    /// claimed write-back alike).
    pub(super) fn deliver(&mut self, partition: i32, offset: i64, now: SystemTime) {
        self.status = "SUCCESS";
        self.sent_at = Some(now);
        self.partition = Some(partition);
        self.offset = Some(offset);
        self.last_error = None;
        self.next_retry_time = None;
    }

    /// The row as an event (the log's with the commit time, a claim's without).
    pub(super) fn event(&self, id: i64, commit_time: Option<SystemTime>) -> OutboxEvent {
        OutboxEvent {
            id,
            table: 0,
            message_id: self.message_id.clone(),
            message_type: self.message_type.clone(),
            biz_key: self.biz_key.clone(),
            key: Bytes::from(self.biz_key.clone()),
            topic: self.topic.clone(),
            routing: None,
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            created_at: self.created_at.clone(),
            retry_count: self.retry_count,
            max_retry_count: self.max_retry_count,
            commit_time,
            rejected: None,
        }
    }

    /// Whether the row holds its key back (strict ordering, blocked keys).
    pub(super) fn blocks(&self) -> bool {
        self.next_retry_time.is_some() && BLOCKING.contains(&self.status)
    }

    /// A counted failed attempt: FAILED due after `delay`, or MANUAL_REQUIRED on the
    /// last attempt, the error kept (cut as every engine cuts it).
    pub(super) fn fail(&mut self, error: &str, delay: Duration, now: SystemTime) {
        self.retry_count += 1;
        self.status = if self.retry_count >= self.max_retry_count {
            "MANUAL_REQUIRED"
        } else {
            "FAILED"
        };
        self.next_retry_time = Some(now + delay);
        self.last_error = Some(outboxd_connector::last_error_text(error));
    }

    /// Set aside as `status` with `reason`, due now and no attempt counted: a parked or
    /// released row is retried once its key is free, a rejected one (MANUAL_REQUIRED)
    /// holds its key until an operator acts.
    pub(super) fn set_aside(&mut self, status: &'static str, reason: &str, now: SystemTime) {
        self.status = status;
        self.next_retry_time = Some(now);
        self.last_error = Some(outboxd_connector::last_error_text(reason));
    }

    /// `sent_at`, `kafka_partition` and `kafka_offset` cleared: the row names no record.
    pub(super) fn unsend(&mut self) {
        self.sent_at = None;
        self.partition = None;
        self.offset = None;
    }

    /// `claim_token` and `claimed_at` cleared.
    pub(super) fn unclaim(&mut self) {
        self.claim_token = None;
        self.claimed_at = None;
    }
}

/// One committed transaction that inserted outbox rows, as the log holds it.
#[derive(Clone, Debug)]
pub(super) struct LogEntry {
    /// Where the transaction begins: after the commit of the one before it.
    pub(super) begin: Position,
    pub(super) commit: Position,
    pub(super) commit_time: SystemTime,
    pub(super) events: Vec<OutboxEvent>,
}

/// Everything the database holds. See the module's doc for the one lock.
#[derive(Default)]
pub(super) struct State {
    /// `init` created the tables.
    pub(super) initialised: bool,
    pub(super) rows: BTreeMap<i64, Row>,
    /// The id sequence: never handed out twice, also after a rollback or a delete.
    pub(super) next_id: i64,
    /// Rows another transaction holds `FOR UPDATE` (the harness's `lock_row`).
    pub(super) locked: HashSet<i64>,
    /// The checkpoint row's position.
    pub(super) checkpoint: Option<Position>,
    /// Committed transactions that inserted outbox rows, in commit order.
    pub(super) log: Vec<LogEntry>,
    /// The log's last position: each commit moves it by 2 (its begin, then its commit).
    pub(super) log_end: u64,
    /// The replication slot's confirmed position; `None` before `init` in log mode.
    pub(super) slot: Option<Position>,
    /// The slot was dropped or invalidated: the stream cannot resume.
    pub(super) position_lost: bool,
    /// A stream reads the slot now.
    pub(super) reader: bool,
    /// Tables renamed away (the harness's `hide_table`): statements on them fail.
    pub(super) outbox_hidden: bool,
    pub(super) checkpoint_hidden: bool,
    /// Every write-back fails as on a database that is restarting.
    pub(super) unavailable: bool,
    /// Write-backs refused while unavailable.
    pub(super) refused: usize,
}

impl State {
    /// The outbox table, or the error of a statement on a table that is not there.
    pub(super) fn outbox(&self) -> Result<(), ConnectorError> {
        if !self.initialised || self.outbox_hidden {
            return Err(missing(TableKind::Outbox.name()));
        }
        Ok(())
    }

    /// The checkpoint table, likewise.
    pub(super) fn checkpoint_table(&self) -> Result<(), ConnectorError> {
        if !self.initialised || self.checkpoint_hidden {
            return Err(missing("outboxd_checkpoint"));
        }
        Ok(())
    }

    /// The log's position now: what a slot created now starts from.
    pub(super) fn end_position(&self) -> Position {
        lsn(self.log_end)
    }

    /// Rows inserted in one committed transaction: their ids, and the transaction in the
    /// log (a stream reads it), at the next positions.
    fn commit(&mut self, rows: Vec<Row>) -> Vec<i64> {
        let now = SystemTime::now();
        let mut ids = Vec::with_capacity(rows.len());
        let mut events = Vec::with_capacity(rows.len());
        for row in rows {
            self.next_id += 1;
            let id = self.next_id;
            events.push(row.event(id, Some(now)));
            self.rows.insert(id, row);
            ids.push(id);
        }
        let begin = lsn(self.log_end + 1);
        self.log_end += 2;
        self.log.push(LogEntry {
            begin,
            commit: lsn(self.log_end),
            commit_time: now,
            events,
        });
        ids
    }
}

/// The twins' shared database; see the module's doc.
pub(crate) struct Database {
    state: Mutex<State>,
    /// Woken at every commit, for the streams waiting on the log.
    pub(super) committed: Notify,
    /// The server's identity: a checkpoint naming another one was copied from there.
    pub(super) server: String,
    /// Write-backs wait while this is set, as behind a slow commit.
    pub(super) hold_write_backs: AtomicBool,
    /// Write-backs waiting behind `hold_write_backs`.
    pub(super) held_write_backs: AtomicUsize,
    /// Claims get no answer while set (a silent database).
    pub(super) silent_claims: AtomicBool,
    /// Calls of `claim`, answered or not.
    pub(super) claim_calls: AtomicUsize,
}

impl Database {
    /// A database of its own; `initialised`: with its tables (as after `init --mode poll`:
    /// no slot).
    pub(super) fn new(initialised: bool) -> Arc<Self> {
        static SERVERS: AtomicU64 = AtomicU64::new(0);
        let server = format!("memory-{}", SERVERS.fetch_add(1, Ordering::Relaxed));
        Arc::new(Self {
            state: Mutex::new(State {
                initialised,
                ..State::default()
            }),
            committed: Notify::new(),
            server,
            hold_write_backs: AtomicBool::new(false),
            held_write_backs: AtomicUsize::new(0),
            silent_claims: AtomicBool::new(false),
            claim_calls: AtomicUsize::new(0),
        })
    }

    /// The state, for one statement.
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Commits `rows` in one transaction (see [`State::commit`]) and wakes the readers.
    pub(super) fn commit(&self, rows: Vec<Row>) -> Vec<i64> {
        let ids = self.state().commit(rows);
        self.committed.notify_waiters();
        ids
    }

    /// Whether `position` names another server: a checkpoint copied from there.
    pub(super) fn is_foreign(&self, position: &Position) -> bool {
        position
            .as_str()
            .split_once(";server=")
            .is_some_and(|(_, server)| server != self.server)
    }

    /// The error of a checkpoint another server wrote.
    pub(super) fn foreign_checkpoint(&self, position: &Position) -> ConnectorError {
        ConnectorError::definite(format!(
            "the checkpoint {position} was written on another server than {}: resuming \
             from it would skip what this server's log holds below it; {RECOVER}",
            self.server
        ))
        .with_reason(ErrorReason::PositionLost)
    }
}

/// The error of a statement on a table that does not exist.
fn missing(table: &str) -> ConnectorError {
    ConnectorError::definite(format!(
        "table `{table}` does not exist: run `outboxd init`"
    ))
    .with_reason(ErrorReason::MissingObject)
}

/// A fresh claim token: a random UUID (version 4) in text form, as the engines make.
pub(super) fn uuid() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

/// `t` as RFC 3339 in UTC with microseconds, as the twin renders `created_at`.
pub(super) fn rfc3339(t: SystemTime) -> String {
    humantime_serde::re::humantime::format_rfc3339_micros(t).to_string()
}

/// Seconds from now to `t`, negative when past (the harness's `next_retry_in`).
pub(super) fn seconds_from_now(t: SystemTime) -> f64 {
    let now = SystemTime::now();
    match t.duration_since(now) {
        Ok(ahead) => ahead.as_secs_f64(),
        Err(behind) => -behind.duration().as_secs_f64(),
    }
}

/// `now + seconds` (negative: in the past).
pub(super) fn from_now(seconds: i64) -> SystemTime {
    let now = SystemTime::now();
    let by = Duration::from_secs(seconds.unsigned_abs());
    if seconds < 0 {
        now - by
    } else {
        now + by
    }
}
