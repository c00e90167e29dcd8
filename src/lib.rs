//! outboxd: a change-data-capture relay for the transactional outbox pattern.
//!
//! The core is engine-independent: it drives any [`outboxd_connector::Connector`]
//! (PostgreSQL today) into Kafka. `main.rs` is a thin CLI over [`commands`].

pub mod admin_cli;
pub mod commands;
pub mod config;
pub mod http;
pub mod kafka;
pub mod metrics;
pub mod pipeline;
pub mod retry;
