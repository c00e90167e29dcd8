//! PostgreSQL connector for outboxd.
//!
//! - [`replication`]: the streaming-replication wire protocol (startup with
//!   `replication=database`, trust/MD5/SCRAM-SHA-256 auth, optional TLS, CopyBoth),
//!   spoken with `postgres-protocol`'s codecs over tokio.
//! - [`pgoutput`]: a pure decoder of pgoutput (protocol version 1) messages.
//! - [`stream`]: the [`outboxd_connector::ChangeStream`] built from the two: committed
//!   outbox inserts, keepalive progress, standby status updates.
//! - [`store`]: the [`outboxd_connector::OutboxStore`]: status write-back, checkpoint,
//!   claims, the reaper.
//! - [`operator`]: the [`outboxd_connector::OutboxAdmin`]: `status`, `retry`, `park`,
//!   `resolve`, `janitor`, the INIT scan of `recover`.
//! - [`admin`]: `init` (schema, publication, slot), `check`, and the slot reset of `recover`.

pub mod admin;
mod config;
mod connect;
pub mod operator;
pub mod pgoutput;
pub mod replication;
mod schema;
pub mod store;
pub mod stream;

pub use config::{PostgresConfig, SslMode};
pub use connect::PostgresConnector;
pub use operator::retry_channel;
