//! PostgreSQL connector for outboxd.
//!
//! The layout is the same in every engine crate (see `connectors/mysql`), and what the
//! engines share lives in `outboxd-connector-kit`:
//!
//! - `config`: [`PostgresConfig`], the `[source]` section.
//! - `client`: [`PostgresConnector`], SQL connections and the classification of server
//!   errors into transient and definite ones; `tls`: TLS (OpenSSL) and password safety of
//!   every connection, SQL and replication.
//! - `setup/`: `init` (schema, publication, slot), `check`, and the slot reset of
//!   `recover`.
//! - `log/`: the log tail. `log::position` is the LSN ([`Lsn`]) and its form as the
//!   core's opaque position; [`replication`] speaks the streaming-replication wire protocol
//!   (startup with `replication=database`, trust/MD5/SCRAM-SHA-256 auth, optional TLS,
//!   CopyBoth); [`pgoutput`] is a pure decoder of its messages; `log::decode` assembles
//!   committed outbox transactions from them; [`stream`] is the
//!   [`outboxd_connector::ChangeStream`]: the task that owns the socket, keepalive
//!   progress, standby status updates.
//! - `store/`: the [`outboxd_connector::OutboxStore`] (status write-back and checkpoint,
//!   claims, the reaper, the INIT scan of `recover`) and, in `store::operator`, its
//!   [`outboxd_connector::TableAdmin`] (`status`, `retry`, `park`, `resolve`, `janitor`);
//!   the inbox's store and its `TableAdmin` beside them.
//! - `schema`: `schemas/postgres/*.sql` rendered for the configured names; quoting.
//! - `outbox_table`: the outbox table (OID, schema, name) the server resolves the
//!   configured name to; `init`, `check` and the stream all use it.
//!
//! Data flows: `log/replication` → `log/pgoutput` → `log/decode` (rows through the kit's
//! row conversion) → `log/stream` → the core, which writes outcomes back through
//! `store/`.

mod client;
mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod log;
mod outbox_table;
mod schema;
mod setup;
pub mod store;
mod tls;

pub use client::PostgresConnector;
pub use config::{PostgresConfig, SslMode};
pub use log::position::{parse_position, Lsn};
pub use log::{pgoutput, replication, stream};
pub use store::operator;
pub use store::operator::retry_channel;
