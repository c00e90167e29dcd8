//! The log tail: the replication wire client, the pgoutput decoder, the assembly of
//! outbox transactions and the [`outboxd_connector::ChangeStream`] built from them.

pub(crate) mod decode;
pub mod lsn;
pub mod pgoutput;
pub mod replication;
pub mod stream;
