//! [`MemoryStream`], the twin of an engine's [`ChangeStream`], from one of two sources:
//!
//! - fed by the test through a [`LogWriter`] ([`MemoryStream::new`]): the relay's tests
//!   script the log (positions, parts, a transaction read again) item by item, over rows
//!   they inserted with [`super::MemoryStore::insert`];
//! - the database's log of committed transactions ([`MemoryConnector`]'s `open_stream`,
//!   which the conformance suite checks): one reader per slot, resuming after the
//!   confirmed position, a large transaction in parts, a lost position a definite error.
//!
//! A stream the test feeds checks every confirmation as the core must make them, into a
//! [`StreamLog`] the relay's tests assert on: never backward, never past a transaction
//! whose rows are still INIT. A stream reading the database's log checks nothing: the
//! conformance scenarios drive it as a contract test may (confirming rows they never
//! wrote back), and the contract asks only that its positions do not go backward.
//!
//! [`MemoryConnector`]: super::connector::MemoryConnector

use std::sync::{Arc, Mutex};

use outboxd_connector::{
    ChangeItem, ChangeStream, CommittedTransaction, ConnectorError, ErrorReason, OutboxEvent,
    Position, TransactionPart, PART_BYTES, PART_EVENTS,
};
use tokio::sync::mpsc;

use super::database::{Database, RECOVER};
use super::{lock, lsn, MemoryStore};

/// What the stream saw: positions confirmed, and any confirmation that passed an INIT row.
#[derive(Default)]
pub(crate) struct StreamLog {
    pub(crate) confirmed: Vec<Position>,
    pub(crate) violations: Vec<String>,
}

/// The test's end of a [`MemoryStream`] it feeds.
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

/// Where a [`MemoryStream`] reads.
enum Source {
    /// What the test writes. Once the writer is gone it waits forever, as an idle log does.
    Fed(mpsc::UnboundedReceiver<Result<ChangeItem, ConnectorError>>),
    /// The database's log, through its slot.
    Log(LogCursor),
}

/// A reader of the database's log: the slot is held until it is dropped.
struct LogCursor {
    db: Arc<Database>,
    /// The index in the log of the next transaction to read.
    next: usize,
    /// How many rows of that transaction went out in parts already.
    sent_in_parts: usize,
}

impl LogCursor {
    /// The next item of the log, or `None` when everything committed has been read.
    /// Changes the cursor only when it returns an item, so waiting for the next commit
    /// may be cancelled at any point.
    fn take(&mut self) -> Result<Option<ChangeItem>, ConnectorError> {
        let state = self.db.state();
        if state.position_lost {
            return Err(position_lost());
        }
        let Some(entry) = state.log.get(self.next) else {
            return Ok(None);
        };
        let rest = &entry.events[self.sent_in_parts..];
        // As many rows as one part holds: PART_EVENTS, or PART_BYTES (at least one row).
        let mut rows = 0;
        let mut bytes = 0;
        for event in rest {
            if rows == PART_EVENTS || (rows > 0 && bytes + event.size() > PART_BYTES) {
                break;
            }
            rows += 1;
            bytes += event.size();
        }
        if rows < rest.len() {
            self.sent_in_parts += rows;
            return Ok(Some(ChangeItem::Part(TransactionPart {
                begin_position: entry.begin.clone(),
                commit_time: Some(entry.commit_time),
                events: rest[..rows].to_vec(),
            })));
        }
        let end = CommittedTransaction {
            commit_position: entry.commit.clone(),
            commit_time: Some(entry.commit_time),
            events: rest.to_vec(),
        };
        self.next += 1;
        self.sent_in_parts = 0;
        Ok(Some(ChangeItem::Transaction(end)))
    }
}

impl Drop for LogCursor {
    fn drop(&mut self) {
        self.db.state().reader = false;
    }
}

/// The error of a slot that was dropped or invalidated.
fn position_lost() -> ConnectorError {
    ConnectorError::definite(format!(
        "the replication slot of this pipeline was dropped or invalidated: the log position \
         to resume from is gone; {RECOVER}"
    ))
    .with_reason(ErrorReason::PositionLost)
}

/// A log tail; see the module's doc for its two sources.
pub(crate) struct MemoryStream {
    source: Source,
    db: Arc<Database>,
    /// Row ids of each transaction yielded, by position.
    yielded: Vec<(Position, Vec<i64>)>,
    /// Row ids of the parts of the transaction whose end is not yielded yet.
    open: Vec<i64>,
    log: Arc<Mutex<StreamLog>>,
}

