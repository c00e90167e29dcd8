//! outboxd: a change-data-capture relay for the transactional outbox and inbox patterns.
//!
//! The core is engine-independent: it drives any [`outboxd_connector::Connector`] into a
//! [`sink::Sink`] (Kafka, HTTP endpoints), and stores incoming messages in the inbox
//! table for handlers. Its folders follow the runtime paths:
//!
//! - [`relay`]: the log relay — session, ack frontier, outcome mapping;
//! - [`claims`]: the claim worker — retries, reaper, poll mode, backoff;
//! - [`sink`]: the sink boundary and its Kafka and HTTP implementations;
//! - [`inbox`]: the receiving half — Kafka and HTTP ingress, workers, handlers;
//! - [`cli`]: the commands `main.rs` runs; [`config`]: the typed configuration, section by
//!   section;
//! - [`webhooks`]: Standard Webhooks, signing (the HTTP sink, the webhook handler) and
//!   verifying (the inbox's HTTP ingress);
//! - [`observability`]: the `/metrics`, `/healthz`, `/readyz` endpoint and its series;
//! - [`canary`]: the live end-to-end check inside `run`;
//! - [`console`]: the operator console at `/ui`;
//! - [`verify`]: `outboxd verify`, the end-to-end check an operator runs;
//! - `reconnect.rs`: the one reconnect loop the long-running paths share;
//! - `engines.rs`: the engine registry, the one file that names database engines.

pub mod canary;
pub mod claims;
pub mod cli;
pub mod config;
pub mod console;
mod engines;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod inbox;
pub mod observability;
mod reconnect;
pub mod relay;
mod secrets;
pub mod sink;
#[cfg(test)]
mod testing;
pub mod verify;
pub mod webhooks;

/// The CLI commands (`outboxd::commands::{execute, Command}`), kept at their old path.
pub use cli::commands;

/// The operator commands (`outboxd::admin_cli::{AdminCommand, OutputFormat, …}`), kept at
/// their old path.
pub use cli::admin as admin_cli;
