//! The MySQL/MariaDB [`ChangeStream`]: the binlog read as a replica, decoded with
//! `crate::log::decode`, filtered to committed inserts into the outbox table.
//!
//! `MysqlChangeStream::open` takes the pipeline's lock (`GET_LOCK('outboxd:<pipeline>')`
//! on a connection held for the life of the stream), reads the checkpoint row, checks that
//! it was written on this server and that the server still has its binlog (with the same
//! GTIDs at that coordinate), and asks for the binlog from there. A spawned task owns
//! both connections and feeds a bounded channel, so [`ChangeStream::next`] is cancel-safe;
//! when the core falls behind the task stops reading (backpressure).
//!
//! On MySQL the checkpoint row is the authority (there is no slot): the core writes it with
//! every status write-back, and [`ChangeStream::confirm`] persists positions the core only
//! confirms (progress past other tables' transactions, rotations) at most every
//! [`PERSIST_INTERVAL`], so an idle outbox never leaves the checkpoint in a binlog file the
//! server may purge. The checkpoint never moves backward.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn};
use outboxd_connector::{ChangeItem, ChangeStream, ConnectorError, ErrorReason, Position};
use outboxd_connector_kit::tail::{self, sleep_until_opt, Closed, Confirmations, Inlet, Outlet};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{classify, execute, int, query, query_first, text_or_empty};
use crate::log::decode::{Decoded, Decoder};
use crate::log::gtid::GtidState;
use crate::log::identity::ServerIdentity;
use crate::log::position::BinlogPosition;
use crate::log::server::{self, ServerInfo};
use crate::schema::{qualified, sql_string, table_ident};
use crate::store::{checkpoint_sql, load_checkpoint};
use crate::MysqlConnector;

/// A confirmed position is written to the checkpoint row at most this often.
pub const PERSIST_INTERVAL: Duration = Duration::from_secs(5);
/// The lock connection is checked this often: a killed or broken lock connection (the
/// lock is free, another outboxd may take over) ends the stream within this bound.
const PING_INTERVAL: Duration = Duration::from_secs(2);
/// `wait_timeout` (and the net timeouts) of the lock connection, in seconds: after a crash
/// of outboxd's host the server drops the connection, and so frees the lock, this long
/// after the last ping, instead of after the server's `wait_timeout` (hours by default).
const LOCK_SESSION_TIMEOUT_S: u64 = 20;
/// A ping unanswered this long counts as a broken lock connection: by then the server
/// may have dropped it (`LOCK_SESSION_TIMEOUT_S`) and another outboxd taken over.
const PING_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(PING_INTERVAL.as_secs() * 5 <= LOCK_SESSION_TIMEOUT_S);
const _: () = assert!(PING_TIMEOUT.as_secs() < LOCK_SESSION_TIMEOUT_S);
/// MariaDB replica capability: GTID events as they are (MARIA_SLAVE_CAPABILITY_GTID).
const MARIADB_SLAVE_CAPABILITY_GTID: u32 = 4;

/// The change stream of one MySQL pipeline. Dropping it stops reading and releases the
/// pipeline's lock.
pub struct MysqlChangeStream {
    inlet: Inlet,
    confirmed: watch::Sender<Option<BinlogPosition>>,
    pipeline: String,
    start: BinlogPosition,
}

