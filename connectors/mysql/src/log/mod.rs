//! The log tail: binlog decoding, GTID state, the server's binlog files and the
//! [`outboxd_connector::ChangeStream`] built from them.

pub(crate) mod decode;
pub(crate) mod gtid;
pub(crate) mod identity;
pub(crate) mod position;
pub(crate) mod server;
pub mod stream;
