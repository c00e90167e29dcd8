//! Backend messages off the socket: framing (with the one message `postgres-protocol`
//! does not parse, CopyBothResponse), the session's reads and writes, and the errors of a
//! session, a server's ErrorResponse classified by SQLSTATE among them. Shared by every
//! phase of the session; the framing is pure and bounds a message's declared length before
//! anything is allocated for it, since it reads what a (possibly hostile) server sends
//! (the fuzzers call [`next_backend`] directly).

use std::io;

use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use outboxd_connector::ConnectorError;
use postgres_protocol::message::backend::{ErrorFields, Header, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ReplicationConnection;

/// `CopyBothResponse`, which `postgres_protocol::message::backend::Message` does not parse.
const COPY_BOTH_RESPONSE_TAG: u8 = b'W';

/// A backend message, including the one `postgres-protocol` does not know.
pub(crate) enum Backend {
    Message(Message),
    CopyBothResponse,
}

impl ReplicationConnection {
    /// Reads one backend message. Cancel-safe: bytes read stay in `rbuf`.
    pub(super) async fn read_backend(&mut self) -> Result<Backend, ConnectorError> {
        loop {
            if let Some(backend) = next_backend(&mut self.rbuf)
                .map_err(|e| self.protocol_error("backend message", e))?
            {
                return Ok(backend);
            }
            let n = self.io.read_buf(&mut self.rbuf).await.map_err(|e| {
                ConnectorError::transient(format!("{}: read failed", self.context())).with_source(e)
            })?;
            if n == 0 {
                return Err(ConnectorError::transient(format!(
                    "{}: connection closed by the server",
                    self.context()
                )));
            }
        }
    }

    pub(super) async fn flush(&mut self) -> Result<(), ConnectorError> {
        let result = async {
            self.io.write_all(&self.wbuf).await?;
            self.io.flush().await
        }
        .await;
        self.wbuf.clear();
        result.map_err(|e| {
            ConnectorError::transient(format!("{}: write failed", self.context())).with_source(e)
        })
    }

    pub(super) fn context(&self) -> String {
        format!("replication connection to PostgreSQL at {}", self.endpoint)
    }

    pub(super) fn protocol_error(&self, what: &str, e: io::Error) -> ConnectorError {
        ConnectorError::definite(format!("{}: protocol error in {what}", self.context()))
            .with_source(e)
    }

    pub(super) fn unexpected(&self, what: &str) -> ConnectorError {
        ConnectorError::definite(format!(
            "{}: unexpected {what} from the server",
            self.context()
        ))
    }

    pub(super) fn auth_error(&self, e: io::Error) -> ConnectorError {
        ConnectorError::definite(format!(
            "{}: SCRAM-SHA-256 authentication failed",
            self.context()
        ))
        .with_source(e)
    }
}

/// The largest backend message accepted: PostgreSQL sends none larger than 1 GiB (its
/// `MaxAllocSize`), plus the CopyData/XLogData headers.
pub(crate) const MAX_BACKEND_MESSAGE: usize = (1 << 30) + 1024;

/// Takes the next complete backend message off the front of `rbuf`; `None` until it is
/// all there. Pure; never panics. The length field is checked before anything is done
/// with it, and nothing is reserved for it: the buffer grows only as bytes arrive, so a
/// hostile length cannot make outboxd allocate what the peer never sends
/// (`postgres_protocol`'s `Message::parse` reserves the declared length, so it is called
/// only once the whole message is buffered).
pub(crate) fn next_backend(rbuf: &mut BytesMut) -> io::Result<Option<Backend>> {
    let Some(header) = Header::parse(rbuf)? else {
        return Ok(None);
    };
    let len = usize::try_from(header.len()).unwrap_or(usize::MAX);
    if !(4..=MAX_BACKEND_MESSAGE).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "backend message `{}` declares {len} bytes (at most {MAX_BACKEND_MESSAGE})",
                char::from(header.tag()).escape_default()
            ),
        ));
    }
    let total = len + 1;
    if rbuf.len() < total {
        return Ok(None);
    }
    if header.tag() == COPY_BOTH_RESPONSE_TAG {
        // Format and per-column formats: nothing to use for pgoutput.
        rbuf.advance(total);
        return Ok(Some(Backend::CopyBothResponse));
    }
    Ok(Message::parse(rbuf)?.map(Backend::Message))
}