impl fmt::Debug for MysqlChangeStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlChangeStream")
            .field("pipeline", &self.pipeline)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl MysqlChangeStream {
    /// Takes the pipeline lock, checks the checkpoint against the server and starts the
    /// binlog stream there.
    pub(crate) async fn open(connector: &MysqlConnector) -> Result<Self, ConnectorError> {
        let pipeline = connector.pipeline().to_owned();
        let mut lock = connector.sql_conn().await?;
        acquire_lock(&mut lock, connector).await?;

        let server = server::info(&mut lock).await?;
        check_row_format(&mut lock, connector).await?;
        let checkpoint = match load_checkpoint(&mut lock, connector).await? {
            Some(checkpoint) => checkpoint,
            None => {
                return Err(ConnectorError::definite(format!(
                    "pipeline `{pipeline}` has no checkpoint in {}: run `outboxd init --config \
                     <file>` (it records the position to start from)",
                    connector.layout().checkpoint_table
                )))
            }
        };
        let identity = ServerIdentity::of(&mut lock, &server).await?;
        server::verify_checkpoint(&mut lock, &server, &identity, &checkpoint, &pipeline).await?;
        let start = checkpoint.position;
        let gtid = initial_gtid(&mut lock, &server, &start).await?;

        let (db, table) = connector.outbox_ident();
        let (checkpoint_db, checkpoint_table) = table_ident(
            &connector.layout().checkpoint_table,
            &connector.config().database,
        );
        let decoder = Decoder::new(&db, &table, connector.layout(), &start, gtid)
            .with_outboxes(connector.outbox_idents())
            .with_checkpoint_table(&checkpoint_db, &checkpoint_table);
        let binlog = start_binlog(connector, &server, &start).await?;
        tracing::info!(
            %pipeline,
            server = %server.version,
            position = %start,
            "binlog stream open"
        );

        let (outlet, mut inlet) = tail::channel(start.clone(), |b| b.position());
        let (confirmed, confirmed_rx) = watch::channel(None);
        let heartbeat = connector.config().heartbeat;
        let task = Task {
            binlog,
            decoder,
            outlet,
            checkpoint: Checkpoint {
                lock,
                confirmed: confirmed_rx,
                table: qualified(&connector.layout().checkpoint_table),
                pipeline: pipeline.clone(),
                server: identity,
                persisted: start.clone(),
                last_persist_at: Instant::now(),
                persist_due: None,
                last_ping: Instant::now(),
            },
            pipeline: pipeline.clone(),
            idle_timeout: heartbeat * 3 + Duration::from_secs(5),
            last_heard: Instant::now(),
        };
        inlet.spawn(task.run());
        Ok(Self {
            inlet,
            confirmed,
            pipeline,
            start,
        })
    }

    /// Where this stream started (the checkpoint it resumed from).
    pub fn start(&self) -> &BinlogPosition {
        &self.start
    }
}

impl ChangeStream for MysqlChangeStream {
    async fn next(&mut self) -> Result<ChangeItem, ConnectorError> {
        let pipeline = &self.pipeline;
        self.inlet
            .next(|| format!("the binlog stream of pipeline `{pipeline}` has ended"))
            .await
    }

    async fn confirm(&mut self, position: &Position) -> Result<(), ConnectorError> {
        let position = BinlogPosition::from_position(position).map_err(|e| {
            let message = format!("{} (pipeline `{}`)", e.message(), self.pipeline);
            e.with_message(message)
        })?;
        tail::advance(&self.confirmed, Some(position));
        Ok(())
    }
}

/// `GET_LOCK('outboxd:<pipeline>', 0)` on `conn`: a transient error names the holder.
async fn acquire_lock(conn: &mut Conn, connector: &MysqlConnector) -> Result<(), ConnectorError> {
    let name = sql_string(&connector.lock_name());
    let pipeline = connector.pipeline();
    let context = format!("taking the lock of pipeline `{pipeline}`");
    let row = query_first(conn, &format!("SELECT GET_LOCK({name}, 0)"), &context).await?;
    if row.as_ref().map(|r| int(r, 0)).transpose()?.flatten() == Some(1) {
        execute(
            conn,
            &format!(
                "SET SESSION wait_timeout = {LOCK_SESSION_TIMEOUT_S}, \
                 net_read_timeout = {LOCK_SESSION_TIMEOUT_S}, \
                 net_write_timeout = {LOCK_SESSION_TIMEOUT_S}"
            ),
            &context,
        )
        .await?;
        // From now on the stores of this connector write back only while this
        // connection holds the lock (see `store::write_back::write_back_texts`).
        connector.lock_conn.store(conn.id(), Ordering::SeqCst);
        return Ok(());
    }
    let holder = query_first(conn, &format!("SELECT IS_USED_LOCK({name})"), &context)
        .await?
        .map(|r| int(&r, 0))
        .transpose()?
        .flatten()
        .map_or_else(|| "?".to_owned(), |id| id.to_string());
    Err(ConnectorError::transient(format!(
        "pipeline `{pipeline}` is held by another outboxd (connection id {holder}); waiting"
    ))
    .with_reason(ErrorReason::SlotInUse))
}

