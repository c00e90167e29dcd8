//! The streaming-replication wire protocol, spoken with `postgres-protocol`'s codecs over
//! tokio (tokio-postgres has no CopyBoth mode).
//!
//! [`ReplicationConnection::connect`] opens a `replication=database` session: TLS per
//! the config's TLS keys (the same verification as the SQL connections, `crate::tls`),
//! then trust, certificate, cleartext, MD5 (both only over a verified channel unless
//! `allow_insecure_password`) or SCRAM-SHA-256 authentication, with channel binding
//! (SCRAM-SHA-256-PLUS, tls-server-end-point) whenever TLS is on and the server offers it. On it,
//! [`ReplicationConnection::simple_query`] runs replication commands (`IDENTIFY_SYSTEM`,
//! `CREATE_REPLICATION_SLOT`, ...) and [`ReplicationConnection::start_logical_replication`]
//! switches to CopyBoth, giving a [`ReplicationStream`] of XLogData and keepalive messages
//! on which standby status updates are sent.

use std::io;

use std::sync::Arc;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use outboxd_connector::{ConnectorError, ErrorReason};
use outboxd_connector_kit::net::MaybeTls;
use outboxd_connector_kit::tls::{Negotiated, TlsUse};

use super::position::Lsn;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::backend::{ErrorFields, Header, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::pgoutput::PG_EPOCH_UNIX_SECS;
use crate::tls::{tls_server_end_point, PgTls};
use crate::PostgresConfig;

/// `CopyBothResponse`, which `postgres_protocol::message::backend::Message` does not parse.
const COPY_BOTH_RESPONSE_TAG: u8 = b'W';

/// The socket: plain TCP or TLS over TCP.
type PgStream = MaybeTls<SslStream<TcpStream>>;

/// A backend message, including the one `postgres-protocol` does not know.
pub(crate) enum Backend {
    Message(Message),
    CopyBothResponse,
}

/// The rows of a simple query, every value in text form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryResult {
    /// Column names of the last result set.
    pub columns: Vec<String>,
    /// Rows of the last result set; `None` is SQL NULL.
    pub rows: Vec<Vec<Option<String>>>,
}

impl QueryResult {
    /// The value of column `name` in row `row`, if both exist and it is not NULL.
    pub fn get(&self, row: usize, name: &str) -> Option<&str> {
        let col = self.columns.iter().position(|c| c == name)?;
        self.rows.get(row)?.get(col)?.as_deref()
    }
}

/// The answer to `IDENTIFY_SYSTEM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentifySystem {
    /// The cluster's system identifier.
    pub system_id: String,
    /// Current timeline.
    pub timeline: u32,
    /// Current WAL flush location.
    pub xlogpos: Lsn,
    /// The database connected to.
    pub dbname: Option<String>,
}

/// A `replication=database` session, before `START_REPLICATION`.
#[derive(Debug)]
pub struct ReplicationConnection {
    io: PgStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    endpoint: String,
    tls: bool,
    negotiated: Negotiated,
    /// tls-server-end-point of the server's certificate, when over TLS.
    channel_binding: Option<Vec<u8>>,
}

