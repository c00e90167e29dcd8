//! The PostgreSQL [`ChangeStream`]: logical replication from the pipeline's slot, decoded
//! with [`crate::pgoutput`], filtered to committed inserts into the outbox table.
//!
//! [`PgChangeStream::open`] checks the slot over SQL, starts replication and spawns a task
//! that owns the socket. The task assembles transactions (Begin..Commit), turns outbox
//! inserts into [`OutboxEvent`]s and sends [`ChangeItem`]s through a bounded channel: when
//! the core falls behind, the task stops reading the socket (backpressure) but keeps
//! sending standby status updates so the server does not time the session out.
//!
//! Positions: a transaction's position is the end LSN of its commit; progress is a
//! keepalive's WAL end (only between transactions) or the end LSN of a transaction without
//! outbox rows. The server is only ever told the LSN the core passed to
//! [`ChangeStream::confirm`] (or the slot's own `confirmed_flush_lsn` before that).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use outboxd_connector::{
    headers_from_json, ChangeItem, ChangeStream, CommittedTransaction, ConnectorError, Lsn,
    OutboxEvent, Position,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::pgoutput::{self, ColumnValue, PgOutputMessage, Relation};
use crate::replication::{ReplicationConnection, ReplicationMessage, ReplicationStream};
use crate::PostgresConnector;

/// Items buffered between the socket task and the core.
const CHANNEL_CAPACITY: usize = 1024;
/// Progress items are sent at most this often.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// A confirmation reaches the server within this delay (and status updates are
/// coalesced to at most one per this delay).
const CONFIRM_DELAY: Duration = Duration::from_millis(100);

const BYTEA_OID: u32 = 17;

type Item = Result<ChangeItem, ConnectorError>;

/// The change stream of one PostgreSQL pipeline. Dropping it stops replication.
pub struct PgChangeStream {
    rx: mpsc::Receiver<Item>,
    confirmed: watch::Sender<Lsn>,
    task: JoinHandle<()>,
    slot: String,
}

impl fmt::Debug for PgChangeStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgChangeStream")
            .field("slot", &self.slot)
            .field("confirmed", &*self.confirmed.borrow())
            .finish_non_exhaustive()
    }
}

impl PgChangeStream {
    /// Checks the slot, starts logical replication at the slot's confirmed position and
    /// spawns the task that reads it.
    pub(crate) async fn open(connector: &PostgresConnector) -> Result<Self, ConnectorError> {
        let slot = connector.slot();
        let publication = connector.publication();
        let confirmed_flush = check_slot(connector, &slot).await?;
        let decoder = Decoder::new(
            &connector.layout().outbox_table,
            &connector.layout().key_column,
        );

        let conn = ReplicationConnection::connect(connector.config()).await?;
        // 0/0: the server starts at the slot's confirmed_flush_lsn.
        let stream = conn
            .start_logical_replication(&slot, Lsn(0), &publication)
            .await
            .map_err(|e| with_fix(e, &slot))?;
        tracing::info!(%slot, %publication, confirmed_flush = %confirmed_flush, "replication stream open");

        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (confirmed, confirmed_rx) = watch::channel(confirmed_flush);
        let task = Task {
            stream,
            decoder,
            tx,
            reporter: Reporter::new(confirmed_rx, connector.config().status_interval),
            slot: slot.clone(),
            last_position: confirmed_flush,
            pending_progress: None,
            last_progress_at: None,
        };
        let task = tokio::spawn(task.run());
        Ok(Self {
            rx,
            confirmed,
            task,
            slot,
        })
    }

    /// The replication slot this stream reads.
    pub fn slot(&self) -> &str {
        &self.slot
    }
}

impl Drop for PgChangeStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ChangeStream for PgChangeStream {
    async fn next(&mut self) -> Result<ChangeItem, ConnectorError> {
        // mpsc::Receiver::recv is cancel-safe, so this is too.
        match self.rx.recv().await {
            Some(item) => item,
            None => Err(ConnectorError::transient(format!(
                "the replication stream of slot `{}` has ended",
                self.slot
            ))),
        }
    }