/// Row events are all outboxd can read: refuse other formats before streaming.
async fn check_row_format(
    conn: &mut Conn,
    connector: &MysqlConnector,
) -> Result<(), ConnectorError> {
    let format = server::variable(conn, "binlog_format")
        .await?
        .unwrap_or_default();
    if !format.eq_ignore_ascii_case("ROW") {
        return Err(ConnectorError::definite(format!(
            "binlog_format is `{format}` on {}: outboxd reads row events only; SET GLOBAL \
             binlog_format = 'ROW' (and in the server's configuration), then run `outboxd \
             recover --config <file>` for rows written meanwhile",
            connector.endpoint()
        )));
    }
    Ok(())
}

/// The GTID state at `start`: the checkpoint's, or on MariaDB the server's
/// `BINLOG_GTID_POS` of that coordinate.
async fn initial_gtid(
    conn: &mut Conn,
    server: &ServerInfo,
    start: &BinlogPosition,
) -> Result<Option<GtidState>, ConnectorError> {
    if let Some(state) = start
        .gtid_set
        .as_deref()
        .and_then(|g| GtidState::parse(g, server.mariadb))
    {
        return Ok(Some(state));
    }
    if server.mariadb {
        let pos = server::mariadb_gtid_at(conn, &start.file, start.offset).await?;
        return Ok(pos.and_then(|p| GtidState::parse(&p, true)));
    }
    Ok(None)
}

/// Registers as a replica and asks for the binlog from `start`.
async fn start_binlog(
    connector: &MysqlConnector,
    server: &ServerInfo,
    start: &BinlogPosition,
) -> Result<BinlogStream, ConnectorError> {
    let mut conn = connector.sql_conn().await?;
    let heartbeat_ns = u64::try_from(connector.config().heartbeat.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1_000_000);
    let mut setup = format!("SET @master_heartbeat_period = {heartbeat_ns}");
    if server.mariadb {
        setup.push_str(&format!(
            "; SET @mariadb_slave_capability = {MARIADB_SLAVE_CAPABILITY_GTID}"
        ));
    }
    execute(&mut conn, &setup, "preparing the binlog connection").await?;
    let request = BinlogStreamRequest::new(connector.config().server_id)
        .with_filename(start.file.as_bytes())
        .with_pos(start.offset);
    conn.get_binlog_stream(request)
        .await
        .map_err(|e| stream_error(&e, start, connector.pipeline()))
}

/// Classifies an error of the binlog connection; 1236 (the server cannot send the binlog
/// asked for) is definite and names the fix.
/// The next item of the binlog stream; `Err(())` when reading it panicked. `mysql_common`
/// trusts an event's sizes: it allocates the size its header declares and panics when the
/// packet holds fewer bytes, or when the body is too short for its CRC32 (the
/// `binlog_decoder` fuzz target found both; see `log::decode::read_event`). Bytes from
/// the network must not take the task down.
async fn next_event(
    binlog: &mut BinlogStream,
) -> Result<Option<Result<mysql_async::binlog::events::Event, mysql_async::Error>>, ()> {
    futures_util::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| binlog.poll_next_unpin(cx)))
        {
            Ok(poll) => poll.map(Ok),
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    })
    .await
}

