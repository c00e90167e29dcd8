//! The PostgreSQL [`ChangeStream`]: logical replication from the pipeline's slot, decoded
//! with [`crate::pgoutput`], filtered to committed inserts into the outbox table.
//!
//! `PgChangeStream::open` checks the slot over SQL, resolves the outbox table the way
//! `init` did (through the role's `search_path`; see `crate::outbox_table`), refuses a
//! checkpoint row another cluster wrote (see `log::identity`), starts
//! replication and spawns a task that owns the socket. The task hands the messages to
//! `log::decode` (transactions assembled Begin..Commit, outbox inserts turned into
//! [`OutboxEvent`](outboxd_connector::OutboxEvent)s, any other table an error) and sends
//! [`ChangeItem`]s through the kit's bounded channel ([`outboxd_connector_kit::tail`]):
//! when the core falls behind, the task stops reading the socket (backpressure) but keeps
//! sending standby status updates so the server does not time the session out.
//!
//! Positions: a transaction's position is the end LSN of its commit; progress is a
//! keepalive's WAL end (only between transactions) or the end LSN of a transaction without
//! outbox rows. The server is only ever told the LSN the core passed to
//! [`ChangeStream::confirm`] (or the slot's own `confirmed_flush_lsn` before that).

use std::fmt;
use std::time::Duration;

use outboxd_connector::{ChangeItem, ChangeStream, ConnectorError, ErrorReason, Position};

use super::position::Lsn;
use outboxd_connector_kit::tail::{self, sleep_until_opt, Closed, Confirmations, Inlet, Outlet};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::log::decode::{Decoded, Decoder};
use crate::log::identity::verify_checkpoint;
use crate::outbox_table::OutboxTable;
use crate::replication::{ReplicationConnection, ReplicationMessage, ReplicationStream};
use crate::PostgresConnector;

/// A confirmation reaches the server within this delay (and status updates are
/// coalesced to at most one per this delay).
const CONFIRM_DELAY: Duration = Duration::from_millis(100);

/// The change stream of one PostgreSQL pipeline. Dropping it stops replication.
pub struct PgChangeStream {
    inlet: Inlet,
    confirmed: watch::Sender<Lsn>,
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
        let client = connector.sql_client().await?;
        let confirmed_flush = check_slot(connector, &client, &slot).await?;
        let mut outboxes = Vec::with_capacity(connector.layout().outbox_tables.len());
        for configured in &connector.layout().outbox_tables {
            outboxes.push(resolve_outbox(connector, &client, configured).await?);
        }
        // The relay skips what the checkpoint says it wrote back: not when another
        // cluster wrote it.
        let (checkpoint, system) = verify_checkpoint(connector, &client).await?;
        tracing::debug!(%slot, checkpoint = ?checkpoint.map(|c| c.to_string()), %system, "checkpoint checked");
        drop(client);
        let decoder = Decoder::new(outboxes, &publication, connector.layout());

        let conn = ReplicationConnection::connect(connector.config()).await?;
        // 0/0: the server starts at the slot's confirmed_flush_lsn.
        let stream = conn
            .start_logical_replication(&slot, Lsn(0), &publication)
            .await
            .map_err(|e| with_fix(e, &slot))?;
        tracing::info!(%slot, %publication, confirmed_flush = %confirmed_flush, "replication stream open");

        let (outlet, mut inlet) = tail::channel(confirmed_flush, Lsn::position);
        let (confirmed, confirmed_rx) = watch::channel(confirmed_flush);
        let task = Task {
            stream,
            decoder,
            outlet,
            reporter: Reporter::new(confirmed_rx, connector.config().status_interval),
            silence_limit: silence_limit(connector.config().silence_timeout),
            slot: slot.clone(),
        };
        inlet.spawn(task.run());
        Ok(Self {
            inlet,
            confirmed,
            slot,
        })
    }

    /// The replication slot this stream reads.
    pub fn slot(&self) -> &str {
        &self.slot
    }
}

impl ChangeStream for PgChangeStream {
    async fn next(&mut self) -> Result<ChangeItem, ConnectorError> {
        let slot = &self.slot;
        self.inlet
            .next(|| format!("the replication stream of slot `{slot}` has ended"))
            .await
    }

