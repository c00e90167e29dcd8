//! What every outboxd engine connector shares, so that an engine crate holds only what is
//! truly its own: the wire protocol, the log decoder and the SQL dialect.
//!
//! - [`columns`]: the outbox column model. One list of the outbox's columns with their
//!   roles; `check`'s required columns, the claim queries' select lists and the row
//!   conversion are all derived from it, so the engines cannot drift apart.
//! - [`row`]: one outbox row → [`OutboxEvent`](outboxd_connector::OutboxEvent)
//!   conversion with one policy for bad values. An engine turns its native values (a
//!   pgoutput tuple, a binlog row, an SQL result row) into the engine-neutral [`Value`]
//!   and calls it, from the log path and the claim path alike.
//! - [`tail`]: the skeleton of the task that owns a log connection: the bounded channel to
//!   the core, emit with backpressure while confirmations keep flowing, the progress rate
//!   limit, the error hand-off.
//! - [`check`]: helpers for `outboxd check` lines; [`setup`]: pieces of `outboxd init`.
//! - [`inbox`]: the inbox's statuses, stored payload and headers, and the SQL handler's
//!   named placeholders.
//! - [`status`]: the status literals and the statuses that block a key.
//! - [`retry`]: the longest retry delay written to a row.
//! - [`tls`]: [`SslMode`] and the certificate keys of every engine's `[source]`, as a
//!   [`TlsPolicy`] (what to verify), and the `check` line of a connection; [`config`]:
//!   the defaults of the other keys every engine has.
//! - [`browse`]: the operator console's reads, statements and rows; [`fuzz_input`]: how
//!   the fuzz targets cut their input into messages.
//! - [`store`]: small store-side pieces (empty write-backs, `status` rows, qualified
//!   table names).

pub mod browse;
pub mod check;
pub mod columns;
pub mod config;
pub mod fuzz_input;
pub mod inbox;
pub mod net;
pub mod retry;
pub mod row;
pub mod setup;
pub mod status;
pub mod store;
pub mod tables;
pub mod tail;
pub mod tls;

pub use columns::{ColumnMap, Field};
pub use row::{RowSource, Value};
pub use tls::{SslMode, TlsOptions, TlsPolicy};