/// The error for an event the binlog stream could not even read.
fn malformed_event(at: &BinlogPosition, pipeline: &str) -> ConnectorError {
    ConnectorError::definite(format!(
        "pipeline `{pipeline}`: the server sent a malformed binlog event after {at} (shorter \
         than its header or checksum says); check the binlog on the server \
         (mysqlbinlog) and connect with sslmode=verify-full, so nothing between can alter it"
    ))
}

fn stream_error(e: &mysql_async::Error, at: &BinlogPosition, pipeline: &str) -> ConnectorError {
    if let mysql_async::Error::Server(server) = e {
        if server.code == 1236 {
            let m = &server.message;
            if m.contains("same server") || m.contains("server_id") || m.contains("server_uuid") {
                return ConnectorError::definite(format!(
                    "the server dropped the binlog stream of pipeline `{pipeline}`: {m}; give \
                     each outboxd pipeline and each replica its own `source.server_id`"
                ));
            }
            return ConnectorError::definite(format!(
                "the server cannot send the binlog of pipeline `{pipeline}` after {}:{}: {m}; \
                 if that binlog was purged, run `outboxd recover --config <file>` to rescan \
                 INIT rows",
                at.file, at.offset
            ))
            .with_reason(ErrorReason::PositionLost);
        }
    }
    // classify() puts the server's message into ours.
    classify(e, &format!("reading the binlog of pipeline `{pipeline}`"))
}

/// How long a stream waits for an outbox table that information_schema does not list
/// before it gives up (with a transient error: the pipeline retries).
const TABLE_AWAY_WAIT: Duration = Duration::from_secs(30);