impl ReplicationConnection {
    /// Connects, negotiates TLS per `config.sslmode` and authenticates, all within
    /// `config.connect_timeout`.
    pub async fn connect(config: &PostgresConfig) -> Result<Self, ConnectorError> {
        let endpoint = format!("{}:{}/{}", config.host, config.port, config.database);
        match tokio::time::timeout(
            config.connect_timeout,
            Self::connect_inner(config, &endpoint),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ConnectorError::transient(format!(
                "replication connection to PostgreSQL at {endpoint}: timed out after {:?}",
                config.connect_timeout
            ))),
        }
    }

    async fn connect_inner(
        config: &PostgresConfig,
        endpoint: &str,
    ) -> Result<Self, ConnectorError> {
        let context = format!("replication connection to PostgreSQL at {endpoint}");
        let tcp = TcpStream::connect((config.host.as_str(), config.port))
            .await
            .map_err(|e| ConnectorError::transient(context.clone()).with_source(e))?;
        // Keepalive traffic is small and latency matters for status updates.
        let _ = tcp.set_nodelay(true);
        outboxd_connector_kit::net::detect_dead_peers(&tcp);
        let tls = PgTls::for_config(config)?;
        let (io, negotiated) = negotiate_tls(tcp, config, &tls, &context).await?;
        let channel_binding = match &io {
            PgStream::Tls(stream) => tls_server_end_point(stream.ssl()),
            PgStream::Plain(_) => None,
        };
        let mut conn = Self {
            io,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(1024),
            endpoint: endpoint.to_owned(),
            tls: negotiated != Negotiated::Plain,
            negotiated,
            channel_binding,
        };
        conn.startup(config, &tls).await?;
        tracing::debug!(
            endpoint,
            tls = conn.tls,
            "replication connection established"
        );
        Ok(conn)
    }

    /// True when the session runs over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// What the session's TLS negotiated and verified.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    async fn startup(
        &mut self,
        config: &PostgresConfig,
        tls: &Arc<PgTls>,
    ) -> Result<(), ConnectorError> {
        let params = [
            ("user", config.user.as_str()),
            ("database", config.database.as_str()),
            ("replication", "database"),
            ("application_name", "outboxd"),
            // pgoutput renders values with this session's settings: UTF-8 text,
            // timestamps as ISO 8601 in UTC, bytea in hex.
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("bytea_output", "hex"),
        ];
        frontend::startup_message(params.iter().copied(), &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding the startup message", e))?;
        self.flush().await?;

        let endpoint = self.endpoint.clone();
        let password = || {
            config
                .password
                .as_ref()
                .map(|p| p.expose().as_bytes())
                .ok_or_else(|| {
                    ConnectorError::definite(format!(
                    "PostgreSQL at {} asks a password for role `{}` and none is configured: set \
                     `source.password_file`, OUTBOXD_SOURCE_PASSWORD or `source.password`",
                    endpoint, config.user
                ))
                })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let message = match self.read_backend().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse => {
                    return Err(self.unexpected("CopyBothResponse during authentication"))
                }
            };
            match message {
                Message::AuthenticationOk => break,
                Message::AuthenticationCleartextPassword => {
                    if !tls.password_allowed(&self.negotiated) {
                        return Err(tls.password_refused(
                            &self.context(),
                            "in cleartext",
                            &self.negotiated,
                        ));
                    }
                    frontend::password_message(password()?, &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding the password", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    if !tls.password_allowed(&self.negotiated) {
                        return Err(tls.password_refused(
                            &self.context(),
                            "as an MD5 hash",
                            &self.negotiated,
                        ));
                    }
                    let hash = md5_hash(config.user.as_bytes(), password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding the password", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = Vec::new();
                    while let Some(m) = mechanisms
                        .next()
                        .map_err(|e| self.protocol_error("SASL mechanisms", e))?
                    {
                        offered.push(m.to_owned());
                    }
                    let has_plus = offered.iter().any(|m| m == SCRAM_SHA_256_PLUS);
                    let has_plain = offered.iter().any(|m| m == SCRAM_SHA_256);
                    // As libpq and tokio-postgres with channel_binding=prefer: bind to the
                    // server's certificate when both sides can ("p=tls-server-end-point"),
                    // so a man in the middle cannot relay the exchange; "y,," says we
                    // could but the server did not offer it (the server then fails the
                    // login if it did offer it and someone removed it); "n,,": no TLS.
                    let (binding, mechanism) = match (&self.channel_binding, has_plus, has_plain) {
                        (Some(hash), true, _) => (
                            ChannelBinding::tls_server_end_point(hash.clone()),
                            SCRAM_SHA_256_PLUS,
                        ),
                        (Some(_), false, true) => (ChannelBinding::unrequested(), SCRAM_SHA_256),
                        (None, _, true) => (ChannelBinding::unsupported(), SCRAM_SHA_256),
                        _ => {
                            return Err(ConnectorError::definite(format!(
                                "PostgreSQL at {} offers SASL mechanisms {offered:?}; outboxd \
                                 supports SCRAM-SHA-256 (and SCRAM-SHA-256-PLUS over TLS)",
                                self.endpoint
                            )))
                        }
                    };
                    let client = ScramSha256::new(password()?, binding);
                    frontend::sasl_initial_response(mechanism, client.message(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding SASLInitialResponse", e))?;
                    scram = Some(client);
                    self.flush().await?;
                }
                Message::AuthenticationSaslContinue(body) => {
                    let client = scram
                        .as_mut()
                        .ok_or_else(|| self.unexpected("SASLContinue before SASL started"))?;
                    client.update(body.data()).map_err(|e| self.auth_error(e))?;
                    frontend::sasl_response(client.message(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding SASLResponse", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let client = scram
                        .as_mut()
                        .ok_or_else(|| self.unexpected("SASLFinal before SASL started"))?;
                    client.finish(body.data()).map_err(|e| self.auth_error(e))?;
                }
                Message::ErrorResponse(body) => {
                    return Err(server_error(body.fields(), &self.context()))
                }
                Message::NoticeResponse(_) => {}
                _ => {
                    return Err(ConnectorError::definite(format!(
                        "PostgreSQL at {} asks for an authentication method outboxd does not \
                         support (supported: trust, password, md5, scram-sha-256)",
                        self.endpoint
                    )))
                }
            }
        }
        // After AuthenticationOk: ParameterStatus and BackendKeyData until ReadyForQuery.
        loop {
            match self.read_backend().await? {
                Backend::Message(Message::ReadyForQuery(_)) => return Ok(()),
                Backend::Message(Message::ErrorResponse(body)) => {
                    return Err(server_error(body.fields(), &self.context()))
                }
                Backend::Message(
                    Message::ParameterStatus(_)
                    | Message::BackendKeyData(_)
                    | Message::NoticeResponse(_),
                ) => {}
                _ => return Err(self.unexpected("message during startup")),
            }
        }
    }

    /// Runs `sql` with the simple query protocol and returns the rows of its last result
    /// set as text. A server error is classified by SQLSTATE.
    pub async fn simple_query(&mut self, sql: &str) -> Result<QueryResult, ConnectorError> {
        frontend::query(sql, &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding a query", e))?;
        self.flush().await?;
        let mut result = QueryResult::default();
        let mut error = None;
        loop {
            let message = match self.read_backend().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse => return Err(self.unexpected("CopyBothResponse")),
            };
            match message {
                Message::RowDescription(body) => {
                    result = QueryResult::default();
                    let mut fields = body.fields();
                    while let Some(f) = fields
                        .next()
                        .map_err(|e| self.protocol_error("RowDescription", e))?
                    {
                        result.columns.push(f.name().to_owned());
                    }
                }
                Message::DataRow(body) => {
                    let buf = body.buffer();
                    let mut ranges = body.ranges();
                    let mut row = Vec::with_capacity(result.columns.len());
                    while let Some(range) = ranges
                        .next()
                        .map_err(|e| self.protocol_error("DataRow", e))?
                    {
                        row.push(range.map(|r| {
                            String::from_utf8_lossy(buf.get(r).unwrap_or_default()).into_owned()
                        }));
                    }
                    result.rows.push(row);
                }
                Message::ErrorResponse(body) => {
                    error = Some(server_error(
                        body.fields(),
                        &format!("{} running `{sql}`", self.context()),
                    ));
                }
                Message::ReadyForQuery(_) => break,
                Message::CommandComplete(_)
                | Message::EmptyQueryResponse
                | Message::NoticeResponse(_)
                | Message::ParameterStatus(_) => {}
                _ => return Err(self.unexpected("message in a simple query")),
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<IdentifySystem, ConnectorError> {
        let r = self.simple_query("IDENTIFY_SYSTEM").await?;
        let bad = || self.unexpected("IDENTIFY_SYSTEM answer");
        Ok(IdentifySystem {
            system_id: r.get(0, "systemid").ok_or_else(bad)?.to_owned(),
            timeline: r
                .get(0, "timeline")
                .and_then(|t| t.parse().ok())
                .ok_or_else(bad)?,
            xlogpos: r
                .get(0, "xlogpos")
                .and_then(|t| t.parse().ok())
                .ok_or_else(bad)?,
            dbname: r.get(0, "dbname").map(str::to_owned),
        })
    }

    /// `START_REPLICATION SLOT <slot> LOGICAL <start> (proto_version '1',
    /// publication_names '<publication>')`. With `start` 0/0 the server resumes at the
    /// slot's `confirmed_flush_lsn`.
    ///
    /// Errors are classified by SQLSTATE: 55006 (slot active for another process) is
    /// transient, 42704 (no such slot) definite.
    pub async fn start_logical_replication(
        mut self,
        slot: &str,
        start: Lsn,
        publication: &str,
    ) -> Result<ReplicationStream, ConnectorError> {
        for (what, name) in [("slot", slot), ("publication", publication)] {
            // Written into the command unquoted, so hold them to the server's slot rule.
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(ConnectorError::definite(format!(
                    "{what} name `{name}` is invalid: use a-z, 0-9 and _"
                )));
            }
        }
        let sql = format!(
            "START_REPLICATION SLOT {slot} LOGICAL {start} \
             (proto_version '1', publication_names '{publication}')"
        );
        frontend::query(&sql, &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding START_REPLICATION", e))?;
        self.flush().await?;
        let mut error = None;
        loop {
            match self.read_backend().await? {
                Backend::CopyBothResponse => break,
                Backend::Message(Message::ErrorResponse(body)) => {
                    error = Some(server_error(
                        body.fields(),
                        &format!(
                            "starting replication from slot `{slot}` at {}",
                            self.endpoint
                        ),
                    ));
                }
                Backend::Message(Message::ReadyForQuery(_)) => {
                    return Err(error.unwrap_or_else(|| self.unexpected("end of START_REPLICATION")))
                }
                Backend::Message(Message::NoticeResponse(_) | Message::ParameterStatus(_)) => {}
                Backend::Message(_) => return Err(self.unexpected("START_REPLICATION answer")),
            }
        }
        tracing::debug!(slot, %start, publication, "logical replication started");
        Ok(ReplicationStream {
            conn: self,
            slot: slot.to_owned(),
            publication: publication.to_owned(),
        })
    }

    /// Reads one backend message. Cancel-safe: bytes read stay in `rbuf`.
    async fn read_backend(&mut self) -> Result<Backend, ConnectorError> {
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

    async fn flush(&mut self) -> Result<(), ConnectorError> {
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

    fn context(&self) -> String {
        format!("replication connection to PostgreSQL at {}", self.endpoint)
    }

    fn protocol_error(&self, what: &str, e: io::Error) -> ConnectorError {
        ConnectorError::definite(format!("{}: protocol error in {what}", self.context()))
            .with_source(e)
    }

    fn unexpected(&self, what: &str) -> ConnectorError {
        ConnectorError::definite(format!(
            "{}: unexpected {what} from the server",
            self.context()
        ))
    }

    fn auth_error(&self, e: io::Error) -> ConnectorError {
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

/// Sends SSLRequest and wraps the socket in TLS when the server agrees, per the TLS
/// policy; a server that refuses TLS when it is required is refused in turn.
async fn negotiate_tls(
    mut tcp: TcpStream,
    config: &PostgresConfig,
    tls: &PgTls,
    context: &str,
) -> Result<(PgStream, Negotiated), ConnectorError> {
    if tls.policy().tls == TlsUse::Off {
        return Ok((PgStream::Plain(tcp), Negotiated::Plain));
    }
    let io_err = |e: io::Error| ConnectorError::transient(context.to_owned()).with_source(e);
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf).await.map_err(io_err)?;
    let answer = tcp.read_u8().await.map_err(io_err)?;
    match answer {
        b'S' => {}
        b'N' if tls.policy().tls_required() => return Err(tls.policy().downgrade_refused(context)),
        b'N' => return Ok((PgStream::Plain(tcp), Negotiated::Plain)),
        other => {
            return Err(ConnectorError::definite(format!(
                "{context}: unexpected answer {other} to SSLRequest"
            )))
        }
    }
    let (stream, negotiated) = tls.handshake(tcp, &config.host, context).await?;
    Ok((PgStream::Tls(Box::new(stream)), negotiated))
}

/// An `ErrorResponse` as a [`ConnectorError`], classified by SQLSTATE like
/// `client::classify_pg_error`.
/// One field (`C` code, `M` message, …) of an ErrorResponse or NoticeResponse.
fn error_field(mut fields: ErrorFields<'_>, kind: u8) -> Option<String> {
    while let Ok(Some(field)) = fields.next() {
        if field.type_() == kind {
            return Some(String::from_utf8_lossy(field.value_bytes()).into_owned());
        }
    }
    None
}

fn server_error(fields: ErrorFields<'_>, context: &str) -> ConnectorError {
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
    conn: ReplicationConnection,
    slot: String,
    publication: String,
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
