//! MySQL 8 and MariaDB connector for outboxd.
//!
//! - `decoder`: a pure state machine from binlog events (decoded by `mysql_common`) to
//!   committed outbox transactions, with binlog positions and GTID state.
//! - [`stream`]: the [`outboxd_connector::ChangeStream`]: the binlog read as a replica
//!   (`mysql_async`'s binlog stream), one active reader per pipeline (`GET_LOCK`), the
//!   checkpoint row as the resume position.
//! - [`store`]: the [`outboxd_connector::OutboxStore`]: status write-back and checkpoint in
//!   one transaction, one round trip.
//! - `ops`: claims (`FOR UPDATE SKIP LOCKED`), claimed write-back, reaper, retry schedule,
//!   blocked keys, and the operator's actions ([`outboxd_connector::OutboxAdmin`]).
//! - `gtid`: MySQL GTID sets and MariaDB GTID positions, parsed, merged and rendered.
//! - `server`: binlog status, files, and whether a checkpoint can still be resumed from.
//! - `admin`: `init` (tables, starting checkpoint; poll mode: its index) and `check`.
//! - `schema`: `schemas/mysql/*.sql` rendered for the configured names; quoting.

mod admin;
mod config;
mod connect;
mod decoder;
mod gtid;
mod ops;
mod schema;
mod server;
pub mod store;
pub mod stream;

pub use config::{MysqlConfig, SslMode};
pub use connect::MysqlConnector;
