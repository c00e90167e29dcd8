//! In-memory twins of the connector contract for unit tests of the core (the relay, the
//! claim worker): an [`OutboxStore`](outboxd_connector::OutboxStore) and a
//! [`ChangeStream`](outboxd_connector::ChangeStream) over one in-memory "database", and
//! the [`Connector`](outboxd_connector::Connector) that opens them.
//!
//! The core's unit tests trust these twins to behave like PostgreSQL and MariaDB do, so
//! the twins run the connector contract's conformance suite (`outboxd_conformance`) like
//! the real stores: [`conformance`] lists every scenario, and the store, claim and stream
//! scenarios pass against them. What the twins do not twin (the operator's
//! [`TableAdmin`](outboxd_connector::TableAdmin) actions but parking, and the inbox) is a
//! definite error, and those scenarios are listed as ignored with the reason.
//!
//! One file per job, so each stays readable:
//! - [`database`]: the shared state (rows, claims, row locks, checkpoint, the log of
//!   committed transactions, the replication slot) and the row's columns;
//! - [`store`]: [`MemoryStore`], the write-back, the checkpoint and the test's controls
//!   (rows set by hand, a slow or unavailable database);
//! - [`claims`]: the claim path of the store (`SKIP LOCKED`, strict order, reaper,
//!   schedule, blocked keys);
//! - [`stream`]: [`MemoryStream`], either fed by the test ([`LogWriter`]) or reading the
//!   database's log as a connector's stream does;
//! - [`connector`]: [`MemoryConnector`] (`init`, `check`, opening, `recover`'s reset);
//! - [`conformance`]: the conformance harness and the scenarios' instantiation.
//!
//! Besides the twins: [`CapturedLog`] (a test's JSON log lines), [`event`] and [`lsn`].

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use outboxd_connector::{OutboxEvent, Position};

mod claims;
mod conformance;
mod connector;
mod database;
mod store;
mod stream;

pub(crate) use store::MemoryStore;
pub(crate) use stream::{LogWriter, MemoryStream, StreamLog};

/// The guard of `m`, also when a test panicked while holding it (the twins' state stays
/// readable for the assertions that follow).
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

/// A position of the in-memory log: `n` in the log.
pub(crate) fn lsn(n: u64) -> Position {
    Position::new(u128::from(n), format!("lsn:0/{n:X}"))
}

/// An outbox event of row `id` and business key `key`: what the twin's store reads back
/// of a row [`MemoryStore::insert`] wrote.
pub(crate) fn event(id: i64, key: &str) -> OutboxEvent {
    OutboxEvent {
        id,
        table: 0,
        message_id: format!("m-{id}"),
        message_type: database::FIXTURE_TYPE.into(),
        biz_key: key.into(),
        key: Bytes::from(key.to_owned()),
        topic: None,
        routing: None,
        payload: Bytes::from_static(database::FIXTURE_PAYLOAD),
        headers: Vec::new(),
        created_at: database::FIXTURE_CREATED_AT.into(),
        retry_count: 0,
        max_retry_count: database::FIXTURE_MAX_RETRIES,
        commit_time: None,
        rejected: None,
    }
}