    async fn confirm(&mut self, position: &Position) -> Result<(), ConnectorError> {
        let Position::Lsn(lsn) = position else {
            return Err(ConnectorError::definite(format!(
                "position `{position}` is not a PostgreSQL LSN (slot `{}`)",
                self.slot
            )));
        };
        let lsn = *lsn;
        self.confirmed.send_if_modified(|current| {
            let advance = lsn > *current;
            if advance {
                *current = lsn;
            }
            advance
        });
        Ok(())
    }
}

/// Reads the slot from `pg_replication_slots` and returns its `confirmed_flush_lsn`.
async fn check_slot(connector: &PostgresConnector, slot: &str) -> Result<Lsn, ConnectorError> {
    let client = connector.sql_client().await?;
    let context = format!(
        "reading replication slot `{slot}` at {}",
        connector.endpoint()
    );
    // to_jsonb: wal_status exists from PostgreSQL 13 on; this reads it when it is there.
    let row = client
        .query_opt(
            "SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(|e| crate::connect::classify_pg_error(&e, &context))?;
    let Some(row) = row else {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` does not exist: run `outboxd init --config <file>` (or \
             `outboxd recover --config <file>` if it was dropped)"
        )));
    };
    let info: serde_json::Value = row
        .try_get(0)
        .map_err(|e| ConnectorError::definite(context.clone()).with_source(e))?;
    let field = |name: &str| info.get(name).and_then(serde_json::Value::as_str);
    if field("wal_status") == Some("lost") {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` was invalidated (the WAL it needed was removed): run \
             `outboxd recover --config <file>` to recreate it and rescan INIT/FAILED rows"
        )));
    }
    if let Some(plugin) = field("plugin").filter(|p| *p != "pgoutput") {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` uses output plugin `{plugin}`, outboxd needs `pgoutput`: \
             drop it and run `outboxd init --config <file>`"
        )));
    }
    if let Some(db) = field("database").filter(|d| *d != connector.config().database) {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` belongs to database `{db}`, not `{}`",
            connector.config().database
        )));
    }
    if info.get("active").and_then(serde_json::Value::as_bool) == Some(true) {
        let pid = info
            .get("active_pid")
            .map_or_else(|| "?".to_owned(), ToString::to_string);
        return Err(ConnectorError::transient(format!(
            "replication slot `{slot}` is in use by pid {pid}; waiting"
        )));
    }
    let confirmed = match field("confirmed_flush_lsn") {
        Some(text) => text
            .parse()
            .map_err(|e| ConnectorError::definite(context.clone()).with_source(e))?,
        None => Lsn(0),
    };
    tracing::debug!(%slot, %confirmed, "replication slot checked");
    Ok(confirmed)
}

/// Adds the operator's fix to server errors about a missing or unusable slot or
/// publication (they can appear at START_REPLICATION or at the first change decoded).
fn with_fix(e: ConnectorError, slot: &str) -> ConnectorError {
    let m = e.message();
    let fix = if m.contains("SQLSTATE 42704") {
        // undefined_object: the slot or publication was dropped.
        "run `outboxd init --config <file>` to create it (or `outboxd recover --config <file>` \
         if the slot was dropped)"
    } else if m.contains("SQLSTATE 55000") && m.contains("slot") {
        // object_not_in_prerequisite_state: the slot was invalidated (WAL removed).
        "the slot is no longer usable: run `outboxd recover --config <file>` to recreate it and \
         rescan INIT/FAILED rows"
    } else {
        return e;
    };
    tracing::debug!(%slot, error = %e, "replication error needs the operator");
    ConnectorError::definite(format!("{m}: {fix}"))
}

/// Standby status updates: what the core confirmed, when it is due.
struct Reporter {
    confirmed: watch::Receiver<Lsn>,
    interval: Duration,
    last_sent_at: Instant,
    last_sent: Lsn,
    /// Set when a confirmation advanced: send by then.
    due: Option<Instant>,
}