/// The outbox's columns, once information_schema lists the table.
///
/// The binlog holds rows of the table, so it existed when they were written; listing
/// none of its columns now means it is away for a moment: an online schema change (gh-ost,
/// pt-online-schema-change) swaps tables by renaming them, and MariaDB's own `ALTER TABLE`
/// renames the rebuilt copy into place. Taken as it is, an empty list would read as a
/// table altered out of recognition (a definite error that stops the pipeline).
async fn load_listed_columns(
    conn: &mut Conn,
    db: &str,
    table: &str,
) -> Result<Vec<(String, String)>, ConnectorError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let columns = load_columns(conn, db, table).await?;
        if !columns.is_empty() {
            return Ok(columns);
        }
        let waited = started.elapsed();
        if waited >= TABLE_AWAY_WAIT {
            return Err(ConnectorError::transient(format!(
                "the outbox table {db}.{table} has rows in the binlog, but information_schema                  has listed none of its columns for {}s: was it renamed or dropped? outboxd                  reads its rows once the table is back under this name",
                waited.as_secs()
            )));
        }
        if pause == Duration::from_millis(20) {
            tracing::warn!(
                table = %format!("{db}.{table}"),
                "the outbox table is not in information_schema (renamed away by a schema \
                 change?); its rows in the binlog wait until it is back"
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// The outbox's `(COLUMN_NAME, DATA_TYPE)` in ordinal order.
async fn load_columns(
    conn: &mut Conn,
    db: &str,
    table: &str,
) -> Result<Vec<(String, String)>, ConnectorError> {
    let sql = format!(
        "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {} \
         AND TABLE_NAME = {} ORDER BY ORDINAL_POSITION",
        sql_string(db),
        sql_string(table)
    );
    let rows = query(conn, &sql, &format!("reading the columns of {db}.{table}")).await?;
    rows.iter()
        .map(|r| Ok((text_or_empty(r, 0)?, text_or_empty(r, 1)?)))
        .collect()
}

/// The checkpoint row as this stream keeps it: the connection that holds the pipeline's
/// lock, the positions the core confirmed, and their rate-limited persistence.
struct Checkpoint {
    lock: Conn,
    confirmed: watch::Receiver<Option<BinlogPosition>>,
    table: String,
    pipeline: String,
    /// The server the stream reads, stored with the position.
    server: ServerIdentity,
    /// The checkpoint row's position as far as this stream knows.
    persisted: BinlogPosition,
    last_persist_at: Instant,
    persist_due: Option<Instant>,
    last_ping: Instant,
}

impl Checkpoint {
    /// Writes the confirmed position to the checkpoint row (which never moves backward).
    async fn persist(&mut self) -> Result<(), ConnectorError> {
        self.persist_due = None;
        let Some(position) = self.confirmed.borrow().clone() else {
            return Ok(());
        };
        if position <= self.persisted {
            return Ok(());
        }
        let sql = checkpoint_sql(&self.table, &self.pipeline, &position, &self.server);
        execute(
            &mut self.lock,
            &sql,
            &format!("writing the checkpoint of pipeline `{}`", self.pipeline),
        )
        .await?;
        tracing::debug!(pipeline = %self.pipeline, %position, "checkpoint persisted");
        self.persisted = position;
        self.last_persist_at = Instant::now();
        self.last_ping = Instant::now();
        Ok(())
    }
}

impl Checkpoint {
    /// Checks the lock connection: an error (it was killed, the server went away) means
    /// the lock may be someone else's now.
    async fn ping(&mut self) -> Result<(), ConnectorError> {
        self.last_ping = Instant::now();
        let context = format!(
            "checking the connection that holds the lock of pipeline `{}` (the lock is lost \
             with it; this outboxd stops reading and waits to take it again)",
            self.pipeline
        );
        // A partition leaves the ping unanswered rather than failed.
        match tokio::time::timeout(PING_TIMEOUT, execute(&mut self.lock, "DO 1", &context)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectorError::transient(format!(
                "{context}: no answer within {PING_TIMEOUT:?}"
            ))),
        }
    }
}

impl Confirmations for Checkpoint {
    async fn changed(&mut self) -> Result<(), Closed> {
        self.confirmed.changed().await.map_err(|_| Closed)
    }

    /// The core confirmed something: schedule a checkpoint write (rate-limited).
    fn on_confirm(&mut self) {
        let advanced = self
            .confirmed
            .borrow_and_update()
            .as_ref()
            .is_some_and(|p| *p > self.persisted);
        if advanced && self.persist_due.is_none() {
            self.persist_due = Some(Instant::now().max(self.last_persist_at + PERSIST_INTERVAL));
        }
    }

    /// The next checkpoint write or lock ping, whichever is first: both also run while
    /// the stream waits for the core, so a slow core never lets the lock connection idle
    /// into its `wait_timeout`.
    fn due(&self) -> Option<Instant> {
        let ping = self.last_ping + PING_INTERVAL;
        Some(self.persist_due.map_or(ping, |p| p.min(ping)))
    }

    async fn on_due(&mut self) -> Result<(), ConnectorError> {
        let now = Instant::now();
        if self.persist_due.is_some_and(|p| p <= now) {
            self.persist().await?;
        }
        if self.last_ping + PING_INTERVAL <= now {
            self.ping().await?;
        }
        Ok(())
    }
}

/// The task that owns the binlog and lock connections.
struct Task {
    binlog: BinlogStream,
    decoder: Decoder,
    outlet: Outlet<BinlogPosition>,
    checkpoint: Checkpoint,
    pipeline: String,
    idle_timeout: Duration,
    last_heard: Instant,
}

impl Task {
    async fn run(mut self) {
        let error = match self.run_inner().await {
            Ok(Closed) => return,
            Err(e) => e,
        };
        tracing::debug!(pipeline = %self.pipeline, error = %error, "binlog stream failed");
        self.outlet.fail(error).await;
    }

    async fn run_inner(&mut self) -> Result<Closed, ConnectorError> {
        loop {
            let progress_at = self.outlet.progress_due(self.decoder.in_transaction());
            let silent_at = self.last_heard + self.idle_timeout;
            let due_at = self.checkpoint.due();
            tokio::select! {
                event = next_event(&mut self.binlog) => {
                    let event = match event.map_err(|()| {
                        malformed_event(&self.decoder.position(), &self.pipeline)
                    })? {
                        Some(Ok(event)) => event,
                        Some(Err(e)) => {
                            return Err(stream_error(&e, &self.decoder.position(), &self.pipeline));
                        }
                        None => {
                            return Err(ConnectorError::transient(format!(
                                "the server ended the binlog stream of pipeline `{}`",
                                self.pipeline
                            )));
                        }
                    };
                    self.last_heard = Instant::now();
                    if let Err(Closed) = self.on_event(&event).await? {
                        return Ok(Closed);
                    }
                    // Time spent waiting for the core is not the server's silence.
                    self.last_heard = Instant::now();
                }
                changed = self.checkpoint.changed() => {
                    if changed.is_err() {
                        return Ok(Closed);
                    }
                    self.checkpoint.on_confirm();
                }
                () = sleep_until_opt(due_at) => self.checkpoint.on_due().await?,
                () = sleep_until_opt(progress_at) => {
                    if let Some(item) = self.outlet.take_progress() {
                        if self.outlet.emit(item, &mut self.checkpoint).await.is_err() {
                            return Ok(Closed);
                        }
                    }
                }
                () = tokio::time::sleep_until(silent_at) => {
                    return Err(ConnectorError::transient(format!(
                        "no binlog event or heartbeat from the server for {:?} (pipeline `{}`); \
                         reconnecting",
                        self.idle_timeout, self.pipeline
                    )));
                }
            }
        }
    }

    /// Feeds one event to the decoder; `Ok(Err(Closed))` when the receiver is gone.
    async fn on_event(
        &mut self,
        event: &mysql_async::binlog::events::Event,
    ) -> Result<Result<(), Closed>, ConnectorError> {
        loop {
            match self.decoder.handle(event)? {
                Decoded::NeedColumns => {
                    let (db, table) = self.decoder.outbox();
                    let (db, table) = (db.to_owned(), table.to_owned());
                    let names = load_listed_columns(&mut self.checkpoint.lock, &db, &table).await?;
                    tracing::debug!(outbox = %self.decoder.table_name(), columns = names.len(), "outbox columns read from information_schema");
                    self.decoder.provide_columns(names);
                }
                Decoded::Nothing | Decoded::Heartbeat => return Ok(Ok(())),
                Decoded::Boundary => {
                    return Ok(match self.outlet.progress(self.decoder.position()) {
                        Some(item) => self.outlet.emit(item, &mut self.checkpoint).await,
                        None => Ok(()),
                    });
                }
                Decoded::Transaction(txn) => {
                    tracing::debug!(pipeline = %self.pipeline, position = %txn.commit_position, events = txn.events.len(), "outbox transaction");
                    self.outlet.transaction(&self.decoder.position());
                    let item = ChangeItem::Transaction(txn);
                    return Ok(self.outlet.emit(item, &mut self.checkpoint).await);
                }
                Decoded::Part(part) => {
                    let item = ChangeItem::Part(part);
                    return Ok(self.outlet.emit(item, &mut self.checkpoint).await);
                }
            }
        }
    }
}

/// Used by `check` and tests: whether `conn` can see the lock taken.
pub(crate) async fn lock_holder(
    conn: &mut Conn,
    connector: &MysqlConnector,
) -> Result<Option<i64>, ConnectorError> {
    let sql = format!(
        "SELECT IS_USED_LOCK({})",
        sql_string(&connector.lock_name())
    );
    let row = query_first(conn, &sql, "looking up the pipeline lock").await?;
    Ok(row.map(|r| int(&r, 0)).transpose()?.flatten())
}
