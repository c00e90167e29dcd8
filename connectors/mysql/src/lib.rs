//! MySQL 8 and MariaDB connector for outboxd.
//!
//! - `decoder`: a pure state machine from binlog events (decoded by `mysql_common`) to
//!   committed outbox transactions, with binlog positions and GTID state.
//! - [`stream`]: the [`outboxd_connector::ChangeStream`]: the binlog read as a replica
//!   (`mysql_async`'s binlog stream), one active reader per pipeline (`GET_LOCK`), the
//!   checkpoint row as the resume position.
//! - [`store`]: the [`outboxd_connector::OutboxStore`]: status write-back and checkpoint in
//!   one transaction, one round trip.
//! - `admin`: `init` (tables, starting checkpoint) and `check`.

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