impl Reporter {
    fn new(confirmed: watch::Receiver<Lsn>, interval: Duration) -> Self {
        // A zero interval would spin; the server's own timeout is much longer anyway.
        let interval = interval.max(CONFIRM_DELAY);
        Self {
            confirmed,
            interval,
            last_sent_at: Instant::now(),
            last_sent: Lsn(0),
            due: None,
        }
    }

    fn deadline(&self) -> Instant {
        let periodic = self.last_sent_at + self.interval;
        self.due.map_or(periodic, |due| due.min(periodic))
    }

    /// The core confirmed something; schedule an update (coalesced).
    fn on_confirm(&mut self) {
        if self.due.is_none() && *self.confirmed.borrow() > self.last_sent {
            self.due = Some(Instant::now().max(self.last_sent_at + CONFIRM_DELAY));
        }
    }

    async fn send(
        &mut self,
        stream: &mut ReplicationStream,
        slot: &str,
        reply_requested: bool,
    ) -> Result<(), ConnectorError> {
        let lsn = *self.confirmed.borrow_and_update();
        stream.send_status_update(lsn, reply_requested).await?;
        if lsn != self.last_sent {
            tracing::debug!(%slot, %lsn, "confirmed to the server");
        }
        self.last_sent = lsn;
        self.last_sent_at = Instant::now();
        self.due = None;
        Ok(())
    }
}

/// What ends the task without an error to report.
struct Closed;

/// The task that owns the replication socket.
struct Task {
    stream: ReplicationStream,
    decoder: Decoder,
    tx: mpsc::Sender<Item>,
    reporter: Reporter,
    slot: String,
    /// Position of the last item sent; progress never goes backward.
    last_position: Lsn,
    /// A progress position not sent yet because of the rate limit.
    pending_progress: Option<Lsn>,
    last_progress_at: Option<Instant>,
}

impl Task {
    async fn run(mut self) {
        let error = match self.run_inner().await {
            Ok(Closed) => return,
            Err(e) => e,
        };
        tracing::debug!(slot = %self.slot, error = %error, "replication stream failed");
        // The receiver may be gone already; then nobody needs the error.
        let _ = self.tx.send(Err(error)).await;
    }

    async fn run_inner(&mut self) -> Result<Closed, ConnectorError> {
        loop {
            let progress_at = match (self.pending_progress, self.decoder.in_transaction()) {
                (Some(_), false) => Some(self.progress_allowed_at()),
                _ => None,
            };
            let status_at = self.reporter.deadline();
            tokio::select! {
                message = self.stream.recv() => {
                    let message = message.map_err(|e| with_fix(e, &self.slot))?;
                    if let Err(Closed) = self.handle(message).await? {
                        return Ok(Closed);
                    }
                }
                changed = self.reporter.confirmed.changed() => {
                    if changed.is_err() {
                        return Ok(Closed); // PgChangeStream dropped
                    }
                    self.reporter.on_confirm();
                }
                () = tokio::time::sleep_until(status_at) => {
                    self.reporter.send(&mut self.stream, &self.slot, false).await?;
                }
                () = sleep_until_opt(progress_at) => {
                    if let Some(lsn) = self.pending_progress.take() {
                        if self.emit(ChangeItem::Progress(Position::Lsn(lsn))).await.is_err() {
                            return Ok(Closed);
                        }
                    }
                }
            }
        }
    }

