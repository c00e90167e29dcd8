//! The log tail: the replication wire client, the pgoutput decoder, the assembly of
//! outbox transactions and the [`outboxd_connector::ChangeStream`] built from them.

pub(crate) mod decode;
pub(crate) mod identity;
pub mod pgoutput;
pub(crate) mod position;
pub mod replication;
pub mod stream;
