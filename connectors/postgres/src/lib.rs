//! PostgreSQL connector for outboxd.
//!
//! - [`replication`]: the streaming-replication wire protocol (startup with
//!   `replication=database`, trust/MD5/SCRAM-SHA-256 auth, optional TLS, CopyBoth),
//!   spoken with `postgres-protocol`'s codecs over tokio.
//! - [`pgoutput`]: a pure decoder of pgoutput (protocol version 1) messages.
//! - [`stream`]: the [`outboxd_connector::ChangeStream`] built from the two: committed
//!   outbox inserts, keepalive progress, standby status updates.
//! - [`store`]: the [`outboxd_connector::OutboxStore`]: status write-back and checkpoint.
//! - [`admin`]: `init` (schema, publication, slot) and `check`.

pub mod admin;
mod config;
mod connect;
pub mod pgoutput;
pub mod replication;
mod schema;
pub mod store;
pub mod stream;

pub use config::{PostgresConfig, SslMode};
pub use connect::PostgresConnector;
