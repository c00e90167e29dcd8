use std::future::Future;
use std::time::SystemTime;

use crate::{ConnectorError, OutboxEvent, Position};

/// One committed transaction that inserted outbox rows, or the end of one whose earlier
/// rows came as [`TransactionPart`]s.
#[derive(Clone, Debug)]
pub struct CommittedTransaction {
    /// The log position just past the commit. Confirming it tells the database that this
    /// transaction and everything before it need never be sent again.
    pub commit_position: Position,
    /// When the transaction committed, according to the log.
    pub commit_time: Option<SystemTime>,
    /// The outbox rows it inserted, in insertion order (after those of its parts). Never
    /// empty, unless parts came before it.
    pub events: Vec<OutboxEvent>,
}

/// Outbox rows of a committed transaction too large to hand over whole: the connector
/// yields its rows in parts as it decodes them (bounded memory), then the transaction's
/// [`CommittedTransaction`] with the rest and the commit position. Nothing else comes
/// between a transaction's parts and its end.
#[derive(Clone, Debug)]
pub struct TransactionPart {
    /// Where the transaction begins in the log: before its commit position, and at or
    /// after the commit position of every transaction committed before it. A part is of
    /// a transaction already written back when this is before the checkpoint.
    pub begin_position: Position,
    /// When the transaction committed (or, where the log says only at the end, when it
    /// began), according to the log.
    pub commit_time: Option<SystemTime>,
    /// The next outbox rows of the transaction, in insertion order. Never empty.
    pub events: Vec<OutboxEvent>,
}

/// How many rows, or how many bytes of rows ([`OutboxEvent::size`]), a connector gathers
/// before it yields a [`TransactionPart`] of a transaction still being decoded.
pub const PART_EVENTS: usize = 1_000;
/// See [`PART_EVENTS`].
pub const PART_BYTES: usize = 4 << 20;

/// What a [`ChangeStream`] yields.
#[derive(Clone, Debug)]
pub enum ChangeItem {
    /// A committed transaction with outbox inserts (or the end of one yielded in parts).
    Transaction(CommittedTransaction),
    /// The next rows of a large committed transaction; its end follows.
    Part(TransactionPart),
    /// The log moved to `Position` without further outbox inserts (a keepalive, or
    /// transactions on other tables). Once everything yielded before it is safe, the core
    /// confirms it, so an idle outbox does not hold back the database's log.
    Progress(Position),
}

/// The tail of a database log, filtered to committed outbox inserts.
///
/// Guarantees a connector must keep:
/// - only committed transactions are yielded, in commit order, each exactly once per
///   session; a transaction's outbox rows come together, or, past [`PART_EVENTS`] rows or
///   [`PART_BYTES`] bytes, in [`TransactionPart`]s followed by its end, with nothing in
///   between, so no connector holds a whole large transaction in memory. Only the end
///   carries a position to confirm: a transaction is confirmed whole or not at all;
/// - after a restart, the stream resumes at or before the last confirmed position: a
///   transaction may be yielded again (at-least-once), one is never skipped;
/// - when the position to resume from is no longer available (slot dropped, binlog
///   purged), [`ChangeStream::next`] returns a definite error that names the recovery
///   command, it never silently starts from "now".
pub trait ChangeStream: Send {
    /// The next item of the log. Cancel-safe: dropping the future before it completes
    /// loses nothing, so the core may `select!` on it.
    fn next(&mut self) -> impl Future<Output = Result<ChangeItem, ConnectorError>> + Send;

    /// Records that every transaction up to and including `position` is published and
    /// written back, so the database may discard the log before it. Positions passed are
    /// non-decreasing. The connector may report it to the server asynchronously.
    fn confirm(
        &mut self,
        position: &Position,
    ) -> impl Future<Output = Result<(), ConnectorError>> + Send;
}