    /// Handles one replication message; `Ok(Err(Closed))` when the receiver is gone.
    async fn handle(
        &mut self,
        message: ReplicationMessage,
    ) -> Result<Result<(), Closed>, ConnectorError> {
        match message {
            ReplicationMessage::Keepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                if reply_requested {
                    self.reporter
                        .send(&mut self.stream, &self.slot, true)
                        .await?;
                }
                if !self.decoder.in_transaction() {
                    return Ok(self.progress(wal_end).await);
                }
                Ok(Ok(()))
            }
            ReplicationMessage::XLogData { data, .. } => match self.decoder.handle(&data)? {
                None => Ok(Ok(())),
                Some(Decoded::Empty(end_lsn)) => Ok(self.progress(end_lsn).await),
                Some(Decoded::Transaction(txn)) => {
                    let Position::Lsn(lsn) = txn.commit_position else {
                        return Ok(Ok(()));
                    };
                    tracing::debug!(slot = %self.slot, %lsn, events = txn.events.len(), "outbox transaction");
                    self.last_position = self.last_position.max(lsn);
                    if self.pending_progress.is_some_and(|p| p <= lsn) {
                        self.pending_progress = None;
                    }
                    Ok(self.emit(ChangeItem::Transaction(txn)).await)
                }
            },
        }
    }

    /// Records progress to `lsn`; sends it now or when the rate limit allows.
    async fn progress(&mut self, lsn: Lsn) -> Result<(), Closed> {
        if lsn <= self.last_position {
            return Ok(());
        }
        self.last_position = lsn;
        self.pending_progress = Some(lsn);
        if self.progress_allowed_at() <= Instant::now() {
            self.pending_progress = None;
            return self.emit(ChangeItem::Progress(Position::Lsn(lsn))).await;
        }
        Ok(())
    }

    fn progress_allowed_at(&self) -> Instant {
        self.last_progress_at
            .map_or_else(Instant::now, |at| at + PROGRESS_INTERVAL)
    }

    /// Sends `item` to the core, waiting for room in the channel. While waiting, status
    /// updates keep going out, so the server does not drop a session that is only slow.
    async fn emit(&mut self, item: ChangeItem) -> Result<(), Closed> {
        if matches!(item, ChangeItem::Progress(_)) {
            self.last_progress_at = Some(Instant::now());
        }
        loop {
            let status_at = self.reporter.deadline();
            tokio::select! {
                permit = self.tx.reserve() => {
                    let permit = permit.map_err(|_| Closed)?;
                    permit.send(Ok(item));
                    return Ok(());
                }
                changed = self.reporter.confirmed.changed() => {
                    changed.map_err(|_| Closed)?;
                    self.reporter.on_confirm();
                }
                () = tokio::time::sleep_until(status_at) => {
                    if let Err(e) = self.reporter.send(&mut self.stream, &self.slot, false).await {
                        // Report it in order, after the items before it.
                        let _ = self.tx.send(Ok(item)).await;
                        let _ = self.tx.send(Err(e)).await;
                        return Err(Closed);
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The result of one pgoutput message, when there is something to say.
#[derive(Debug)]
enum Decoded {
    /// A committed transaction with outbox rows.
    Transaction(CommittedTransaction),
    /// A committed transaction without outbox rows, ending at this LSN.
    Empty(Lsn),
}

/// Where each outbox column is in the relation's tuples.
#[derive(Clone, Debug)]
struct OutboxColumns {
    id: usize,
    message_id: usize,
    message_type: usize,
    biz_key: usize,
    key: (usize, bool),
    topic: Option<usize>,
    payload: (usize, bool),
    headers: Option<usize>,
    created_at: usize,
    status: usize,
    retry_count: usize,
    max_retry_count: usize,
}

impl OutboxColumns {
    fn new(rel: &Relation, table: &str, key_column: &str) -> Result<Self, ConnectorError> {
        let find = |name: &str| rel.columns.iter().position(|c| c.name == name);
        let required = |name: &str| {
            find(name).ok_or_else(|| {
                ConnectorError::definite(format!(
                    "outbox table `{table}` has no column `{name}` (see schemas/postgres/outbox.sql)"
                ))
            })
        };
        let is_bytea = |i: usize| rel.columns.get(i).is_some_and(|c| c.type_oid == BYTEA_OID);
        let key = required(key_column)?;
        let payload = required("payload")?;
        Ok(Self {
            id: required("id")?,
            message_id: required("message_id")?,
            message_type: required("message_type")?,
            biz_key: required("biz_key")?,
            key: (key, is_bytea(key)),
            topic: find("topic"),
            payload: (payload, is_bytea(payload)),
            headers: find("headers"),
            created_at: required("created_at")?,
            status: required("status")?,
            retry_count: required("retry_count")?,
            max_retry_count: required("max_retry_count")?,
        })
    }
}

/// Assembles committed outbox transactions from pgoutput messages. Pure state machine
/// (no I/O), so it is tested on captured bytes.
struct Decoder {
    schema: String,
    table: String,
    key_column: String,
    /// Relation OID → its outbox columns, or `None` for a table that is not the outbox.
    relations: HashMap<u32, Option<OutboxColumns>>,
    txn: Option<OpenTransaction>,
}

struct OpenTransaction {
    events: Vec<OutboxEvent>,
}

impl Decoder {
    fn new(outbox_table: &str, key_column: &str) -> Self {
        // As SQL reads names: quoted ones keep their case, bare ones fold to lower case.
        let unquote = |s: &str| {
            let s = s.trim();
            match s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\"\"", "\""),
                None => s.to_lowercase(),
            }
        };
        let (schema, table) = match outbox_table.split_once('.') {
            Some((schema, table)) => (unquote(schema), unquote(table)),
            None => ("public".to_owned(), unquote(outbox_table)),
        };
        Self {
            schema,
            table,
            key_column: key_column.to_owned(),
            relations: HashMap::new(),
            txn: None,
        }
    }

    fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    fn table_name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    fn handle(&mut self, data: &Bytes) -> Result<Option<Decoded>, ConnectorError> {
        // Inserts into other tables are dropped before decoding their tuples.
        if let [b'I', a, b, c, d, ..] = data[..] {
            if let Some(None) = self.relations.get(&u32::from_be_bytes([a, b, c, d])) {
                return Ok(None);
            }
        }
        let message = pgoutput::decode(data).map_err(|e| {
            ConnectorError::definite(format!(
                "cannot decode the replication stream of outbox `{}`",
                self.table_name()
            ))
            .with_source(e)
        })?;
        match message {
            PgOutputMessage::Begin(_) => {
                self.txn = Some(OpenTransaction { events: Vec::new() });
            }
            PgOutputMessage::Relation(rel) => {
                let columns = if rel.namespace == self.schema && rel.name == self.table {
                    Some(OutboxColumns::new(
                        &rel,
                        &self.table_name(),
                        &self.key_column,
                    )?)
                } else {
                    None
                };
                self.relations.insert(rel.oid, columns);
            }
            PgOutputMessage::Insert(insert) => {
                let columns = match self.relations.get(&insert.relation_oid) {
                    Some(Some(columns)) => columns,
                    Some(None) => return Ok(None),
                    None => {
                        return Err(ConnectorError::definite(format!(
                            "replication stream: insert into relation OID {} before its \
                             Relation message",
                            insert.relation_oid
                        )))
                    }
                };
                let event = to_event(&insert.tuple, columns, &self.table_name())?;
                let txn = self.txn.as_mut().ok_or_else(|| {
                    ConnectorError::definite("replication stream: insert outside a transaction")
                })?;
                if let Some(event) = event {
                    txn.events.push(event);
                }
            }
            PgOutputMessage::Commit(commit) => {
                let txn = self.txn.take().ok_or_else(|| {
                    ConnectorError::definite("replication stream: commit without begin")
                })?;
                if txn.events.is_empty() {
                    return Ok(Some(Decoded::Empty(commit.end_lsn)));
                }
                let commit_time = pgoutput::pg_timestamp(commit.commit_ts);
                let mut events = txn.events;
                for event in &mut events {
                    event.commit_time = commit_time;
                }
                return Ok(Some(Decoded::Transaction(CommittedTransaction {
                    commit_position: Position::Lsn(commit.end_lsn),
                    commit_time,
                    events,
                })));
            }
            PgOutputMessage::Skipped(_) => {}
        }
        Ok(None)
    }
}

/// One outbox insert as an event; `None` when its status is not INIT (inserted already
/// handled, nothing to publish).
fn to_event(
    tuple: &[ColumnValue],
    c: &OutboxColumns,
    table: &str,
) -> Result<Option<OutboxEvent>, ConnectorError> {
    let raw = |i: usize| -> Result<Option<&Bytes>, ConnectorError> {
        match tuple.get(i) {
            Some(ColumnValue::Text(b)) => Ok(Some(b)),
            Some(ColumnValue::Null) => Ok(None),
            Some(other) => Err(ConnectorError::definite(format!(
                "outbox `{table}`: unexpected column value {other:?} in an insert"
            ))),
            None => Err(ConnectorError::definite(format!(
                "outbox `{table}`: insert has {} columns, its relation more",
                tuple.len()
            ))),
        }
    };
    let text = |i: usize, name: &str| -> Result<Option<String>, ConnectorError> {
        raw(i)?
            .map(|b| {
                String::from_utf8(b.to_vec()).map_err(|_| {
                    ConnectorError::definite(format!(
                        "outbox `{table}`: column `{name}` is not UTF-8"
                    ))
                })
            })
            .transpose()
    };
    let not_null = |i: usize, name: &str| -> Result<String, ConnectorError> {
        text(i, name)?.ok_or_else(|| {
            ConnectorError::definite(format!(
                "outbox `{table}`: column `{name}` is NULL in an insert"
            ))
        })
    };
    let number = |i: usize, name: &str| -> Result<i64, ConnectorError> {
        let value = not_null(i, name)?;
        value.parse().map_err(|_| {
            ConnectorError::definite(format!(
                "outbox `{table}`: column `{name}` = `{value}` is not an integer"
            ))
        })
    };
    let int = |i: usize, name: &str| -> Result<i32, ConnectorError> {
        i32::try_from(number(i, name)?).map_err(|_| {
            ConnectorError::definite(format!("outbox `{table}`: column `{name}` is out of range"))
        })
    };
    let bytes = |(i, bytea): (usize, bool), name: &str| -> Result<Bytes, ConnectorError> {
        match raw(i)? {
            None => Ok(Bytes::new()),
            Some(b) if bytea => decode_bytea_hex(b).ok_or_else(|| {
                ConnectorError::definite(format!(
                    "outbox `{table}`: column `{name}` is not bytea in hex form"
                ))
            }),
            Some(b) => Ok(b.clone()),
        }
    };

    if text(c.status, "status")?.as_deref() != Some("INIT") {
        return Ok(None);
    }
    let headers = c.headers.map(|i| text(i, "headers")).transpose()?.flatten();
    let headers = row_headers(headers.as_deref(), table);
    Ok(Some(OutboxEvent {
        id: number(c.id, "id")?,
        message_id: not_null(c.message_id, "message_id")?,
        message_type: not_null(c.message_type, "message_type")?,
        biz_key: not_null(c.biz_key, "biz_key")?,
        key: bytes(c.key, "key")?,
        topic: c.topic.map(|i| text(i, "topic")).transpose()?.flatten(),
        payload: bytes(c.payload, "payload")?,
        headers,
        created_at: iso8601(&not_null(c.created_at, "created_at")?),
        retry_count: int(c.retry_count, "retry_count")?,
        max_retry_count: int(c.max_retry_count, "max_retry_count")?,
        commit_time: None,
    }))
}

/// The row's `headers` column (JSON text) as record headers; a value that is not a JSON
/// object is logged and ignored. Shared with the store's claims, so a claimed row is
/// published with the headers the stream would give it.
pub(crate) fn row_headers(json: Option<&str>, table: &str) -> Vec<(String, Bytes)> {
    match json {
        Some(json) => headers_from_json(json).unwrap_or_else(|| {
            tracing::warn!(
                table,
                "outbox `headers` is not a JSON object; publishing without headers"
            );
            Vec::new()
        }),
        None => Vec::new(),
    }
}

/// `2026-05-09 07:30:00.123+00` (DateStyle ISO) → `2026-05-09T07:30:00.123+00`.
pub(crate) fn iso8601(text: &str) -> String {
    match text.split_once(' ') {
        Some((date, time)) if date.len() == 10 => format!("{date}T{time}"),
        _ => text.to_owned(),
    }
}

/// bytea's text output in hex form: `\x` then two hex digits a byte.
fn decode_bytea_hex(text: &[u8]) -> Option<Bytes> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    hex.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()
        .map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(text: &str) -> Vec<Bytes> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let hex = l.split_whitespace().last().unwrap_or_default();
                decode_bytea_hex(format!("\\x{hex}").as_bytes()).unwrap()
            })
            .collect()
    }

    #[test]
    fn assembles_a_captured_transaction() {
        let mut decoder = Decoder::new("public.fixture_outbox", "biz_key");
        let mut out = Vec::new();
        for msg in fixture(include_str!("testdata/pgoutput_insert_tx.hex")) {
            if let Some(d) = decoder.handle(&msg).unwrap() {
                out.push(d);
            }
        }
        assert!(!decoder.in_transaction());
        let [Decoded::Transaction(txn)] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(txn.commit_time.is_some());
        assert_eq!(txn.events.len(), 2);
        let e = &txn.events[0];
        assert_eq!(e.message_id, "m-1");
        assert_eq!(e.message_type, "order.created");
        assert_eq!(e.biz_key, "order-42");
        assert_eq!(&e.key[..], b"order-42");
        assert_eq!(e.topic, None);
        assert_eq!(&e.payload[..], br#"{"total": 12.5}"#);
        assert_eq!(
            e.headers,
            vec![("trace".to_owned(), Bytes::from_static(b"abc"))]
        );
        assert_eq!(e.retry_count, 0);
        assert_eq!(e.max_retry_count, 10);
        assert!(e.created_at.contains('T'), "{}", e.created_at);
        assert_eq!(e.commit_time, txn.commit_time);
        assert_eq!(txn.events[1].topic.as_deref(), Some("orders.special"));
        assert!(txn.events[1].id > e.id);

        // Another table name: the same bytes yield only an empty commit.
        let mut other = Decoder::new("outbox", "biz_key");
        let out: Vec<_> = fixture(include_str!("testdata/pgoutput_insert_tx.hex"))
            .iter()
            .filter_map(|m| other.handle(m).unwrap())
            .collect();
        assert!(matches!(out[..], [Decoded::Empty(_)]), "{out:?}");
    }

    #[test]
    fn missing_column_names_column_and_table() {
        let mut decoder = Decoder::new("public.fixture_outbox", "no_such_column");
        let err = fixture(include_str!("testdata/pgoutput_insert_tx.hex"))
            .iter()
            .map(|m| decoder.handle(m))
            .find_map(Result::err)
            .unwrap();
        assert!(!err.is_transient());
        assert!(err.message().contains("`no_such_column`"), "{err}");
        assert!(err.message().contains("`public.fixture_outbox`"), "{err}");
    }

    #[test]
    fn outbox_names_fold_like_sql() {
        let d = Decoder::new("Outbox", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("public", "outbox"));
        let d = Decoder::new("\"App\".\"Out\"\"box\"", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("App", "Out\"box"));
        let d = Decoder::new("app.outbox", "biz_key");
        assert_eq!((d.schema.as_str(), d.table.as_str()), ("app", "outbox"));
    }

    #[test]
    fn bytea_hex() {
        assert_eq!(
            decode_bytea_hex(b"\\x00ff10").unwrap(),
            Bytes::from_static(&[0, 255, 16])
        );
        assert_eq!(decode_bytea_hex(b"\\x").unwrap(), Bytes::new());
        assert!(decode_bytea_hex(b"\\x0").is_none());
        assert!(decode_bytea_hex(b"\\xzz").is_none());
        assert!(decode_bytea_hex(b"00").is_none());
    }

    #[test]
    fn iso8601_form() {
        assert_eq!(
            iso8601("2026-05-09 07:30:00.123+00"),
            "2026-05-09T07:30:00.123+00"
        );
        assert_eq!(iso8601("infinity"), "infinity");
    }
}