    async fn confirm(&mut self, position: &Position) -> Result<(), ConnectorError> {
        let lsn = Lsn::from_position(position).map_err(|e| {
            let message = format!("{} (slot `{}`)", e.message(), self.slot);
            e.with_message(message)
        })?;
        tail::advance(&self.confirmed, lsn);
        Ok(())
    }
}

/// Reads the slot from `pg_replication_slots` and returns its `confirmed_flush_lsn`.
async fn check_slot(
    connector: &PostgresConnector,
    client: &tokio_postgres::Client,
    slot: &str,
) -> Result<Lsn, ConnectorError> {
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
        .map_err(|e| crate::client::classify_pg_error(&e, &context))?;
    let Some(row) = row else {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` does not exist: run `outboxd init --config <file>` (or \
             `outboxd recover --config <file>` if it was dropped)"
        ))
        .with_reason(ErrorReason::MissingObject));
    };
    let info: serde_json::Value = row
        .try_get(0)
        .map_err(|e| ConnectorError::definite(context.clone()).with_source(e))?;
    let field = |name: &str| info.get(name).and_then(serde_json::Value::as_str);
    if field("wal_status") == Some("lost") {
        return Err(ConnectorError::definite(format!(
            "replication slot `{slot}` was invalidated (the WAL it needed was removed): run \
             `outboxd recover --config <file>` to recreate it and rescan INIT/FAILED rows"
        ))
        .with_reason(ErrorReason::PositionLost));
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
        ))
        .with_reason(ErrorReason::SlotInUse));
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

/// The outbox table `configured` (one of `outbox.table(s)`) as the server resolves it on
/// the pipeline's role, as `init` and `check` do: the decoder knows it in the log by this
/// OID.
async fn resolve_outbox(
    connector: &PostgresConnector,
    client: &tokio_postgres::Client,
    configured: &str,
) -> Result<OutboxTable, ConnectorError> {
    let table = OutboxTable::resolve(client, configured).await?;
    let Some(table) = table else {
        return Err(ConnectorError::definite(format!(
            "outbox table `{configured}` does not exist in {} (an unqualified name is looked up \
             through the search_path of role `{}`): run `outboxd init --config <file>`, or set \
             outbox.table to the schema-qualified name of your outbox",
            connector.endpoint(),
            connector.config().user
        ))
        .with_reason(ErrorReason::MissingObject));
    };
    tracing::debug!(outbox = %table, oid = table.oid, "outbox table resolved");
    Ok(table)
}

/// Adds the operator's fix to server errors about a missing or unusable slot or
/// publication (they can appear at START_REPLICATION or at the first change decoded).
fn with_fix(e: ConnectorError, slot: &str) -> ConnectorError {
    let fix = match e.reason() {
        // A publication the slot's decoding cannot see: dropped, or created after the
        // position decoding starts from (the catalog is read as it was at each change).
        ErrorReason::MissingObject if e.message().contains("publication") => {
            "run `outboxd init --config <file>` to create it; if it exists, it was created \
             after the slot's confirmed position (a slot taken over from Debezium or another \
             consumer): let that consumer confirm past the publication's creation before \
             switching, or run `outboxd recover --config <file>` to start the slot afresh"
        }
        // The slot or publication was dropped.
        ErrorReason::MissingObject => {
            "run `outboxd init --config <file>` to create it (or `outboxd recover --config \
             <file>` if the slot was dropped)"
        }
        // The slot was invalidated (WAL removed).
        ErrorReason::PositionLost => {
            "the slot is no longer usable: run `outboxd recover --config <file>` to recreate it \
             and rescan INIT/FAILED rows"
        }
        _ => return e,
    };
    tracing::debug!(%slot, error = %e, "replication error needs the operator");
    // Both reasons come from definite SQLSTATEs (42704, 55000): only the fix is added.
    let message = format!("{}: {fix}", e.message());
    e.with_message(message)
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

/// The reporter's duties while the task waits for the core: a [`Reporter`] with the
/// stream it reports on.
struct StatusUpdates<'a> {
    reporter: &'a mut Reporter,
    stream: &'a mut ReplicationStream,
    slot: &'a str,
}

impl Confirmations for StatusUpdates<'_> {
    async fn changed(&mut self) -> Result<(), Closed> {
        self.reporter.confirmed.changed().await.map_err(|_| Closed)
    }

    fn on_confirm(&mut self) {
        self.reporter.on_confirm();
    }

    fn due(&self) -> Option<Instant> {
        Some(self.reporter.deadline())
    }

    async fn on_due(&mut self) -> Result<(), ConnectorError> {
        self.reporter.send(self.stream, self.slot, false).await
    }
}

/// How long the task waits for any message from the server before it takes the
/// connection for dead: `source.silence_timeout` (`None`: never). Once the server has said
/// nothing for a status interval, the next status update asks it to answer (the reply
/// flag), so on a live connection an idle slot still hears from it every interval; only a
/// connection that carries nothing (a network partition behind a live proxy, a frozen
/// server) stays silent that long, or a server busy decoding a large transaction's commit
/// (which answers no status update meanwhile before PostgreSQL 15): hence a long default.
fn silence_limit(timeout: Duration) -> Option<Duration> {
    (!timeout.is_zero()).then_some(timeout)
}

/// The task that owns the replication socket.
struct Task {
    stream: ReplicationStream,
    decoder: Decoder,
    outlet: Outlet<Lsn>,
    reporter: Reporter,
    /// See [`silence_limit`].
    silence_limit: Option<Duration>,
    slot: String,
}

impl Task {
    async fn run(mut self) {
        let error = match self.run_inner().await {
            Ok(Closed) => return,
            Err(e) => e,
        };
        tracing::debug!(slot = %self.slot, error = %error, "replication stream failed");
        self.outlet.fail(error).await;
    }

    async fn run_inner(&mut self) -> Result<Closed, ConnectorError> {
        // Since the task last heard from the server, or last finished handling what it
        // heard (handing a transaction to the core may wait; that is not the server's
        // silence).
        let mut waiting_since = Instant::now();
        loop {
            let progress_at = self.outlet.progress_due(self.decoder.in_transaction());
            let status_at = self.reporter.deadline();
            let silent_at = self.silence_limit.map(|limit| waiting_since + limit);
            tokio::select! {
                message = self.stream.recv() => {
                    let message = message.map_err(|e| with_fix(e, &self.slot))?;
                    if let Err(Closed) = self.handle(message).await? {
                        return Ok(Closed);
                    }
                    waiting_since = Instant::now();
                }
                () = sleep_until_opt(silent_at) => {
                    return Err(ConnectorError::transient(format!(
                        "no message from PostgreSQL on the replication connection of slot `{}` \
                         for {:?}, although it was asked to answer: the connection is silent \
                         (a network partition, a proxy that stopped forwarding, a frozen \
                         server); reconnecting",
                        self.slot, self.silence_limit.unwrap_or_default()
                    )));
                }
                changed = self.reporter.confirmed.changed() => {
                    if changed.is_err() {
                        return Ok(Closed); // PgChangeStream dropped
                    }
                    self.reporter.on_confirm();
                }
                () = tokio::time::sleep_until(status_at) => {
                    // Silent for a status interval: ask the server to answer this one.
                    let ask = waiting_since.elapsed() >= self.reporter.interval;
                    self.reporter.send(&mut self.stream, &self.slot, ask).await?;
                }
                () = sleep_until_opt(progress_at) => {
                    if let Some(item) = self.outlet.take_progress() {
                        if self.emit(item).await.is_err() {
                            return Ok(Closed);
                        }
                        // Waiting for the core is not the server's silence.
                        waiting_since = Instant::now();
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
                Some(Decoded::Transaction(lsn, txn)) => {
                    tracing::debug!(slot = %self.slot, %lsn, events = txn.events.len(), "outbox transaction");
                    self.outlet.transaction(&lsn);
                    Ok(self.emit(ChangeItem::Transaction(txn)).await)
                }
                Some(Decoded::Part(part)) => Ok(self.emit(ChangeItem::Part(part)).await),
            },
        }
    }

    /// Records progress to `lsn`; sends it now or when the rate limit allows.
    async fn progress(&mut self, lsn: Lsn) -> Result<(), Closed> {
        match self.outlet.progress(lsn) {
            Some(item) => self.emit(item).await,
            None => Ok(()),
        }
    }

    /// Sends `item` to the core; status updates keep going out while it waits.
    async fn emit(&mut self, item: ChangeItem) -> Result<(), Closed> {
        let mut duties = StatusUpdates {
            reporter: &mut self.reporter,
            stream: &mut self.stream,
            slot: &self.slot,
        };
        self.outlet.emit(item, &mut duties).await
    }
}
