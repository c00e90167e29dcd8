//! The CopyBoth phase, after `START_REPLICATION`: the [`ReplicationStream`] the server
//! sends XLogData and keepalives on, and the standby status updates sent back on it (what
//! lets the server discard WAL, and what keeps the session alive). The message parsing and
//! the status update's layout are pure functions, so they can be tested and fuzzed without
//! a server.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use outboxd_connector::{ConnectorError, ErrorReason};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;

use super::wire::{error_field, server_error, Backend};
use super::ReplicationConnection;
use crate::log::position::Lsn;
use crate::pgoutput::PG_EPOCH_UNIX_SECS;

/// A message of the CopyBoth stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// `w`: a chunk of the log, for logical replication one pgoutput message.
    XLogData {
        /// WAL location of the start of the data.
        wal_start: Lsn,
        /// Current end of WAL on the server.
        wal_end: Lsn,
        /// Server clock, microseconds since 2000-01-01.
        server_clock: i64,
        /// The pgoutput message.
        data: Bytes,
    },
    /// `k`: primary keepalive.
    Keepalive {
        /// Current end of WAL on the server (for logical replication: how far it decoded).
        wal_end: Lsn,
        /// Server clock, microseconds since 2000-01-01.
        server_clock: i64,
        /// The server asks for a standby status update now (or it will time out).
        reply_requested: bool,
    },
}

impl ReplicationMessage {
    /// Parses the contents of one CopyData message. Pure; never panics.
    pub fn parse(mut data: Bytes) -> Result<Self, String> {
        let need = |n: usize, data: &Bytes, what: &str| {
            if data.remaining() < n {
                Err(format!("truncated {what} message ({} bytes)", data.len()))
            } else {
                Ok(())
            }
        };
        need(1, &data, "replication")?;
        match data.get_u8() {
            b'w' => {
                need(24, &data, "XLogData")?;
                let wal_start = Lsn(data.get_u64());
                let wal_end = Lsn(data.get_u64());
                let server_clock = data.get_i64();
                Ok(ReplicationMessage::XLogData {
                    wal_start,
                    wal_end,
                    server_clock,
                    data,
                })
            }
            b'k' => {
                need(17, &data, "keepalive")?;
                let wal_end = Lsn(data.get_u64());
                let server_clock = data.get_i64();
                let reply_requested = data.get_u8() != 0;
                Ok(ReplicationMessage::Keepalive {
                    wal_end,
                    server_clock,
                    reply_requested,
                })
            }
            other => Err(format!("unknown replication message tag {other}")),
        }
    }
}

/// The body of a standby status update (`r`) reporting `lsn` as written, flushed and
/// applied, stamped with `now`.
pub fn standby_status_update(lsn: Lsn, now: SystemTime, reply_requested: bool) -> Bytes {
    let micros = now
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| d.checked_sub(std::time::Duration::from_secs(PG_EPOCH_UNIX_SECS)))
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let mut buf = BytesMut::with_capacity(34);
    buf.put_u8(b'r');
    buf.put_u64(lsn.0); // written
    buf.put_u64(lsn.0); // flushed
    buf.put_u64(lsn.0); // applied
    buf.put_i64(micros);
    buf.put_u8(u8::from(reply_requested));
    buf.freeze()
}

/// A session in CopyBoth mode after `START_REPLICATION`.
#[derive(Debug)]
pub struct ReplicationStream {
    pub(super) conn: ReplicationConnection,
    pub(super) slot: String,
    pub(super) publication: String,
}

