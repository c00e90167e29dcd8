//! MySQL 8 and MariaDB connector for outboxd.
//!
//! The layout is the same in every engine crate (see `connectors/postgres`), and what the
//! engines share lives in `outboxd-connector-kit`:
//!
//! - `config`: [`MysqlConfig`], the `[source]` section.
//! - `client`: [`MysqlConnector`], SQL connections (verified TLS through native-tls) and
//!   the classification of server errors into transient and definite ones.
//! - `guard`: the password guard, between mysql_async and a server that is not verified
//!   (no TLS, or TLS it holds itself): refuses caching_sha2_password and the cleartext
//!   plugin there, before the client could send the password.
//! - `setup/`: `init` (tables, starting checkpoint; poll mode: its index), `check`, and
//!   the checkpoint reset of `recover`.
//! - `log/`: the log tail. `log::position` is the binlog coordinate ([`BinlogPosition`])
//!   and its form as the core's opaque position; `log::decode` is a pure state machine from binlog events
//!   (decoded by `mysql_common`) to committed outbox transactions, rows through the kit's
//!   row conversion; `log::gtid` parses, merges and renders MySQL GTID sets and MariaDB
//!   GTID positions; `log::server` reads binlog status and files and says whether a
//!   checkpoint can still be resumed from; [`stream`] is the
//!   [`outboxd_connector::ChangeStream`]: the binlog read as a replica, one active reader
//!   per pipeline (`GET_LOCK`), the checkpoint row as the resume position.
//! - `store/`: the [`outboxd_connector::OutboxStore`]: status write-back and checkpoint in
//!   one transaction, one round trip (`store::write_back`), claims (`FOR UPDATE SKIP
//!   LOCKED`), claimed write-back, reaper, retry schedule, blocked keys and `recover`'s
//!   INIT scan (`store::claims`), and the operator's actions,
//!   [`outboxd_connector::TableAdmin`] (`store::operator`); the inbox's store and its
//!   `TableAdmin` beside them.
//! - `schema`: `schemas/mysql/*.sql` rendered for the configured names; quoting.
//! - `time`: TIMESTAMP values as ISO 8601 and `SystemTime`.
//!
//! Data flows: binlog → `log/decode` → `log/stream` → the core, which writes outcomes
//! back through `store/`.

mod client;
mod config;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod log;
mod schema;
mod setup;
pub mod store;
mod time;

pub use client::MysqlConnector;
pub use config::{MysqlConfig, SslMode};
pub use log::position::BinlogPosition;
pub use log::stream;
