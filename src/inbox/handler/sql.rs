//! The SQL handler: the work is the statement itself, run by the store in the
//! transaction that marks the message DONE (`InboxOutcome::Done { statement }`), so its
//! effect and the DONE status commit together or not at all. A statement that fails
//! (constraint, syntax) is a failed attempt with the server's error in `last_error`.

use futures_util::future::BoxFuture;
use outboxd_connector::ClaimedMessage;

use super::{Handled, Handler};

/// Runs one configured statement per message.
#[derive(Clone, Debug)]
pub struct SqlHandler {
    statement: String,
}

impl SqlHandler {
    /// `statement` names the message's fields as `:biz_key`, `:payload`, ….
    pub fn new(statement: &str) -> Self {
        Self {
            statement: statement.to_owned(),
        }
    }
}

impl Handler for SqlHandler {
    fn handle<'a>(&'a self, _message: &'a ClaimedMessage) -> BoxFuture<'a, Handled> {
        Box::pin(async { Handled::Done })
    }

    fn statement(&self) -> Option<&str> {
        Some(&self.statement)
    }

    /// `handle` itself returns at once; the statement runs in the write-back, bounded by
    /// the database's own `statement_timeout` / `innodb_lock_wait_timeout`.
    fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }
}
