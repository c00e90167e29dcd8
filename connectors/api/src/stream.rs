use std::future::Future;
use std::time::SystemTime;

use crate::{ConnectorError, OutboxEvent, Position};

/// One committed transaction that inserted outbox rows.
#[derive(Clone, Debug)]
pub struct CommittedTransaction {
    /// The log position just past the commit. Confirming it tells the database that this
    /// transaction and everything before it need never be sent again.
    pub commit_position: Position,
    /// When the transaction committed, according to the log.
    pub commit_time: Option<SystemTime>,
    /// The outbox rows it inserted, in insertion order. Never empty.
    pub events: Vec<OutboxEvent>,
}

/// What a [`ChangeStream`] yields.
#[derive(Clone, Debug)]
pub enum ChangeItem {
    /// A committed transaction with outbox inserts.
    Transaction(CommittedTransaction),
    /// The log moved to `Position` without further outbox inserts (a keepalive, or
    /// transactions on other tables). Once everything yielded before it is safe, the core
    /// confirms it, so an idle outbox does not hold back the database's log.
    Progress(Position),
}

/// The tail of a database log, filtered to committed outbox inserts.
///
/// Guarantees a connector must keep:
/// - only committed transactions are yielded, in commit order, each exactly once per
///   session, with all of its outbox rows together;
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
