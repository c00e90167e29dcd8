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
                // The server ends the stream. A walsender in a fast or smart shutdown
                // (`WalSndDone`, walsender.c), once the client has confirmed all it was
                // sent, sends CommandComplete `COPY 0` while still in CopyBoth mode, with
                // no CopyDone before it, and exits: no ReadyForQuery follows, the socket
                // closes. CopyDone (then CommandComplete, ReadyForQuery) is the orderly
                // end a walsender uses otherwise. Either way the server is done with
                // this session, not broken: transient, the relay reconnects once the
                // server is back. Nothing is answered (no CopyDone of ours): the
                // connection is dropped with the error, which ends the walsender too.
                Message::CopyDone => return Err(self.ended("CopyDone")),
                Message::CommandComplete(body) => {
                    let tag = body.tag().unwrap_or("?").to_owned();
                    return Err(self.ended(&format!(
                        "CommandComplete `{tag}`, as a walsender does at a server shutdown"
                    )));
                }
                Message::ReadyForQuery(_) => return Err(self.ended("ReadyForQuery")),
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

    /// The server ended the stream with `how` (see [`Self::recv`]): transient.
    fn ended(&self, how: &str) -> ConnectorError {
        ConnectorError::transient(format!(
            "{}: the server ended replication from slot `{}` ({how}); reconnecting",
            self.conn.context(),
            self.slot
        ))
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

    /// One backend message: tag, length (itself included), body.
    fn backend(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(u32::try_from(body.len()).unwrap() + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A [`ReplicationStream`] in CopyBoth mode whose server sends `bytes` and closes the
    /// connection (a loopback socket: the reader reads a real stream).
    async fn stream_from(bytes: Vec<u8>) -> ReplicationStream {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.write_all(&bytes).await.unwrap();
            // What a walsender does after its last message: proc_exit, the socket closes.
            let _ = socket.shutdown().await;
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        ReplicationStream {
            conn: ReplicationConnection {
                io: super::super::PgStream::Plain(tcp),
                rbuf: BytesMut::new(),
                wbuf: BytesMut::new(),
                endpoint: "test:5432/db".to_owned(),
                tls: false,
                negotiated: outboxd_connector_kit::tls::Negotiated::Plain,
                channel_binding: None,
            },
            slot: "outboxd_test".to_owned(),
            publication: "outboxd_test".to_owned(),
        }
    }

    /// A walsender in a fast (or smart) shutdown (`WalSndDone` in walsender.c): it asks
    /// for a reply (a keepalive with the reply flag) until the client has confirmed all it
    /// was sent, then ends the stream with CommandComplete `COPY 0`, without CopyDone and
    /// without ReadyForQuery, and exits. That is the server ending the stream, which the
    /// relay reconnects after (transient), not a protocol violation.
    #[tokio::test]
    async fn a_server_shutdown_ends_the_stream_with_a_transient_error() {
        let mut keepalive = vec![b'k'];
        keepalive.extend_from_slice(&0x16_0000_0060u64.to_be_bytes());
        keepalive.extend_from_slice(&42i64.to_be_bytes());
        keepalive.push(1);
        let mut bytes = backend(b'd', &keepalive);
        bytes.extend(backend(b'C', b"COPY 0\0"));
        let mut stream = stream_from(bytes).await;
        assert_eq!(
            stream.recv().await.unwrap(),
            ReplicationMessage::Keepalive {
                wal_end: Lsn(0x16_0000_0060),
                server_clock: 42,
                reply_requested: true
            }
        );
        let error = stream.recv().await.expect_err("the stream ended");
        assert!(error.is_transient(), "{error}");
        assert!(error.message().contains("ended"), "{error}");

        // The other ways a server ends it: CopyDone (then CommandComplete and
        // ReadyForQuery once the client answers), and a FATAL ErrorResponse
        // (57P01: terminated by the administrator, a fast shutdown's backends).
        let mut bytes = backend(b'c', b"");
        bytes.extend(backend(b'C', b"COPY 0\0"));
        bytes.extend(backend(b'Z', b"I"));
        let error = stream_from(bytes).await.recv().await.expect_err("CopyDone");
        assert!(error.is_transient(), "{error}");
        let fatal =
            b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0";
        let error = stream_from(backend(b'E', fatal))
            .await
            .recv()
            .await
            .expect_err("FATAL");
        assert!(error.is_transient(), "{error}");
        assert!(error.message().contains("57P01"), "{error}");
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