impl ReplicationStream {
    /// The next XLogData or keepalive. Cancel-safe (bytes read stay buffered), so it can
    /// be raced against timers in `select!`.
    pub async fn recv(&mut self) -> Result<ReplicationMessage, ConnectorError> {
        loop {
            let message = match self.conn.read_backend().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse => {
                    return Err(self.conn.unexpected("second CopyBothResponse"))
                }
            };
            match message {
                Message::CopyData(body) => {
                    return ReplicationMessage::parse(body.into_bytes()).map_err(|e| {
                        ConnectorError::definite(format!(
                            "{}: protocol error on slot `{}`: {e}",
                            self.conn.context(),
                            self.slot
                        ))
                    })
                }
                Message::ErrorResponse(body) => {
                    return Err(server_error(
                        body.fields(),
                        &format!(
                            "replication from slot `{}` at {}",
                            self.slot, self.conn.endpoint
                        ),
                    ))
                }
                Message::CopyDone => {
                    return Err(ConnectorError::transient(format!(
                        "{}: the server ended replication from slot `{}`",
                        self.conn.context(),
                        self.slot
                    )))
                }
                Message::NoticeResponse(body) => {
                    // From PostgreSQL 18 on, pgoutput skips a publication that does not
                    // exist at a change's point in the WAL with a WARNING (55000, naming
                    // it) where older servers fail: the outbox rows would pass unseen, so
                    // it is the same definite error as there.
                    let notice = server_error(
                        body.fields(),
                        &format!(
                            "replication from slot `{}` at {}",
                            self.slot, self.conn.endpoint
                        ),
                    );
                    let named = format!("\"{}\"", self.publication);
                    if error_field(body.fields(), b'C').as_deref() == Some("55000")
                        && error_field(body.fields(), b'M').is_some_and(|m| m.contains(&named))
                    {
                        return Err(ConnectorError::definite(notice.message())
                            .with_reason(ErrorReason::MissingObject));
                    }
                }
                Message::ParameterStatus(_) => {}
                _ => return Err(self.conn.unexpected("message in CopyBoth mode")),
            }
        }
    }

    /// Sends a standby status update with write = flush = apply = `lsn`. Not
    /// cancel-safe: await it to completion.
    pub async fn send_status_update(
        &mut self,
        lsn: Lsn,
        reply_requested: bool,
    ) -> Result<(), ConnectorError> {
        let body = standby_status_update(lsn, SystemTime::now(), reply_requested);
        frontend::CopyData::new(body)
            .map_err(|e| self.conn.protocol_error("encoding a status update", e))?
            .write(&mut self.conn.wbuf);
        self.conn.flush().await
    }

    /// True when the session runs over TLS.
    pub fn is_tls(&self) -> bool {
        self.conn.tls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xlogdata_and_keepalive() {
        let mut w = BytesMut::new();
        w.put_u8(b'w');
        w.put_u64(0x16_0000_0010);
        w.put_u64(0x16_0000_0020);
        w.put_i64(42);
        w.put_slice(b"Bxyz");
        match ReplicationMessage::parse(w.freeze()).unwrap() {
            ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                server_clock,
                data,
            } => {
                assert_eq!(wal_start, Lsn(0x16_0000_0010));
                assert_eq!(wal_end, Lsn(0x16_0000_0020));
                assert_eq!(server_clock, 42);
                assert_eq!(&data[..], b"Bxyz");
            }
            other => panic!("{other:?}"),
        }
        let mut k = BytesMut::new();
        k.put_u8(b'k');
        k.put_u64(7);
        k.put_i64(8);
        k.put_u8(1);
        let k = k.freeze();
        assert_eq!(
            ReplicationMessage::parse(k.clone()).unwrap(),
            ReplicationMessage::Keepalive {
                wal_end: Lsn(7),
                server_clock: 8,
                reply_requested: true
            }
        );
        for len in 0..k.len() {
            assert!(ReplicationMessage::parse(k.slice(..len)).is_err());
        }
        assert!(ReplicationMessage::parse(Bytes::from_static(b"x")).is_err());
    }

    #[test]
    fn status_update_layout() {
        let now = UNIX_EPOCH + std::time::Duration::from_secs(PG_EPOCH_UNIX_SECS + 1);
        let b = standby_status_update(Lsn(0x0102_0304_0506_0708), now, false);
        assert_eq!(b.len(), 34);
        assert_eq!(b[0], b'r');
        for i in 0..3 {
            assert_eq!(&b[1 + 8 * i..9 + 8 * i], &[1, 2, 3, 4, 5, 6, 7, 8]);
        }
        assert_eq!(&b[25..33], &1_000_000i64.to_be_bytes());
        assert_eq!(b[33], 0);
    }
}