impl MemoryStream {
    /// A stream the test feeds through the returned [`LogWriter`], over `store`'s rows.
    pub(crate) fn new(store: Arc<MemoryStore>) -> (Self, LogWriter, Arc<Mutex<StreamLog>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = Self::reading(Source::Fed(rx), Arc::clone(&store.db));
        let log = Arc::clone(&stream.log);
        (stream, LogWriter { items: tx }, log)
    }

    /// The stream `open_stream` opens: the database's log after the slot's confirmed
    /// position. Refused while another stream reads (transient), and definitely when the
    /// position is gone or the checkpoint was written on another server.
    pub(super) fn open(db: Arc<Database>) -> Result<Self, ConnectorError> {
        let next = {
            let mut state = db.state();
            state.outbox()?;
            if let Some(checkpoint) = state.checkpoint.as_ref().filter(|c| db.is_foreign(c)) {
                return Err(db.foreign_checkpoint(checkpoint));
            }
            if state.position_lost {
                return Err(position_lost());
            }
            let Some(slot) = state.slot.clone() else {
                return Err(ConnectorError::definite(
                    "the replication slot of this pipeline does not exist: run `outboxd init` \
                     (log mode)",
                )
                .with_reason(ErrorReason::MissingObject));
            };
            if state.reader {
                return Err(ConnectorError::transient(
                    "the replication slot of this pipeline is in use by another reader",
                )
                .with_reason(ErrorReason::SlotInUse));
            }
            state.reader = true;
            let after = state.log.iter().position(|entry| entry.commit > slot);
            after.unwrap_or(state.log.len())
        };
        let cursor = LogCursor {
            db: Arc::clone(&db),
            next,
            sent_in_parts: 0,
        };
        Ok(Self::reading(Source::Log(cursor), db))
    }

    fn reading(source: Source, db: Arc<Database>) -> Self {
        Self {
            source,
            db,
            yielded: Vec::new(),
            open: Vec::new(),
            log: Arc::new(Mutex::new(StreamLog::default())),
        }
    }

    /// The next item of the source, waiting for one.
    async fn read(&mut self) -> Result<ChangeItem, ConnectorError> {
        match &mut self.source {
            Source::Fed(items) => match items.recv().await {
                Some(item) => item,
                None => std::future::pending().await,
            },
            Source::Log(cursor) => loop {
                // Registered before looking, so a commit in between is not missed.
                let db = Arc::clone(&cursor.db);
                let committed = db.committed.notified();
                tokio::pin!(committed);
                committed.as_mut().enable();
                if let Some(item) = cursor.take()? {
                    return Ok(item);
                }
                committed.await;
            },
        }
    }
}

impl ChangeStream for MemoryStream {
    async fn next(&mut self) -> Result<ChangeItem, ConnectorError> {
        let item = self.read().await?;
        match &item {
            ChangeItem::Transaction(tx) => {
                let mut ids = std::mem::take(&mut self.open);
                ids.extend(tx.events.iter().map(|e| e.id));
                self.yielded.push((tx.commit_position.clone(), ids));
            }
            ChangeItem::Part(part) => {
                self.open.extend(part.events.iter().map(|e| e.id));
            }
            ChangeItem::Progress(_) => {}
        }
        Ok(item)
    }

    /// Fed by the test, checks the confirmation (see the module's doc); reading the
    /// database's log, moves the slot's confirmed position.
    async fn confirm(&mut self, position: &Position) -> Result<(), ConnectorError> {
        if let Source::Log(_) = self.source {
            let mut state = self.db.state();
            if state.slot.as_ref() < Some(position) {
                state.slot = Some(position.clone());
            }
            return Ok(());
        }
        let mut log = lock(&self.log);
        // Non-decreasing, as `ChangeStream::confirm` asks: the same position again is fine.
        if let Some(last) = log.confirmed.last().filter(|last| *last > position) {
            let violation = format!("confirmed {position} after {last}");
            log.violations.push(violation);
        }
        {
            let state = self.db.state();
            for (at, ids) in self.yielded.iter().filter(|(at, _)| at <= position) {
                let init = ids
                    .iter()
                    .filter(|id| state.rows.get(id).is_some_and(|r| r.status == "INIT"));
                for id in init {
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