/// One field (`C` code, `M` message, …) of an ErrorResponse or NoticeResponse.
pub(super) fn error_field(mut fields: ErrorFields<'_>, kind: u8) -> Option<String> {
    while let Ok(Some(field)) = fields.next() {
        if field.type_() == kind {
            return Some(String::from_utf8_lossy(field.value_bytes()).into_owned());
        }
    }
    None
}

/// An `ErrorResponse` as a [`ConnectorError`], classified by SQLSTATE like
/// `client::classify_pg_error`.
pub(super) fn server_error(fields: ErrorFields<'_>, context: &str) -> ConnectorError {
    let (mut code, mut message, mut detail, mut hint) = (String::new(), String::new(), None, None);
    let mut fields = fields;
    while let Ok(Some(field)) = fields.next() {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'C' => code = value,
            b'M' => message = value,
            b'D' => detail = Some(value),
            b'H' => hint = Some(value),
            _ => {}
        }
    }
    let reason = crate::client::sqlstate_reason(&code, &message);
    let mut text = format!("{context}: {message} (SQLSTATE {code})");
    if let Some(detail) = detail {
        text.push_str(&format!("; {detail}"));
    }
    if let Some(hint) = hint {
        text.push_str(&format!("; hint: {hint}"));
    }
    let error = if is_transient_sqlstate(&code) {
        ConnectorError::transient(text)
    } else {
        ConnectorError::definite(text)
    };
    error.with_reason(reason)
}

/// 08: connection exception, 40: transaction rollback, 53: insufficient resources,
/// 57P: shutdown / cannot connect now, 55006: object in use (the slot is active for
/// another reader). Everything else (auth, missing objects, privileges) is definite.
pub(crate) fn is_transient_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("40")
        || code.starts_with("53")
        || code.starts_with("57P")
        || code == "55006"
        || code.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_length_is_refused_before_any_allocation() {
        // A CopyData header declaring 4 GiB: `Message::parse` alone would reserve it
        // before a byte of the body arrived.
        let mut rbuf = BytesMut::from(&[b'd', 0xff, 0xff, 0xff, 0xff, b'w'][..]);
        assert!(next_backend(&mut rbuf).is_err());
        assert!(rbuf.capacity() < 64, "reserved {}", rbuf.capacity());
        // Within the bound but not yet received: wait for the bytes, reserve nothing.
        let mut rbuf = BytesMut::from(&[b'd', 0x10, 0, 0, 0, b'w'][..]);
        assert!(next_backend(&mut rbuf).unwrap().is_none());
        assert!(rbuf.capacity() < 64, "reserved {}", rbuf.capacity());
        // A length below its own four bytes.
        assert!(next_backend(&mut BytesMut::from(&[b'd', 0, 0, 0, 3][..])).is_err());
        // Complete messages come out one by one, the rest stays buffered.
        let mut rbuf = BytesMut::from(&[b'W', 0, 0, 0, 4, b'c', 0, 0, 0, 4, b'd'][..]);
        assert!(matches!(
            next_backend(&mut rbuf).unwrap(),
            Some(Backend::CopyBothResponse)
        ));
        assert!(matches!(
            next_backend(&mut rbuf).unwrap(),
            Some(Backend::Message(Message::CopyDone))
        ));
        assert!(next_backend(&mut rbuf).unwrap().is_none());
        assert_eq!(&rbuf[..], b"d");
    }

    #[test]
    fn sqlstate_classes() {
        for code in ["08006", "40001", "53300", "57P01", "57P03", "55006"] {
            assert!(is_transient_sqlstate(code), "{code}");
        }
        for code in ["28P01", "42704", "3D000", "42501"] {
            assert!(!is_transient_sqlstate(code), "{code}");
        }
    }
}
